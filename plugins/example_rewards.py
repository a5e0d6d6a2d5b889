"""Reward plugins for rlctl. Point the config at one with `name: rewards.py:short_answer`.

A reward function receives the prompts, the generated completions and every other dataset column
(here `answer`) as lists of the same length, and returns one float per completion.
"""


def short_answer(prompts: list[str], completions: list[str], answer: list[str], **columns) -> list[float]:
    """1.0 for a completion no longer than the reference answer, scaled down as it grows longer."""
    scores = []
    for completion, reference in zip(completions, answer, strict=True):
        extra = max(0, len(completion.strip()) - len(str(reference)))
        scores.append(1.0 / (1.0 + extra))
    return scores
