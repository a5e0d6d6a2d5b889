"""Multi-turn rollouts with tools: every live rollout of a batch generates its next turn in one batched engine
call; the tool calls in each turn are run and their results appended as `tool` messages rendered by the chat
template; a rollout ends when the model answers without a tool call, after `rl.agent.max_turns` model turns, or when
its trajectory would pass `rl.max_new_tokens`. The model's tokens of every turn are trained (`Sample.loss_mask`
1); the tool-result tokens between turns are context only (0)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.data.tokens import prompt_messages, prompt_text, row_tool_kwargs, row_tools
from rlctl.rollout import toolcalls, tools, vision
from rlctl.rollout.samples import Sample
from rlctl.rollout.vision import VisionInputs


@dataclass(frozen=True)
class Agent:
    """What a multi-turn rollout runs with: the tools, the turn and token limits, the tokens ending a turn."""

    tokenizer: Any
    tools: dict[str, tools.Tool]
    max_turns: int
    max_new_tokens: int
    max_tool_output_tokens: int
    stop_ids: tuple[int, ...]

    def schemas(self, row: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The tools shown to the model: the row's own `tools` (OpenAI schemas of rl.tools' tools), else those its
        verl `extra_info.tools_kwargs` names (without the parameters the row supplies), else all."""
        own = row_tools(row or {})
        if own is not None:
            return own
        bound = row_tool_kwargs(row or {})
        if bound is not None:
            return [tools.without(self.tools[n].schema, bound[n]) for n in bound if n in self.tools]
        return [t.schema for t in self.tools.values()]

    def prompt_inputs(
        self, row: dict[str, Any], processor: Any = None, base: Path | None = None
    ) -> tuple[list[int], VisionInputs | None]:
        """The row's prompt rendered with the tools listed, ready for the first assistant turn; with a
        vision-language model's `processor`, its images (relative paths from `base`) as model inputs beside it and
        their image tokens expanded in the ids (None without images)."""
        text = prompt_text(row["prompt"], self.tokenizer, self.schemas(row))
        if processor is None:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"], None
        return vision.encode(processor, text, vision.row_images(row, base))

    def clip(self, text: str) -> str:
        """A tool's output (or error) cut to rl.agent.max_tool_output_tokens tokens, marked ` [cut]` when cut."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.max_tool_output_tokens:
            return text
        return self.tokenizer.decode(ids[: self.max_tool_output_tokens]) + " [cut]"


def agent_for(rl: Any, tokenizer: Any) -> Agent | None:
    """The multi-turn setup of a run's rl section (`rl.tools`, turn and token limits), or None without tools."""
    if not rl.tools:
        return None
    found = tools.resolve_all(rl.tools)
    return Agent(
        tokenizer, found, rl.agent.max_turns, rl.max_new_tokens, rl.agent.max_tool_output_tokens, stop_ids(tokenizer)
    )


def stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokens that end a model turn: EOS, and the chat template's end-of-turn token when it has one
    (ChatML's <|im_end|>), found by rendering a one-word assistant turn."""
    marker = "rlctl-turn-marker"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}], tokenize=False
    )
    tail = text.split(marker, 1)[1]
    added = tokenizer.get_added_vocab()
    ends = [tokenizer.eos_token_id]
    ends += [i for token, i in added.items() if tail.startswith(token) and i != tokenizer.eos_token_id]
    return tuple(ends)


def start(agent: Agent, sample: Sample) -> None:
    """Reset a sample to its prompt: no completion yet, the conversation so far is the prompt's messages."""
    sample.completion_ids, sample.loss_mask, sample.rollout_logprobs = [], [], None
    sample.messages = prompt_messages(sample.row["prompt"])
    sample.turns = sample.tool_calls = sample.tool_errors = 0
    sample.truncated = False


def rollout(agent: Agent, generator: Any, samples: list[Sample], greedy: bool = False) -> None:
    """Run every sample's conversation to its end, the live ones' turns batched together, the engine awake from
    the first turn to the last; fills each sample's completion_ids, loss_mask, messages (the trajectory), turns,
    tool_calls, tool_errors, truncated and the engine's log-probs (NaN for the tool results between turns)."""
    with generator.awake():
        _rollout(agent, generator, samples, greedy)


