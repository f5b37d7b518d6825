"""Policy learning: exact policy trees, budgeted allocation, simulated policy designs."""
