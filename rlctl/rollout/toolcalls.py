"""Tool calls in a model's turn, written in Qwen2.5's format `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` (several per turn allowed), and the tool results rendered back through the tokenizer's own chat
template as `tool` messages."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: `error` says why it cannot be run (then name/arguments may be None)."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None


def _one(body: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall(None, None, "the <tool_call> block is not closed with </tool_call>")
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, None, f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(None, None, 'a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(value["name"], None, f"the arguments of {value['name']} must be a JSON object")
    return ToolCall(value["name"], arguments)


def parse(text: str) -> list[ToolCall]:
    """Every tool call in a turn's text, in order; malformed ones carry an error (the model is told why)."""
    return [_one(m.group(1).strip(), bool(m.group(2))) for m in _CALL.finditer(text)]


def render_kwargs(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """apply_chat_template's `tools` argument: only when there are tools, so plain prompts render as before."""
    return {"tools": tools} if tools else {}


def result_text(
    tokenizer: Any, messages: list[dict[str, Any]], results: list[str], tools: list[dict] | None, end_text: str
) -> str:
    """The text that follows the model's turn (`messages[-1]`, which ended with `end_text`): the results as
    `tool` messages and the opening of the next assistant turn, exactly as the chat template renders them."""
    kwargs = render_kwargs(tools)
    before = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    after_messages = messages + [{"role": "tool", "content": r} for r in results]
    after = tokenizer.apply_chat_template(after_messages, tokenize=False, add_generation_prompt=True, **kwargs)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once tool results follow them")
    turn = messages[-1]["content"] + end_text  # what the model wrote; the template may add more after it
    at = before.rfind(turn)
    return after[at + len(turn) if at >= 0 else len(before) :]
