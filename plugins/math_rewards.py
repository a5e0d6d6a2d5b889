"""Math reward plugins for rlctl, built on rlctl's own answer parsing.

    rl:
      rewards:
        - {name: plugins/math_rewards.py:boxed_or_last_number, weight: 1.0}
        - {name: "plugins/math_rewards.py:step_count(target=4)", weight: 0.1}

A reward receives the prompts, the completions and every other dataset column (the ground truth as `answer`)
as lists of equal length, and returns one float per completion. Completions of chat data are message lists:
`completion_text` turns either form into text.
"""

from __future__ import annotations

from rlctl.rewards import completion_text, gsm8k_answer, last_boxed, math_equal


def boxed_or_last_number(prompts: list, completions: list, answer: list, **columns) -> list[float]:
    """1.0 when the \\boxed{} answer, or failing that the last number, equals the ground truth; else 0.0."""
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        text = completion_text(completion)
        got = last_boxed(text) or gsm8k_answer(text, strict=False)
        scores.append(float(got is not None and math_equal(got, str(truth))))
    return scores


def step_count(prompts: list, completions: list, target: int = 4, **columns) -> list[float]:
    """Up to 1.0 for showing work: the number of non-empty lines, capped at `target`, over `target`."""
    return [
        min(len([ln for ln in completion_text(c).splitlines() if ln.strip()]), target) / target for c in completions
    ]
