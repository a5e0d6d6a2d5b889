"""Rewards shipped as an installable package: each is an entry point of group `rlctl.rewards`."""

from __future__ import annotations

POLITE = ("please", "thank", "glad to help", "happy to help")


def _text(completion) -> str:
    if isinstance(completion, list):  # chat completions are message lists
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def politeness(prompts: list, completions: list, bonus: float = 1.0, **columns) -> list[float]:
    """`bonus` when the completion contains a polite phrase, else 0.0."""
    return [bonus * any(p in _text(c).lower() for p in POLITE) for c in completions]


def no_repetition(prompts: list, completions: list, n: int = 3, **columns) -> list[float]:
    """The fraction of distinct word n-grams (1.0: nothing repeats; low: the completion loops)."""
    scores = []
    for c in completions:
        words = _text(c).split()
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        scores.append(len(set(grams)) / len(grams) if grams else 1.0)
    return scores
