"""Errors users see: bad input that stops rlctl before anything starts (exit code 2), and runtime faults
the runner explains (exit code 1)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from rlctl.processes import exit_text


class UserError(Exception):
    """Bad input (usage, config, data). The CLI prints the message as one paragraph and exits 2."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 3, say: Mapping[str, str] | None = None) -> str:
    """' Did you mean: a, b?' for the closest matches of `word`, or '' when nothing is close; `say` names what to
    suggest for a choice where that is not the choice itself (each suggestion once)."""
    close = difflib.get_close_matches(word, list(choices), n=3 * n, cutoff=0.5)
    named = list(dict.fromkeys((say or {}).get(c, c) for c in close))[:n]
    return f" Did you mean: {', '.join(named)}?" if named else ""


class RewardError(RuntimeError):
    """A reward function raised during training with `on_error: raise`; the message names it and the sample
    (`index`: the sample's place in the batch, when one sample failed)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class RowFailure(Exception):
    """Row `index` of a list of rows failed (`cause`); the caller that knows where the rows were read from turns
    it into a DataRowError (or a RewardError) naming the file and line."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"row {index}: {type(cause).__name__}: {cause}")
        self.index, self.cause = index, cause


class DataRowError(RuntimeError):
    """A row of the user's data failed a stage at runtime (a chat template refused it, say); the message names
    the file and line."""


class ChildDied(RuntimeError):
    """A process rlctl started and talks to died (`what`: its name, as the message says it); the runner adds the last
    checkpoint and the resume command."""

    def __init__(self, what: str, pid: int | None, exitcode: int | None):
        super().__init__(f"The {what}{f' (pid {pid})' if pid is not None else ''} {exit_text(exitcode)}.")


def is_out_of_memory(error: BaseException) -> bool:
    """torch's (CUDA or other accelerator) out-of-memory error or Python's MemoryError, without importing torch."""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"


class GeneratorFailed(RuntimeError):
    """An async generator engine raised (`kind`: the exception's type, `where`: its innermost frame); the runner
    adds the last checkpoint and the resume command, the engine's traceback is in the run's log."""

    def __init__(self, engine: int, kind: str, message: str, where: str):
        text = " ".join(message.split())
        text = text if len(text) <= 400 else text[:400] + " ..."
        super().__init__(
            f"The async generator (engine {engine}) failed: {kind}{': ' + text if text else ''} (raised at {where})."
        )
        self.engine, self.kind = engine, kind
