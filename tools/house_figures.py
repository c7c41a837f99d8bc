"""The structure figures of docs/architecture.md, read from the code's imports and definitions.

    python tools/house_figures.py

Prints: farm's modules and lines; its import graph by package (each package under farm/ one node, each
module directly under farm/ one node): nodes, arrows, floors (a node stands one floor above the highest
it imports), circles (nodes that import each other in a loop); the imports made inside functions; the
largest functions; the README's length. Nothing is imported or run.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def node_of(module: str) -> str:
    """farm.planning.tiling → farm/planning/; farm.cli → farm/cli.py; farm → farm/__init__.py."""
    parts = module.split(".")
    if len(parts) == 1:
        return "farm/__init__.py"
    if (ROOT / "farm" / parts[1]).is_dir():
        return f"farm/{parts[1]}/"
    return f"farm/{parts[1]}.py"


def imports(tree: ast.AST, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported farm module, made inside a function) for each farm module an import statement names."""
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names if a.name.split(".")[0] == "farm")
            elif isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "farm":
                names = {f"{child.module}.{alias.name}" for alias in child.names}
                found.extend((n if n in modules else str(child.module), inside) for n in sorted(names))
            visit(child, nested)

    visit(tree, False)
    return found


def floors(arrows: dict[str, set[str]], nodes: set[str]) -> dict[str, int]:
    floor: dict[str, int] = {}

    def height(node: str, path: tuple[str, ...]) -> int:
        if node not in floor:
            below = [height(n, (*path, node)) for n in arrows[node] if n not in path]
            floor[node] = 1 + max(below, default=0)
        return floor[node]

    for node in nodes:
        height(node, ())
    return floor


def circles(arrows: dict[str, set[str]], nodes: set[str]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in arrows[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(nodes):
        if node not in index:
            connect(node)
    return groups


def main() -> int:
    sys.setrecursionlimit(10_000)
    files = sorted((ROOT / "farm").rglob("*.py"))
    trees = {module_name(p): ast.parse(p.read_text()) for p in files}
    lines = sum(len(p.read_text().splitlines()) for p in files)
    arrows: dict[str, set[str]] = defaultdict(set)
    module_arrows = set()
    inside = total = 0
    for module, tree in trees.items():
        for target, in_function in imports(tree, set(trees)):
            if target == module or target not in trees:
                continue
            total += 1
            inside += in_function
            module_arrows.add((module, target))
            if node_of(module) != node_of(target):
                arrows[node_of(module)].add(node_of(target))
    nodes = {node_of(m) for m in trees}
    floor = floors(arrows, nodes)
    print(f"modules under farm/: {len(trees)} ({lines} lines); imports of farm modules: {total}, "
          f"{inside} of them inside functions; module arrows: {len(module_arrows)}")  # fmt: skip
    print(f"by package: {len(nodes)} nodes, {sum(len(v) for v in arrows.values())} arrows, "
          f"{max(floor.values())} floors, circles: {circles(arrows, nodes) or 'none'}")  # fmt: skip
    for node in sorted(nodes, key=lambda n: (-floor[n], n)):
        print(f"  floor {floor[node]:2d}  {node:28s} imports {', '.join(sorted(arrows[node])) or '-'}")
    sizes = []
    for module, tree in trees.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                sizes.append((fn.end_lineno - fn.lineno + 1, f"{module}.{fn.name}"))  # type: ignore[operator]
    print("largest functions:", ", ".join(f"{name} {n}" for n, name in sorted(sizes, reverse=True)[:3]))
    print(f"README.md: {len((ROOT / 'README.md').read_text().splitlines())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
