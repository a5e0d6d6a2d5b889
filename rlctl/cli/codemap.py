"""The code map: rlctl's subpackages in layers, and the import graph read from the source (no module is imported).

A module may import its own package and the packages of lower layers, never a higher one; module-level imports
and the ones inside functions count alike. `tests/test_layers.py` holds the code to this, and `docs/code-map.md`
is generated from it (`python -m rlctl.cli.docs_gen`), so neither can drift from the imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]

# Lowest first. "base" is the top-level modules (rlctl/__init__.py, errors.py, resources.py).
LAYERS: list[tuple[str, ...]] = [
    ("base",),
    ("vision",),
    ("config", "sandbox", "rundir"),
    ("data",),
    ("rewards", "plan", "algorithms"),
    ("checkpoint", "rollout"),
    ("evaluation",),
    ("runtime",),
    ("monitors",),
    ("trainer",),
    ("stages",),
    ("launch",),
    ("after",),
    ("cli",),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def package(module: str) -> str:
    """The subpackage a module belongs to (`base` for the top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PKG / parts[1]).is_dir() else "base"


def imports(mods: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """module -> the rlctl modules it imports (anywhere in the file)."""
    mods = mods or modules()

    def known(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else ""

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {known(a.name) for a in node.names if a.name.startswith("rlctl")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rlctl"):
                found |= {known(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = found - {"", name}
    return graph


def package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """subpackage -> the other subpackages its modules import."""
    edges: dict[str, set[str]] = {}
    for src, targets in graph.items():
        for dst in targets:
            if package(src) != package(dst):
                edges.setdefault(package(src), set()).add(package(dst))
    return edges


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that climb to a higher layer (or reach a package missing from LAYERS)."""
    bad = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            a, b = package(src), package(dst)
            if a != b and (a not in LAYER or b not in LAYER or LAYER[b] >= LAYER[a]):
                bad.append(f"{src} -> {dst}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def may_import(pkg: str) -> list[str]:
    """The packages a package's modules may import: every lower layer."""
    return [name for names in LAYERS[: LAYER[pkg]] for name in names]


def summary(pkg: str) -> str:
    """The first paragraph of a subpackage's docstring."""
    path = PKG / "__init__.py" if pkg == "base" else PKG / pkg / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def markdown() -> str:
    """docs/code-map.md: the layers, one paragraph per subpackage, and the package import graph."""
    graph = imports()
    edges = package_edges(graph)
    lines = [
        "# Code map",
        "",
        "rlctl follows the path a run takes: presets and the config schema (`config`), the plan (`plan`), the",
        "launch (`launch`), the training stages (`stages`, one entry point each) with rlctl's own RL trainer",
        "(`trainer`), what every stage runs with (`runtime`) and what watches it (`monitors`), rollouts",
        "(`rollout`), held-out evaluation (`evaluation`), RL math (`algorithms`) and checkpoints (`checkpoint`),",
        "then what comes after training (`after`), all driven by the CLI (`cli`). Datasets (`data`) and rewards",
        "(`rewards`) feed the plan's checks and the stages; the run directory they all read and write, its paths",
        "and the record of each file, is `rundir`: no other package builds a path into a run directory from a",
        "file's name, and every run file is read through its typed record and written whole or not at all",
        "(`tests/test_rundir_only.py`).",
        "",
        "Layers, lowest first. A module imports its own package and lower layers only; a test",
        "(`tests/test_layers.py`) holds the code to it and finds no import cycle.",
        "",
        "| layer | package | what it owns | may import |",
        "|---|---|---|---|",
    ]
    for i, names in enumerate(LAYERS):
        for name in names:
            where = "`rlctl/*.py`" if name == "base" else f"`rlctl/{name}/`"
            allowed = ", ".join(may_import(name)) or "-"
            lines.append(f"| {i} | {where} | {summary(name)} | {allowed} |")
    lines += ["", "## Imports between packages", "", "```mermaid", "flowchart TD"]
    for src in sorted(edges, key=lambda p: (-LAYER.get(p, 99), p)):
        for dst in sorted(edges[src], key=lambda p: (-LAYER.get(p, 99), p)):
            lines.append(f"  {src} --> {dst}")
    lines += ["```", "", "## Modules", ""]
    for path in modules().values():
        rel = path.relative_to(PKG.parent)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.split("\n\n")[0].replace("\n", " ")
        lines.append(f"- `{rel}`: {first}")
    return "\n".join(lines) + "\n"
