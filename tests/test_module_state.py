"""No module-level mutable state in rlctl/: what is shared is passed (the stage context carries the memory probe, the
stop flag and the reward workers; the pre-flight report says what the data check recognised; the UI object carries
verbosity). The source is read, not imported: no `global` statement, no module-level container or object changed
after it is built, no constant of another module changed, no private attribute set on another library's object."""

from __future__ import annotations

import ast
from pathlib import Path

RLCTL = Path(__file__).resolve().parent.parent / "rlctl"
MUTATING = {
    "append",
    "appendleft",
    "add",
    "clear",
    "discard",
    "extend",
    "extendleft",
    "insert",
    "pop",
    "popitem",
    "remove",
    "reverse",
    "setdefault",
    "sort",
    "update",
    "__setitem__",
    "__delitem__",
}
CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
# Registries of the documented extension API (docs/algorithms.md): filled once at import by their decorators.
REGISTRIES = {
    ("algorithms/advantages.py", "ADVANTAGE_ESTIMATORS"),
    ("algorithms/kl.py", "KL_ESTIMATORS"),
    ("algorithms/losses.py", "POLICY_LOSSES"),
}
# Hooks into TRL objects, all in the one module that reaches into TRL's internals (no state outlives the object).
HOOKS = {}


def _module_objects(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level to a container or to an object it builds (a call)."""
    names = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if isinstance(value, (*CONTAINERS, ast.Call)):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _root(node: ast.expr) -> ast.expr:
    """`a` of `a.b[c].d`."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _chain(node: ast.expr) -> ast.expr:
    """`a.b[c].d` without its subscripts' keys (`a.b[...].d`): a constant used as a key is read, not changed."""
    if isinstance(node, ast.Subscript):
        return ast.Subscript(value=_chain(node.value), slice=ast.Constant(value=...), ctx=node.ctx)
    if isinstance(node, ast.Attribute):
        return ast.Attribute(value=_chain(node.value), attr=node.attr, ctx=node.ctx)
    return node


def _changed(node: ast.AST) -> list[ast.expr]:
    """The expressions `node` changes in place: assignment and deletion targets, receivers of mutating calls."""
    if isinstance(node, ast.Assign | ast.Delete):
        return [t for t in node.targets if isinstance(t, ast.Attribute | ast.Subscript)]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):  # `n += 1` on a name rebinds it (a local one)
        return [node.target] if isinstance(node.target, ast.Attribute | ast.Subscript) else []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING:
        return [node.func.value]
    return []


def offences(path: Path, package: Path = RLCTL) -> list[str]:
    """Each offence in the module at `path` as `file:line: what`, in line order."""
    rel = path.relative_to(package).as_posix()
    tree = ast.parse(path.read_text())
    objects = _module_objects(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        where = f"{rel}:{line}"
        if isinstance(node, ast.Global):
            out.append((line, f"{where}: global {', '.join(node.names)}"))
        for target in _changed(node):
            root = _root(target)
            if isinstance(root, ast.Name) and root.id in objects and (rel, root.id) not in REGISTRIES:
                out.append((line, f"{where}: module-level {root.id} changed ({ast.unparse(target)})"))
            elif isinstance(target, ast.Subscript | ast.Attribute) and any(
                isinstance(part, ast.Attribute) and part.attr.isupper() for part in ast.walk(_chain(target))
            ):
                out.append((line, f"{where}: another module's constant changed ({ast.unparse(target)})"))
            if (
                isinstance(node, ast.Assign)
                and isinstance(target, ast.Attribute)
                and target.attr.startswith("_")
                and not target.attr.startswith("__")
                and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))
                and (rel, ast.unparse(target)) not in HOOKS
            ):
                out.append((line, f"{where}: private attribute set on another object ({ast.unparse(target)})"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                out.append((line, f"{where}: setattr of a private attribute {name.value!r}"))
            if isinstance(name, ast.Name) and name.id.isupper():
                out.append((line, f"{where}: setattr of the attribute a constant names ({name.id})"))
    return [text for _, text in sorted(out)]


def test_rlctl_keeps_no_module_level_mutable_state():
    found = [o for path in sorted(RLCTL.rglob("*.py")) for o in offences(path)]
    assert found == []


def test_the_check_recognises_each_kind_of_offence(tmp_path: Path):
    """The patterns that were removed from rlctl (issue 30) are each caught."""
    src = tmp_path / "rlctl" / "mod.py"
    src.parent.mkdir()
    src.write_text(
        "from rich.console import Console\n"
        "from rlctl import data\n"
        "VERBOSE = {'on': False}\n"
        "_WORKERS: dict = {}\n"
        "console = Console()\n"
        "console.soft_wrap = True\n"
        "def f(opt, name, w):\n"
        "    global COUNT\n"
        "    VERBOSE['on'] = True\n"
        "    _WORKERS.setdefault(name, w)\n"
        "    data.RECOGNISED[name] = w\n"
        "    w[data.RECOGNISED] = name\n"
        "    setattr(opt, '_rlctl_switches', {})\n"
        "    opt._homes = {}\n"
    )
    found = offences(src, src.parent)
    kinds = [o.split(": ", 1)[1].split(" (")[0] for o in found]
    assert kinds == [
        "module-level console changed",
        "global COUNT",
        "module-level VERBOSE changed",
        "module-level _WORKERS changed",
        "another module's constant changed",
        "setattr of a private attribute '_rlctl_switches'",
        "private attribute set on another object",
    ], found
