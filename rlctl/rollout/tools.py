"""Tools a policy may call during a multi-turn rollout (`rl.tools`): the built-in `calculator` (exact arithmetic
on an expression, read through `ast`, never evaluated as code) and `python` (run in rlctl's sandbox), user tools
as `path/to/file.py:function` or an entry point of group `rlctl.tools`. Each tool is described to the chat
template by the OpenAI JSON schema built from its signature and docstring. A call never raises: a tool that fails,
times out or gets bad arguments answers with an error message the model reads (`ToolResult.error` is set)."""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import inspect
import operator
import signal
import threading
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlctl.errors import UserError, did_you_mean
from rlctl.rewards.resolve import load_plugin

ENTRY_POINT_GROUP = "rlctl.tools"
TIMEOUT_S = 10.0  # wall time of one call of an in-process tool (`python` has the sandbox's own limits)
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    """A callable tool and the schema the chat template shows the model."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    text: str
    error: bool


# ------------------------------------------------------------------------------------------- calculator
MAX_EXPRESSION = 400  # characters
MAX_DIGITS = 400  # of any intermediate numerator or denominator
MAX_EXPONENT = 256
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip


def _number(node: ast.AST) -> Fraction:
    """The exact value of an expression node: numbers, + - * / // % ** and parentheses only."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        source = repr(node.value) if isinstance(node.value, int) else node.value
        return Fraction(str(source))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _number(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _number(node.left), _number(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ZeroDivisionError("division by zero")
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ZeroDivisionError("division by zero")
        value = Fraction(_BINARY[type(node.op)](left, right))
        if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_DIGITS:
            raise ValueError(f"a number grew beyond {MAX_DIGITS} digits")
        return value
    raise ValueError(f"'{ast.unparse(node)}' is not arithmetic (numbers, + - * / // % ** and parentheses)")


def format_number(value: Fraction) -> str:
    """An integer as is, a terminating fraction as an exact decimal, any other as numerator/denominator."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    whole, frac = divmod(scaled, 10**places)
    return f"{'-' if value < 0 else ''}{whole}.{str(frac).rjust(places, '0').rstrip('0')}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12.5 + 3) * 47".
    """
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read '{expression}' as arithmetic") from None
    return format_number(_number(tree.body))


# ---------------------------------------------------------------------------------------------- python
def python(code: str) -> str:
    """Run Python code in a sandbox (no network, no files but a scratch folder, 5 s, 512 MB) and return what it
    prints.

    Args:
        code: a Python program; print the values you need.
    """
    from rlctl import sandbox

    result = sandbox.run_program(code)
    if not result.passed:
        raise RuntimeError(f"{result.reason}\n{result.output[-2000:]}".strip())
    return result.output


BUILTINS: dict[str, Callable[..., Any]] = {"calculator": calculator, "python": python}


# ----------------------------------------------------------------------------------------------- schema
def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation) or annotation
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    return {"type": JSON_TYPES[origin]} if origin in JSON_TYPES else {}


def _arg_docs(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's description (before `Args:`) and its per-argument lines (`name: text`)."""
    head, _, args = doc.partition("Args:")
    described: dict[str, str] = {}
    last = None
    for line in args.splitlines():
        name, sep, text = line.strip().partition(":")
        if sep and name.split(" ")[0].isidentifier() and line.startswith((" " * 4, "\t")) and " " not in name:
            last, described[name] = name, text.strip()
        elif last and line.strip():
            described[last] += " " + line.strip()
    return " ".join(head.split()), described


def schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function-tool schema of `fn`: its docstring's description and typed parameters."""
    description, described = _arg_docs(inspect.getdoc(fn) or "")
    if not description:
        raise ValueError("it has no docstring (its first lines describe the tool to the model)")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(pname, str))
        if pname in described:
            prop["description"] = described[pname]
        properties[pname] = prop
        if param.default is param.empty:
            required.append(pname)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# ---------------------------------------------------------------------------------------------- resolve
def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Tools installed by packages under the entry point group `rlctl.tools`, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def resolve(spec: str) -> Tool:
    """The tool `spec` names: a built-in, `path/to/file.py:function`, or an entry point of group rlctl.tools."""
    if ".py:" in spec:
        name, fn = spec.rpartition(":")[2], load_plugin(spec, "rl.tools: tool file", "rl.tools entry")
    elif spec in BUILTINS:
        name, fn = spec, BUILTINS[spec]
    elif spec in (eps := entry_points()):
        try:
            name, fn = spec, eps[spec].load()
        except Exception as e:
            raise UserError(
                f"rl.tools: tool '{spec}' (entry point {eps[spec].value} of group {ENTRY_POINT_GROUP}) failed to "
                f"load: {type(e).__name__}: {e}."
            ) from None
    else:
        known = [*BUILTINS, *eps]
        raise UserError(
            f"rl.tools: unknown tool '{spec}'.{did_you_mean(spec, known)} Known: {', '.join(known)}; or give a "
            f"tool as path/to/file.py:function, or install a package with a '{ENTRY_POINT_GROUP}' entry point."
        )
    if not callable(fn):
        raise UserError(f"rl.tools: tool '{spec}' is not a function.")
    try:
        return Tool(name, fn, schema(name, fn))
    except (ValueError, TypeError, NameError, KeyError) as e:
        raise UserError(f"rl.tools: tool '{spec}' cannot be described to the model: {e}.") from None


def resolve_all(specs: list[str]) -> dict[str, Tool]:
    """Every tool of `rl.tools` by its name; two tools of one name are refused."""
    out: dict[str, Tool] = {}
    for spec in specs:
        tool = resolve(spec)
        if tool.name in out:
            raise UserError(f"rl.tools: two tools are named '{tool.name}'; the model calls tools by name.")
        out[tool.name] = tool
    return out


def without(schema_: dict[str, Any], names: Any) -> dict[str, Any]:
    """A tool schema with the parameters in `names` left out: the row supplies them, the model does not."""
    if not names:
        return schema_
    fn = schema_["function"]
    params = fn.get("parameters") or {}
    kept = {k: v for k, v in (params.get("properties") or {}).items() if k not in names}
    required = [k for k in params.get("required") or [] if k not in names]
    return {**schema_, "function": {**fn, "parameters": {**params, "properties": kept, "required": required}}}


def tool_names(schemas: list[dict[str, Any]]) -> list[str]:
    """The function names of OpenAI tool schemas (`{"type": "function", "function": {"name": ...}}` or flat)."""
    return [(s.get("function") or s).get("name") for s in schemas]


def call(tools: dict[str, Tool], name: Any, arguments: Any, timeout_s: float = TIMEOUT_S) -> ToolResult:
    """Run one tool call; every failure (unknown tool, bad arguments, an exception, a timeout) becomes an error
    message for the model."""
    tool = tools.get(name) if isinstance(name, str) else None
    if tool is None:
        return ToolResult(f"Error: unknown tool '{name}'. Available: {', '.join(tools)}.", True)
    if not isinstance(arguments, dict):
        return ToolResult(f"Error: the arguments of {name} must be a JSON object.", True)
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as e:
        return ToolResult(f"Error: bad arguments for {name}: {e}.", True)
    try:
        with _deadline(timeout_s):
            return ToolResult(str(tool.fn(**arguments)), False)
    except Exception as e:  # a tool's own failure is the model's information, never the run's end
        return ToolResult(f"Error: {type(e).__name__}: {e}", True)


class ToolTimeout(Exception):
    """An in-process tool ran past its wall time."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Interrupt the block after `seconds` with ToolTimeout (SIGALRM: the main thread only, elsewhere unlimited)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(*_: Any) -> None:
        raise ToolTimeout(f"the tool ran longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
