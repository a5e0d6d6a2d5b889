"""The one error type users see: bad input that stops rlctl before anything starts (exit code 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input (usage, config, data). The CLI prints the message as one paragraph and exits 2."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean: a, b?' for the closest matches of `word`, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""
