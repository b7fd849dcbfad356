"""The package's import layers: no import cycle, and no arrow that runs up the layers.

Every import is counted, at module level and inside functions (a function-local import is still an arrow; it only
hides a cycle until the function runs). Imports under ``if TYPE_CHECKING:`` are not: they never run. From top to
bottom: commands → render/export → analysis (report → findings → cross → graph → summarize → align → rank → load →
types) → events/storage. The straggler rule (cross) reads each rank's own work from the step graph, so graph sits
below cross. Capture and analysis never import each other (analysis never imports torch).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "distprof"

#: (layer, module prefixes), top to bottom: a module may import its own layer (no cycle) and any layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("distprof", "distprof.__main__", "distprof.cli", "distprof.launch", "distprof.commands")),
    ("render/export", ("distprof.render", "distprof.export")),
    ("importers", ("distprof.importers",)),
    ("analysis facade", ("distprof.analysis",)),
    ("analysis.report", ("distprof.analysis.report",)),
    ("analysis.findings", ("distprof.analysis.findings",)),
    ("analysis.cross", ("distprof.analysis.cross",)),
    ("analysis.graph", ("distprof.analysis.graph",)),
    ("analysis.summarize", ("distprof.analysis.summarize",)),
    ("analysis.align", ("distprof.analysis.align",)),
    ("analysis.rank", ("distprof.analysis.rank",)),
    ("analysis.load", ("distprof.analysis.load",)),
    ("analysis.types", ("distprof.analysis.types", "distprof.analysis.names", "distprof.analysis.groupstats",
                        "distprof.analysis.narrow")),
    ("capture", ("distprof.capture",)),
    ("drift", ("distprof.drift",)),
    ("events", ("distprof.events",)),
    ("storage", ("distprof.storage", "distprof.atomic")),
    ("util", ("distprof.errors", "distprof.config", "distprof.runid", "distprof.progress", "distprof.parallel",
              "distprof._version", "distprof.record")),
]
#: Pairs of layers that never import each other, whatever their order.
APART = [("distprof.analysis", "distprof.capture")]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for child in node.body:
                out.update(range(child.lineno, child.end_lineno + 1))
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The distprof modules `name` imports anywhere in its body (``from pkg import submodule`` names the submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("distprof"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("distprof"):
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out.update(subs or {target})
    out.discard(name)
    return out


def layer_of(name: str) -> int:
    """Index in LAYERS of the most specific prefix that holds `name`."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle(graph):
    assert _cycles(graph) == []


def test_no_arrow_runs_up_the_layers(graph):
    bad = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
           for m, targets in sorted(graph.items()) for t in sorted(targets)
           if t in graph and layer_of(t) < layer_of(m)]
    assert bad == []


def test_capture_and_analysis_stay_apart(graph):
    def under(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    bad = [f"{m} imports {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
           for a, b in APART if (under(m, a) and under(t, b)) or (under(m, b) and under(t, a))]
    assert bad == []


def test_types_depend_on_nothing_in_analysis(graph):
    for leaf in ("distprof.analysis.types", "distprof.analysis.names", "distprof.analysis.groupstats",
                 "distprof.analysis.narrow"):
        assert {t for t in graph[leaf] if t.startswith("distprof.analysis")} == set(), leaf


def test_the_scan_sees_function_local_imports_and_cycles(tmp_path):
    """The checker itself: a function-local import is an arrow, TYPE_CHECKING ones are not, cycles are found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
                     "def f():\n    from .c import y\n    from . import d\n")
    got = imports_of("distprof.analysis.probe", probe, {"distprof.analysis.d"})
    assert got == {"distprof.analysis.c", "distprof.analysis.d"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