def _rollout(agent: Agent, generator: Any, samples: list[Sample], greedy: bool) -> None:
    for s in samples:
        start(agent, s)
    logprobs: dict[int, list[float]] = {}
    live = list(samples)
    in_step = getattr(generator, "synced", False)  # a sharded policy: every process runs every turn's call
    for turn in range(1, agent.max_turns + 1):
        if not live and not in_step:
            break
        images = [s.vision for s in live]  # a prompt's images stay with it on every turn
        outputs = generator.generate([s.prompt_ids + s.completion_ids for s in live], greedy=greedy, vision=images)
        engine_lps = generator.logprobs or [None] * len(live)
        following = []
        for s, ids, lps in zip(live, outputs, engine_lps, strict=True):
            ids = ids[: agent.max_new_tokens - len(s.completion_ids)]
            if lps is not None:
                logprobs.setdefault(id(s), [math.nan] * len(s.completion_ids)).extend(lps[: len(ids)])
            s.completion_ids += ids
            s.loss_mask += [1] * len(ids)
            s.turns = turn
            ended = bool(ids) and ids[-1] in agent.stop_ids
            content = agent.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
            s.messages.append({"role": "assistant", "content": content})
            if not ended:
                s.truncated = True
                continue
            calls = toolcalls.parse(content)
            if not calls or turn == agent.max_turns:
                continue
            shown = agent.schemas(s.row)
            allowed = {name: agent.tools[name] for name in tools.tool_names(shown) if name in agent.tools}
            results = [answer(agent, allowed, s, call) for call in calls]
            end_text = agent.tokenizer.decode(ids[-1:], skip_special_tokens=False)
            text = toolcalls.result_text(agent.tokenizer, s.messages, results, shown, end_text)
            extra = agent.tokenizer(text, add_special_tokens=False)["input_ids"]
            s.messages += [{"role": "tool", "content": r} for r in results]
            if len(s.completion_ids) + len(extra) >= agent.max_new_tokens:  # no room left for the model to answer
                s.truncated = True
                continue
            s.completion_ids += extra
            s.loss_mask += [0] * len(extra)
            if lps is not None:
                logprobs[id(s)] += [math.nan] * len(extra)
            following.append(s)
        live = following
    for s in samples:
        if id(s) in logprobs:
            s.rollout_logprobs = logprobs[id(s)] + [math.nan] * (len(s.completion_ids) - len(logprobs[id(s)]))


def sample(agent: Agent | None, generator: Any, samples: list[Sample], eos: int) -> None:
    """Each sample's completion: every turn of it with tools (`agent`), else one generate call for all; the
    engine's log-probs of the sampled tokens where it gives them."""
    if agent is not None:
        rollout(agent, generator, samples)
        return
    with generator.awake():
        outputs = generator.generate([s.prompt_ids for s in samples], vision=[s.vision for s in samples])
    for s, ids in zip(samples, outputs, strict=True):
        s.completion_ids, s.truncated = ids, eos not in ids
    for s, lps in zip(samples, generator.logprobs or [], strict=False):
        s.rollout_logprobs = lps


def answer(agent: Agent, allowed: dict[str, tools.Tool], sample: Sample, call: toolcalls.ToolCall) -> str:
    """The text the model reads back for one call of one of the `allowed` tools; malformed calls and failed
    tools are counted as errors."""
    sample.tool_calls += 1
    if call.error:
        sample.tool_errors += 1
        return agent.clip(f"Error: {call.error}.")
    arguments, bound = call.arguments, (row_tool_kwargs(sample.row) or {}).get(call.name)
    if bound and isinstance(arguments, dict):  # verl's tools_kwargs: the row's own arguments, on every call
        arguments = {**arguments, **bound}
    result = tools.call(allowed, call.name, arguments)
    sample.tool_errors += result.error
    return agent.clip(result.text)


def final_answer(sample: Sample) -> str:
    """The model's last turn: what built-in rewards score."""
    return next((m["content"] for m in reversed(sample.messages or []) if m["role"] == "assistant"), "")


def metrics(samples: list[Sample]) -> dict[str, float]:
    """Per-rollout means of a step: model turns, tool calls, failed calls, and the share that called a tool."""
    n = len(samples)
    return {
        "turns": sum(s.turns for s in samples) / n,
        "tool_calls": sum(s.tool_calls for s in samples) / n,
        "tool_errors": sum(s.tool_errors for s in samples) / n,
        "tool_call_rate": sum(s.tool_calls > 0 for s in samples) / n,
    }
