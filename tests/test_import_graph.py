"""No import circle anywhere in the package (issue 27).

The graph is read from the source with `ast`, not from a running interpreter: every `import torchtitan...` and
`from torchtitan... import ...` (or relative import) counts, at module level, inside a function and under
`if TYPE_CHECKING:` alike. A function-level import that only dodges a circle is still a circle: the two modules
still need each other, the import order just hides it. Edges go to the module named; `from pkg import name`
goes to `pkg.name` when that is a module, else to the package `pkg` (its `__init__.py`). The implicit import of
a parent package (loading `torchtitan.parallel.dims` runs `torchtitan/parallel/__init__.py` first) counts for
importers outside that package, not for its own modules: a package that re-exports its submodules would
otherwise close a circle with each of them, which Python resolves (the package is already loading).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "torchtitan"


def module_files(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package (a package is named by its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that the module `name` (file `path`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    top = name.split(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `.x` from a.b.c (module) or from a.b (package __init__) is a.b.x
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [
                f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != top:
                continue
            while target not in modules and "." in target:  # `import a.b.c` where c is a name: the module a.b
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                found.add(target)
            # Loading a.b.c from outside package a.b first runs a/b/__init__.py: an edge to that package too.
            # (From inside it the package is already loading, as when its __init__ imports its own submodules.)
            parent = target.rsplit(".", 1)[0]
            while (
                "." in parent and not (name == parent or name.startswith(parent + ".")) and parent in modules
            ):
                found.add(parent)
                parent = parent.rsplit(".", 1)[0]
    return found


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """For each strongly connected component of more than one module (Tarjan): one shortest circle through it,
    and all the component's modules (every one of them is on some circle with the others)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of modules (~100)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:
        start = min(component)
        # breadth-first from start back to start inside the component: the shortest circle through it
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            nxt = sorted(graph[path[-1]] & component)
            if start in nxt:
                cycles.append((path + [start], sorted(component)))
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append(path + [w])
    return sorted(cycles)


def test_cycle_finder_finds_a_circle_and_its_absence(tmp_path):
    """The check itself: a two-module circle through a function-level import is found, a chain is not."""
    pkg = tmp_path / "torchtitan"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "a.py").write_text("from torchtitan.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from torchtitan.a import f\n")
    (pkg / "c.py").write_text("import torchtitan.a\n")
    graph = import_graph(pkg)
    assert graph["torchtitan.a"] == {"torchtitan.sub.b", "torchtitan.sub"}  # sub/__init__.py runs first
    assert graph["torchtitan.sub"] == {"torchtitan.sub.b"}
    assert find_cycles(graph) == [
        (
            ["torchtitan.a", "torchtitan.sub.b", "torchtitan.a"],
            ["torchtitan.a", "torchtitan.sub", "torchtitan.sub.b"],
        )
    ]
    (pkg / "sub" / "b.py").write_text("def g():\n    pass\n")
    assert find_cycles(import_graph(pkg)) == []


def test_package_has_no_import_circle():
    graph = import_graph()
    assert "torchtitan.train" in graph and graph["torchtitan.train"], "the graph reader found no imports"
    cycles = find_cycles(graph)
    assert not cycles, "import circles in the package:\n" + "\n".join(
        f"{' -> '.join(cycle)}  (modules on circles together: {', '.join(members)})"
        for cycle, members in cycles
    )
