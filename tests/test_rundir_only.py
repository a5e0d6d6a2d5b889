"""The run directory is the only way in (issue 50): no module outside rlctl/rundir/ builds a path into a run
directory from a file or folder name of its own; it asks `rlctl.rundir.RunDir` (or `incoming`, `checkpoint`,
`data_file`, `final_staging`, `set_aside` for the folders inside a stage), so a name lives in one place.

How the rule tells a path from a message. It scans the source of rlctl/ (an AST walk) for the names of
`rlctl.rundir.paths.NAMES` (config.yaml, plan.json, data_lengths.json, checkpoint-*, .incoming, logs, data,
*.jsonl, ...) where a string is used as a path:
- an operand of `/` (`run_dir / "plan.json"`, `folder / f"checkpoint-{step}"`);
- an argument of `Path(...)`, `PurePath(...)`, `open(...)`, `os.path.join(...)`, or of a path's `.joinpath`,
  `.with_name`, `.with_stem`, `.with_suffix`, `.glob`, `.rglob` (`ckpt.with_name(ckpt.name + ".damaged")`);
- compared with a path's `.name` (`p.name != "logs"`);
- bound to a module or class constant (`PLAN_FILE = "plan.json"`: a second home for the name), for the names
  that are file names (with a dot or a dash: bare words such as `data` or `eval` are also stage, role and event
  names).
An f-string's or a concatenation's fixed parts count, its holes read as `*` (`f"ui-{command}.log"` is `ui-*.log`),
and a string holding `/` is checked part by part. Anywhere else a name is words a person reads: messages
(`f"{run_dir}/logs/train.log"`), help texts and docstrings, a record's keys, an event's name.

ALLOWED lists the few paths that carry such a name but lie outside any run directory, each with why."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

from rlctl.rundir import paths

RLCTL = Path(__file__).parent.parent / "rlctl"
PATH_CALLS = {"Path", "PurePath", "open", "joinpath", "with_name", "with_stem", "with_suffix", "glob", "rglob"}
# (module, the name as the rule reads it): why it is no run-directory path
ALLOWED = {
    ("rlctl/cli/prepare.py", "data"): "the project folder `rlctl init` writes (rlctl.yaml beside data/ROLE.jsonl)",
    ("rlctl/cli/prepare.py", "*.jsonl"): "the project folder `rlctl init` writes, and the preset's sample data",
    ("rlctl/cli/jobs.py", "config.yaml"): "the config file mounted into a Kubernetes pod (its ConfigMap's key)",
    ("rlctl/stages/gguf_import.py", ".*.*.damaged"): "a damaged folder of the GGUF import cache, set aside",
}


def skeleton(node: ast.AST) -> str | None:
    """The string `node` builds, its holes as `*`; None when it builds no string of fixed parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = skeleton(node.left), skeleton(node.right)
        if left is not None or right is not None:
            return (left or "*") + (right or "*")
    return None


def run_name(text: str, files_only: bool = False) -> bool:
    """Whether `text` (a skeleton) names a file or folder of a run directory, in whole or in one of its parts (a
    part with a space in it is words, not a name)."""
    names = [n for n in paths.NAMES if not files_only or "." in n or "-" in n]
    parts = [part for part in text.split("/") if part.strip("*") and not any(c.isspace() for c in part)]
    return any(fnmatchcase(part, name) for part in parts for name in names)


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return "os.path.join" if ast.unparse(func) == "os.path.join" else func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "name"


def path_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, skeleton) of every string `tree` uses as a path to a run-directory name (see the module's docstring)."""
    used: list[tuple[ast.AST, bool]] = []  # (expression, files only)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            used += [(node.left, False), (node.right, False)]
        elif isinstance(node, ast.Call) and _call_name(node.func) in PATH_CALLS | {"os.path.join"}:
            used += [(arg, False) for arg in node.args]
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1:
            sides = (node.left, node.comparators[0])
            if any(_is_name(side) for side in sides):
                used += [(side, False) for side in sides]
        elif isinstance(node, ast.Module | ast.ClassDef):
            for stmt in node.body:
                value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
                items = value.elts if isinstance(value, ast.Tuple | ast.List | ast.Set) else [value]
                used += [(item, True) for item in items if item is not None]
    found = []
    for expr, files_only in used:
        text = skeleton(expr)
        if text is not None and run_name(text, files_only):
            found.append((expr.lineno, text))
    return found


def test_no_module_outside_rundir_builds_a_run_directory_path():
    found = []
    for module in sorted(RLCTL.rglob("*.py")):
        rel = module.relative_to(RLCTL.parent).as_posix()
        if rel.startswith("rlctl/rundir/"):
            continue
        for line, text in path_strings(ast.parse(module.read_text())):
            if (rel, text) not in ALLOWED:
                found.append(f"{rel}:{line}: {text!r}")
    assert found == [], "name these through rlctl.rundir.RunDir (or add the name there):\n" + "\n".join(found)


def test_every_allowed_exception_is_still_there():
    """An entry of ALLOWED whose path is gone goes too, so the list never hides a later one."""
    seen = set()
    for rel, _ in ALLOWED:
        seen |= {(rel, text) for _, text in path_strings(ast.parse((RLCTL.parent / rel).read_text()))}
    assert set(ALLOWED) <= seen


def test_the_rule_finds_paths_and_leaves_messages_alone():
    """The cases the rule was written for (each once in rlctl/ before issue 50) are found; messages are not."""
    paths_ = """
PLAN_FILE = "plan.json"
DATA_LENGTHS = "data_lengths.json"
class Names:
    INCOMING = ".incoming"
a = run_dir / "plan.json"
b = Path(run_dir) / "data" / f"{role}.jsonl"
c = Path(run_dir, "accelerate.yaml")
d = incoming(folder) / f"checkpoint-{step}"
e = RunDir(root).logs / f"ui-{command}.log"
f = ctx.final.with_name("final.tmp")
g = damaged.with_name(damaged.name + ".damaged")
h = [p for p in run_dir.iterdir() if p.name != "logs"]
i = sorted(folder.glob("checkpoint-*"))
j = open("metrics.jsonl")
k = os.path.join(run_dir, "sft/checkpoints")
l = Path(scratch) / "data"
"""
    found = sorted(text for _, text in path_strings(ast.parse(paths_)))
    assert found == sorted(
        [
            "plan.json",
            "data_lengths.json",
            ".incoming",
            "plan.json",
            "data",
            "*.jsonl",
            "accelerate.yaml",
            "checkpoint-*",
            "ui-*.log",
            "final.tmp",
            "*.damaged",
            "logs",
            "checkpoint-*",
            "metrics.jsonl",
            "sft/checkpoints",
            "data",
        ]
    ), found
    messages = '''
STAGES = ("sft", "rm", "rl", "eval")
def f(run_dir, rec):
    """Reads plan.json and data_lengths.json."""
    print(f"The full log is in {run_dir}/logs/train.log; see summary.json.")
    raise UserError(f"{run_dir} is not a run directory (no config.yaml).")
    if rec.get("event") == "eval" and rec["stage"] != "base":
        return {"data": rec, "memory": "config.yaml"}
'''
    assert path_strings(ast.parse(messages)) == []
