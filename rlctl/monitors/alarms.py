"""Alarms for runs that learn nothing, fed by the metric records every stage writes (TRL's trainers through
StreamMetrics, rlctl's RL loop directly), so both RL paths share them. An alarm fires once a condition has held
for `logging.alarm_steps` consecutive logged steps (again only after it cleared), with the likely cause and the
fix; it is written to metrics.jsonl (`event: alarm`), printed, shown by `rlctl train` and `rlctl report`, and with
`logging.alarms: stop` the stage stops (no checkpoint of the state that learned nothing). Torch-free."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _metric(record: dict[str, Any], *keys: str) -> float | None:
    return next((float(record[k]) for k in keys if isinstance(record.get(k), int | float)), None)


def _zero_gradient(r: dict[str, Any]) -> bool | None:
    grad = _metric(r, "grad_norm")
    if grad is not None:
        return grad == 0.0
    loss = _metric(r, "loss")  # GRPO's loss is ~0 while it learns: only without a gradient norm
    return None if loss is None else loss == 0.0


def _at_one(*keys: str) -> Callable[[dict[str, Any]], bool | None]:
    def test(r: dict[str, Any]) -> bool | None:
        value = _metric(r, *keys)
        return None if value is None else value >= 1.0

    return test


@dataclass(frozen=True)
class Rule:
    name: str
    what: str  # formatted with n (the steps) and the record
    cause: str
    fix: str
    test: Callable[[dict[str, Any]], bool | None]  # None: the record does not say


RULES = (
    Rule(
        "zero_gradient",
        "the gradient norm (or the loss) has been exactly 0 for {n} steps: nothing is being learned",
        "every advantage is 0 (all completions of each prompt scored alike), the trainable parameters are frozen "
        "or LoRA wraps no module, or the learning signal is masked out (every completion truncated and masked)",
        "check the rewards vary (`rlctl rewards test`), raise rl.group_size or rl.temperature, check model.adapter",
        _zero_gradient,
    ),
    Rule(
        "identical_rewards",
        "every group of completions has had identical rewards (frac_reward_zero_std = 1) for {n} steps, so every "
        "advantage is 0",
        "a reward that is constant or broken, or a task far too hard or too easy for the model",
        "score sample completions with `rlctl rewards test`, fix or replace the reward, use easier data (or SFT "
        "first), raise rl.group_size or rl.temperature",
        _at_one("frac_reward_zero_std"),
    ),
    Rule(
        "all_truncated",
        "every completion has been cut at rl.max_new_tokens for {n} steps",
        "rl.max_new_tokens is too small for the task, or the model never emits its end-of-sequence token "
        "(a chat template or EOS token that does not match the model)",
        "raise rl.max_new_tokens, check the tokenizer's eos token and chat template",
        _at_one("truncated_ratio"),
    ),
    Rule(
        "clip_stuck",
        "every token has been clipped (clip ratio 1) for {n} steps, so no gradient flows through the policy loss",
        "the policy moved far from the one that sampled (learning rate too high, too many rl.ppo_epochs) or the "
        "generation engine samples with stale weights",
        "lower rl.learning_rate or rl.ppo_epochs; with vLLM keep rl.mismatch.sync_tolerance on",
        _at_one("clip_ratio", "clip_frac"),
    ),
)

FLAT_AT_MINIMUM = (
    "the mean reward has been {value:g} for {n} steps, the lowest it has been",
    "no completion earns any reward (a reward that never matches the model's output format, or a task too hard "
    "for the model)",
    "score sample completions with `rlctl rewards test`, match the reward to the output format, SFT first or "
    "use easier data",
)
NOTHING_TRAINED = (
    "the resume from step {resumed_from} trained 0 steps and the stage ends at step {max_steps}",
    "the checkpoint's step counter is past the stage's end (max_steps or batch settings differ from the run that "
    "wrote it), or the trainer skipped the steps left",
    "check `rlctl verify RUN` and the checkpoint's step; start a new run, or set the newer checkpoints aside to "
    "resume from an earlier one",
)


def message(what: str, cause: str, fix: str) -> str:
    return f"{what[0].upper()}{what[1:]}. Likely cause: {cause}. Fix: {fix}."


class Watch:
    """Turns metric records into alarm records (`feed`); `stop` holds the first alarm's message when
    `mode` is stop."""

    def __init__(self, steps: int, mode: str = "warn"):
        self.steps, self.mode = steps, mode
        self.streaks: dict[tuple[str, str], int] = {}
        self.rewards: dict[str, list[float]] = {}
        self.stop: str | None = None

    def feed(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The alarms `record` completes (usually none)."""
        stage = str(record.get("stage", "?"))
        if record.get("event") == "trained":
            return self._trained(stage, record)
        if "step" not in record or "event" in record:
            return []
        fired = []
        for rule in RULES:
            state = rule.test(record)
            if state is None:
                continue
            key = (stage, rule.name)
            self.streaks[key] = self.streaks.get(key, 0) + 1 if state else 0
            if self.streaks[key] == self.steps:
                what = rule.what.format(n=self.steps)
                fired.append(self._alarm(stage, record["step"], rule.name, message(what, rule.cause, rule.fix)))
        reward = _metric(record, "reward")
        if reward is not None and self._flat_at_minimum(stage, reward):
            what = FLAT_AT_MINIMUM[0].format(value=reward, n=self.steps)
            fired.append(self._alarm(stage, record["step"], "reward_at_minimum", message(what, *FLAT_AT_MINIMUM[1:])))
        return fired

    def _flat_at_minimum(self, stage: str, reward: float) -> bool:
        """True at the step the mean reward has been one value for `steps` steps, the lowest value seen, and
        either at most 0 or below an earlier value (a reward stuck at its top is not this alarm)."""
        seen = self.rewards.setdefault(stage, [])
        seen.append(reward)
        key = (stage, "reward_at_minimum")
        last = seen[-self.steps :]
        flat = len(last) == self.steps and max(last) - min(last) <= 1e-9 * max(1.0, abs(reward))
        bottom = reward <= min(seen) and (reward <= 0.0 or reward < max(seen))
        self.streaks[key] = self.streaks.get(key, 0) + 1 if flat and bottom else 0
        return self.streaks[key] == 1

    def _trained(self, stage: str, record: dict[str, Any]) -> list[dict[str, Any]]:
        resumed, steps, end = record.get("resumed_from"), record.get("steps"), record.get("max_steps")
        if resumed is None or steps != 0 or resumed == end:
            return []
        what = NOTHING_TRAINED[0].format(resumed_from=resumed, max_steps=end)
        return [self._alarm(stage, resumed, "resume_trained_nothing", message(what, *NOTHING_TRAINED[1:]))]

    def _alarm(self, stage: str, step: Any, name: str, text: str) -> dict[str, Any]:
        if self.mode == "stop" and self.stop is None:
            self.stop = text
        return {"stage": stage, "step": step, "event": "alarm", "alarm": name, "message": text}


def alarms_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alarm records of a run's metrics.jsonl, in order."""
    return [r for r in records if r.get("event") == "alarm"]
