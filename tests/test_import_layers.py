"""Imports run one way, down, and no module imports itself back through others.

Layers (the layout table of docs/design/README.md): the foundation ``kvpool`` (wire format, P4 contract,
P4Runtime codec, topology, HTTP/JSON and config helpers) <- the three roles
``switchmodel``, ``hostagent``, ``controller`` (which never import one another) <- the
Mininet experiments in ``bmv2_topologies`` <- the umbrella CLI ``kvpool.cli``, scripts and
tests. Every import counts, the ones inside functions too: a lazy import that closes a
cycle is still a cycle, only a hidden one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the checkout (tests/ is one level down)
PACKAGES = ("kvpool", "switchmodel", "hostagent", "controller", "bmv2_topologies")
LAYER = {"kvpool": 0, "switchmodel": 1, "hostagent": 1, "controller": 1, "bmv2_topologies": 2}
#: Modules above every package: they may import anything (and nothing imports them).
TOP = {"kvpool.cli"}


def _modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package by its __init__)."""
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name lands in (its longest known prefix)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported project module, line) for every import statement anywhere in ``module``."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _resolve(alias.name)) is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                # ``from pkg import mod`` imports the submodule when there is one.
                target = _resolve(f"{stem}.{alias.name}") or _resolve(stem)
                if target is not None:
                    yield target, node.lineno


GRAPH = {m: sorted({t for t, _ in _imports(m) if t != m}) for m in MODULES}


def _top(module: str) -> str:
    return module.split(".")[0]


def test_the_walk_sees_the_project() -> None:
    """The walker finds the packages and their known edges (so an empty graph cannot pass)."""
    assert {"kvpool.wire", "hostagent.transport", "controller.daemon", "switchmodel.cli"} <= MODULES.keys()
    assert "kvpool.wire" in GRAPH["hostagent.transfer"]


def test_imports_only_run_down() -> None:
    """No module imports a package above its layer or a sibling role."""
    upward: list[str] = []
    for module in MODULES:
        if module in TOP:
            continue
        for target, line in sorted(set(_imports(module))):
            if target in TOP:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports the CLI {target}")
                continue
            src, dst = _top(module), _top(target)
            if src != dst and LAYER[dst] >= LAYER[src]:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports {target}")
    assert not upward, "imports that do not run down:\n" + "\n".join(upward)


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
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
                    work.append((nxt, iter(graph[nxt])))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    """Inside each package (and so across them, given the layers) imports form no cycle."""
    sub = {m: [t for t in GRAPH[m] if _top(t) == package] for m in MODULES if _top(m) == package}
    assert not _cycles(sub), f"import cycles in {package}: {_cycles(sub)}"
