"""Errors users see: bad input that stops rlctl before anything starts (exit code 2), and runtime faults
the runner explains (exit code 1)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input (usage, config, data). The CLI prints the message as one paragraph and exits 2."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean: a, b?' for the closest matches of `word`, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""


class RewardError(RuntimeError):
    """A reward function raised during training with `on_error: raise`; the message names it and the sample."""


def is_out_of_memory(error: BaseException) -> bool:
    """torch's (CUDA or other accelerator) out-of-memory error or Python's MemoryError, without importing torch."""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
