"""Print every import cycle inside ``openrelay/``: between packages, and between files.

Reads each module's imports with ``ast`` (relative imports resolved, imports under ``if TYPE_CHECKING:`` too,
since they still tie the files together), builds the graph of files and the graph of packages (a file's package is
its first directory below ``openrelay/``; a top-level module is its own package), and prints each strongly
connected component with more than one member, or a member importing itself. Exit status 1 when there is one.

    python scripts/import_cycles.py [path/to/openrelay]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

__all__ = ["module_imports", "cycles", "main"]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` and the modules of the same package it imports."""
    paths = {_module_name(root, path): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                # ``from . import x`` names a module when x is one, else a name in the package
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # ``openrelay.a.b.name``: the module that holds it
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a cycle (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "openrelay"
    files = module_imports(root)
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in files.items():
        packages[_package(module)] |= {_package(t) for t in targets} - {_package(module)}
    failed = False
    for kind, graph in (("packages", dict(packages)), ("files", files)):
        for component in cycles(graph):
            failed = True
            print(f"cycle between {kind}: " + " <-> ".join(component))
            for member in component:
                inside = sorted(set(graph[member]) & set(component))
                print(f"  {member} imports {', '.join(inside)}")
    if not failed:
        print(f"no cycle among {len(files)} files in {len(packages)} packages")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
