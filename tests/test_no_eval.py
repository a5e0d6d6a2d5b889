"""No text from a model or a dataset reaches a Python evaluator: rlctl's source (and the shipped plugins) is read
with `ast` for calls of eval/exec/compile/__import__, sympy's sympify/parse_expr/parse_latex, and for code strings
handed to another interpreter that call exec or eval. Math answers are parsed by math-verify's LaTeX grammar."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EVALUATORS = {"eval", "exec", "compile", "__import__", "sympify", "parse_expr", "parse_latex", "latex2sympy"}
SYMPY_ONLY = {"sympify", "parse_expr", "parse_latex", "latex2sympy"}  # as attributes: `sympy.sympify(...)`
CODE_IN_STRING = ("exec(", "eval(")

# (file, what) -> why it is not fed model or dataset text, or why that is its purpose.
ALLOWED = {
    ("rlctl/sandbox/solution_side.py", "call of exec"): "runs the model's code inside the bubblewrap jail, as the "
    "jail's own program: confining that code is what the sandbox is for",
    ("rlctl/sandbox/solution_side.py", "call of compile"): "compiles the model's code inside the jail, as above",
    ("rlctl/sandbox/tests_side.py", "call of exec"): "runs the row's tests inside the second jail, which holds none "
    "of the model's code (its objects are reached through proxies)",
    ("rlctl/sandbox/tests_side.py", "call of compile"): "compiles the row's tests inside that jail, as above",
}


def _findings(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each evaluator call, sympy parser import, or code string calling exec/eval in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in EVALUATORS:
                found.append((node.lineno, f"call of {func.id}"))
            elif isinstance(func, ast.Attribute) and (
                func.attr in SYMPY_ONLY
                or (func.attr in EVALUATORS and isinstance(func.value, ast.Name) and func.value.id == "builtins")
            ):
                found.append((node.lineno, f"call of .{func.attr}"))
        elif isinstance(node, ast.ImportFrom) and any(a.name in EVALUATORS for a in node.names):
            found.append((node.lineno, f"import of {', '.join(a.name for a in node.names)} from {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, f"string calling {c}") for c in CODE_IN_STRING if c in node.value]
    return sorted(found)


def test_no_model_or_dataset_text_reaches_an_evaluator():
    files = sorted((REPO / "rlctl").rglob("*.py")) + sorted((REPO / "plugins").rglob("*.py"))
    assert len(files) > 50
    bad, allowed_seen = [], set()
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        for line, what in _findings(path):
            if (rel, what) in ALLOWED:
                allowed_seen.add((rel, what))
            else:
                bad.append(f"{rel}:{line}: {what}")
    assert not bad, "model or dataset text could reach a Python evaluator:\n" + "\n".join(bad)
    assert allowed_seen == set(ALLOWED), f"allow-list entries that no longer match: {set(ALLOWED) - allowed_seen}"


def test_the_inspection_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import builtins, re\nfrom sympy.parsing.sympy_parser import parse_expr\nimport sympy\n"
        "eval('1')\nbuiltins.exec('x')\nsympy.sympify('x')\nre.compile('x')\nmodel.eval()\n"
        "BOOT = \"exec(open('a').read())\"\n"
    )
    assert [what for _, what in _findings(sample)] == [
        "import of parse_expr from sympy.parsing.sympy_parser",
        "call of eval",
        "call of .exec",
        "call of .sympify",
        "string calling exec(",
    ]
