"""One kind of value per column across every row, as the training dataset needs it.

The stages hand rows to `datasets.Dataset.from_list`, which stores each column as one Arrow type: a column whose
rows mix text and message lists, or numbers and text, fails there (`ArrowTypeError`, `ArrowInvalid`) after launch.
`normalise` below runs on every dataset rlctl reads (the pre-flight's and the stages' rows come from the same
`rlctl.data.load`), so a dataset the pre-flight accepts builds. Ground-truth answers are made text first, as the
rewards read them (`str(answer)`: 12 -> "12", 12.0 -> "12.0", "12" as is), so numbers and text may mix there;
elsewhere a mixture is refused naming the file and line of the first row that differs. Message lists are checked
too: every message a `{role, content}` mapping with text content.

Written by hand rather than by asking pyarrow: Arrow's errors name neither the row nor the column, and importing
pyarrow would slow `rlctl plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlctl.errors import UserError

MESSAGE_COLUMNS = ("messages", "prompt", "completion", "chosen", "rejected")

Kind = Any  # None (null: fits any kind), "text", "number", "boolean", ("list", Kind) or ("mapping", {key: Kind})


class Conflict(Exception):
    """Two kinds that one Arrow column cannot hold, and where inside the value they met."""

    def __init__(self, path: str, first: Kind, second: Kind):
        super().__init__(path)
        self.path, self.first, self.second = path, first, second


def kind_of(value: Any, path: str = "") -> Kind:
    """The kind of `value`, its list items and mapping values unified; a Conflict when a list mixes kinds."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        item: Kind = None
        for v in value:
            item = unify(item, kind_of(v, path + "[]"), path + "[]")
        return ("list", item)
    if isinstance(value, dict):
        return ("mapping", {str(k): kind_of(v, f"{path}.{k}") for k, v in value.items()})
    return type(value).__name__


def unify(a: Kind, b: Kind, path: str = "") -> Kind:
    """The one kind that holds both `a` and `b` (nulls fit anything, mappings may lack keys); else a Conflict."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "list":
        return ("list", unify(a[1], b[1], path + "[]"))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "mapping":
        keys = {**a[1], **b[1]}
        return ("mapping", {k: unify(a[1].get(k), b[1].get(k), f"{path}.{k}") for k in keys})
    raise Conflict(path, a, b)


def describe(kind: Kind) -> str:
    """A kind in words: text, a number, a list of mappings, ..."""
    if isinstance(kind, tuple) and kind[0] == "list":
        if isinstance(kind[1], tuple) and kind[1][0] == "mapping" and "role" in kind[1][1]:
            return "a list of messages"
        inner = describe(kind[1]).removeprefix("a ").removeprefix("an ")
        return "a list" if kind[1] is None else f"a list of {inner}s" if kind[1] != "text" else "a list of texts"
    if isinstance(kind, tuple):
        return "a mapping"
    return {"text": "text", "number": "a number", "boolean": "a boolean"}.get(kind, f"a {kind}")


def answer_text(value: Any) -> Any:
    """A ground truth as the rewards read it: a number or boolean as its `str` (12 -> "12", 12.0 -> "12.0"), each
    item of a list of them too; text, mappings and nulls as they are."""
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str | bool | int | float) for v in value):
        return [answer_text(v) for v in value]
    return value


def _answers_as_text(row: dict[str, Any], key: str) -> dict[str, Any]:
    row = {**row, key: answer_text(row[key])} if key in row else row
    truth = row.get("reward_model")
    if isinstance(truth, dict) and "ground_truth" in truth:
        row["reward_model"] = {**truth, "ground_truth": answer_text(truth["ground_truth"])}
    return row


def _message_problem(message: Any) -> str | None:
    """Why `message` is not a chat message the templates can render, or None."""
    if not isinstance(message, dict):
        return f"holds {describe(kind_of(message))} where a message {{role, content}} belongs"
    if not isinstance(message.get("role"), str) or not message["role"]:
        return "has a message without a role"
    content, role = message.get("content"), message["role"]
    calls = role == "assistant" and message.get("tool_calls")
    a = "an" if role[:1].lower() in "aeio" else "a"  # an assistant, a user
    if content is None and not calls:
        return f"has {a} {role} message with {'no' if 'content' not in message else 'null'} content"
    if content is not None and not isinstance(content, str):
        return f"has {a} {role} message whose content is {describe(kind_of(content))}, not text"
    if content == "" and role != "system" and not calls:
        return f"has {a} {role} message with empty content"
    return None


def check_messages(rows: list[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Every message list (chat `messages`, or a prompt/reply given as messages) holds messages with a role and
    text content (only a system message may be empty; an assistant message making tool calls may have none)."""
    for i, row in enumerate(rows):
        for column in MESSAGE_COLUMNS:
            value = row.get(column)
            if not isinstance(value, list):
                continue
            for n, message in enumerate(value):
                problem = _message_problem(message)
                if problem:
                    raise UserError(
                        f"{where(i)}: column {column} {problem} (message {n + 1}). Every message needs a role and "
                        "text content; fix or remove the row."
                    )


# the prompt of a row whose replies are message lists is read as a user message (data._harmonised)
_HARMONISED = " A text prompt whose completion, chosen or rejected is a message list counts as a message list."


def uniform(rows: list[dict[str, Any]], where: Callable[[int], str]) -> None:
    """A UserError naming the first row whose column holds another kind of value than the rows before it."""
    seen: dict[str, tuple[Kind, int]] = {}
    for i, row in enumerate(rows):
        for column, value in row.items():
            try:
                own = kind_of(value, column)
            except Conflict as c:
                raise UserError(
                    f"{where(i)}: {c.path} mixes {describe(c.first)} and {describe(c.second)} in one value; a "
                    "column holds one kind of value in every row (the training dataset stores it as one type)."
                ) from None
            before, first = seen.get(column, (None, i))
            try:
                seen[column] = (unify(before, own, column), first if before is not None else i)
            except Conflict as c:
                raise UserError(
                    f"{where(i)}: {c.path} is {describe(c.second)} here but {describe(c.first)} in "
                    f"{where(first)}; a column holds one kind of value in every row (the training dataset stores "
                    f"it as one type). Make them the same (every {c.path} {describe(c.first)}, or every {c.path} "
                    f"{describe(c.second)}).{_HARMONISED if c.path == 'prompt' else ''}"
                ) from None


def normalise(
    rows: list[dict[str, Any]], where: Callable[[int], str], answer_key: str | None = None
) -> list[dict[str, Any]]:
    """`rows` with their answers as text (`answer_key`), checked to hold valid messages and one kind of value
    per column; a UserError naming the file and line otherwise."""
    if answer_key:
        rows = [_answers_as_text(r, answer_key) for r in rows]
    check_messages(rows, where)
    uniform(rows, where)
    return rows
