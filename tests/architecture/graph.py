"""The project's import graph as the code states it (parsed, nothing imported): which project
modules each module imports at its top and inside functions, and which private names cross a
module boundary. ``tests/architecture/test_layers.py`` holds the figures to their limits;
``python -m tests.architecture.graph`` prints them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("device_agent", "tasks", "flows")


@dataclass(frozen=True)
class Import:
    """One import of a project module: where it stands and what it takes."""

    importer: str
    imported: str
    line: int
    in_function: bool
    names: tuple[str, ...] = ()
    comment: str = ""


@dataclass
class Graph:
    """Every project import of ``PACKAGES``."""

    modules: set[str] = field(default_factory=set)
    imports: list[Import] = field(default_factory=list)

    def top_level(self) -> dict[str, set[str]]:
        """importer -> the project modules it imports at module level (what runs at import time)."""
        edges: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if not imp.in_function and imp.imported != imp.importer:
                edges[imp.importer].add(imp.imported)
        return edges

    def cycles(self) -> list[list[str]]:
        """The strongly connected components (more than one module) of the top-level graph."""
        return [sorted(c) for c in components(self.top_level()) if len(c) > 1]

    def in_function(self) -> list[Import]:
        """Project imports inside functions (each hides an edge from the top of the file)."""
        return [imp for imp in self.imports if imp.in_function]

    def private_names(self) -> list[Import]:
        """Imports of a name starting with ``_`` from another project module."""
        return [
            imp
            for imp in self.imports
            if any(n.startswith("_") and not n.startswith("__") for n in imp.names)
        ]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: set[str]) -> str | None:
    """The project module ``name`` is (or is inside: ``pkg.mod.func`` -> ``pkg.mod``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def build(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Parse every module of ``packages`` under ``root``."""
    files = [
        p for pkg in packages for p in sorted((root / pkg).rglob("*.py")) if "__pycache__" not in p.parts
    ]
    graph = Graph(modules={module_name(p) for p in files})
    for path in files:
        importer = module_name(path)
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        for node, in_fn in _walk(tree, False):
            comment = lines[node.lineno - 1].partition("#")[2].strip()
            if isinstance(node, ast.Import):
                for alias in node.names:
                    owner = _owner(alias.name, graph.modules)
                    if owner:
                        graph.imports.append(Import(importer, owner, node.lineno, in_fn, (), comment))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(importer, path.name == "__init__.py", node)
                for alias in node.names:
                    owner = _owner(f"{base}.{alias.name}", graph.modules) or _owner(base, graph.modules)
                    if owner:
                        names = () if owner == f"{base}.{alias.name}" else (alias.name,)
                        graph.imports.append(Import(importer, owner, node.lineno, in_fn, names, comment))
    return graph


def _walk(node: ast.AST, in_fn: bool):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_fn
        inner = in_fn or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner)


def components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    graph = build()
    print(f"modules: {len(graph.modules)}; project imports: {len(graph.imports)}")
    print(f"module-level cycles: {len(graph.cycles())}")
    for cycle in graph.cycles():
        print("  " + " <-> ".join(cycle))
    fn = graph.in_function()
    print(f"project imports inside functions: {len(fn)}")
    private = graph.private_names()
    print(f"imports of another module's private name: {len(private)}")
    for imp in private:
        print(f"  {imp.importer}:{imp.line} {imp.imported} {imp.names}")


if __name__ == "__main__":
    import sys

    sys.setrecursionlimit(10000)
    main()
