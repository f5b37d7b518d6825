"""Split criteria: the compiled-criterion interface and one module per criterion."""
