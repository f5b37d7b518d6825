"""The package layout's rules (issue 31): imports run one way, and forest/'s top level stays small.

The import graph is read from the source with ``ast``, every ``import`` statement
counted wherever it stands: an import inside a function is still an import, so a
circle broken only by moving an import into a function body is still a circle
(DESIGN.md, "Layout rules").
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("native", "histogram", "forest")
#: Modules forest/ may keep at its top level: what belongs to all of it.
FOREST_TOP_LEVEL = {"__init__.py", "_validation.py", "collective_checks.py", "profiling.py", "simulate.py"}


def modules(root=ROOT, packages=PACKAGES):
    """``{dotted module name: path}`` of every module of ``packages`` (a package is its ``__init__``)."""
    out = {}
    for package in packages:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    out[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return out


def _targets(module, is_package, node, known):
    """Modules of ``known`` an import statement of ``module`` loads (the deepest one each name names)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix for alias in node.names]
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def import_graph(root=ROOT, packages=PACKAGES):
    """``{module: set of modules it imports}`` over ``packages`` (function-level imports included)."""
    known = modules(root, packages)
    graph = {}
    for module, path in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(module, path.endswith("__init__.py"), node, known))
        graph[module] = deps
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (each a sorted list)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        # iterative Tarjan: the graph's depth would exceed Python's recursion limit one day
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"} - {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_and_relative_imports_are_edges(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")
    graph = import_graph(str(tmp_path), ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_cycles_in_forest_histogram_native():
    found = cycles(import_graph())
    assert found == [], "import cycles (each a strongly connected set of modules): " + "; ".join(
        " <-> ".join(c) for c in found)


@pytest.mark.parametrize("lower, upper", [("native", "histogram"), ("native", "forest"), ("histogram", "forest")])
def test_imports_run_one_way_between_packages(lower, upper):
    graph = import_graph()
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.split(".")[0] == lower
                   for d in deps if d.split(".")[0] == upper)
    assert wrong == []


def test_only_native_comm_imports_mpi4py():
    offenders = []
    for module, path in modules().items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "mpi4py" for n in names) and module != "native.comm":
                offenders.append(module)
    assert offenders == []


def test_forest_top_level_keeps_few_modules():
    top = {name for name in os.listdir(os.path.join(ROOT, "forest")) if name.endswith(".py")}
    assert top <= FOREST_TOP_LEVEL and len(top - {"__init__.py"}) <= 8, sorted(top - FOREST_TOP_LEVEL)
