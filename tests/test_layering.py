"""The package's layering, enforced: every import of every module under mfcli/ (imports inside
functions and under TYPE_CHECKING included) points to the same or a lower layer of the table in
docs/architecture.md ("Layer table"), and the import graph has no cycle (issue 23, item 3).

Edges that break the rule today are listed in ALLOWED_UPWARD with the reason; the list may only
shrink: a new upward edge or a new cycle fails here."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mfcli"

# (importer, imported) pairs that point upward today, each one a known seam (see
# docs/architecture.md, "Known upward imports"). Remove an entry when its edge is cut.
ALLOWED_UPWARD: frozenset[tuple[str, str]] = frozenset()


# Same-layer edges that close a cycle; empty since the last two (services.account ->
# services.records / services.cost) were cut, and to stay so.
ALLOWED_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports() -> set[tuple[str, str]]:
    """Every (importer, imported module) pair, wherever the import statement sits."""
    mods = modules()
    edges: set[tuple[str, str]] = set()
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target.startswith("mfcli") and target != name:
                    edges.add((name, target))
    # importlib.import_module("mfcli....") strings (the lazy export tables) count too; a file's
    # format tag (``FORMAT = "mfcli.factorization"``, ``RECORD_FORMAT = "mfcli.accounting"``) is
    # data written into files, not a module, even where it spells one.
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tags = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and re.fullmatch(r"(\w+_)?FORMAT", t.id) for t in node.targets)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in tags
                    and re.fullmatch(r"mfcli(?:\.\w+)+", node.value)):
                if node.value in mods and node.value != name:
                    edges.add((name, node.value))
    return edges


def layer_table() -> dict[str, int]:
    """Module -> layer index from the table under "## Layer table" in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layer table", 1)[1].split("\n## ", 1)[0]
    table: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for entry in re.findall(r"`([\w.]+)`", cells[1]):
                table[entry] = int(cells[0])
    return table


def layer_of(module: str, table: dict[str, int]) -> int:
    probe = module
    while probe:
        if probe in table:
            return table[probe]
        probe = probe.rpartition(".")[0]
    raise KeyError(module)


def test_every_module_has_a_layer() -> None:
    table = layer_table()
    missing = []
    for m in modules():
        try:
            layer_of(m, table)
        except KeyError:
            missing.append(m)
    assert not missing, f"modules missing from docs/architecture.md's layer table: {sorted(missing)}"


def test_no_upward_imports() -> None:
    table = layer_table()
    upward = {(a, b) for a, b in imports() if layer_of(b, table) > layer_of(a, table)}
    new = sorted(upward - ALLOWED_UPWARD)
    assert not new, f"upward imports (importer -> imported): {new}"
    stale = sorted(ALLOWED_UPWARD - upward)
    assert not stale, f"allow-listed edges that no longer exist (remove them): {stale}"


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_outside_the_allow_list() -> None:
    """Without the allow-listed edges the graph is acyclic; any other cycle is new."""
    edges = imports()
    assert _cycles(edges - ALLOWED_UPWARD - ALLOWED_CYCLE_EDGES) == []
    stale = sorted(ALLOWED_CYCLE_EDGES - edges)
    assert not stale, f"allow-listed edges that no longer exist (remove them): {stale}"


def test_the_checker_sees_function_level_imports() -> None:
    """The edge reader is not blind to an import inside a function (how every cycle got in), nor
    to a relative import or an importlib string; the cycle finder finds a two-module cycle."""
    edges = imports()
    # the artifact reader imports the structured kinds only inside its functions
    assert ("mfcli.io.artifact", "mfcli.strategies.structured") in edges
    # the package index names its public modules in importlib strings, and so do the CLI's checks
    assert ("mfcli", "mfcli.optimize.dense") in edges
    assert ("mfcli.cli.account", "mfcli.util.validation") in edges
    # a file's format tag that spells a module ("mfcli.accounting") is data, not an import
    assert ("mfcli.model.record_format", "mfcli.accounting") not in edges
    assert _cycles({("a", "b"), ("b", "a")}) == [["a", "b"]]
    assert _cycles({("a", "b"), ("b", "c")}) == []
