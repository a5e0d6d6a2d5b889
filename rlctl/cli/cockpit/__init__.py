"""What `rlctl eval`, `rlctl rewards`, `rlctl report`, `rlctl doctor` and `rlctl verify` do and print. The
command-line signatures live in rlctl.cli; their bodies live here, one module per command group, imported only when
one of these commands runs, so `rlctl --help` stays fast.

Package `rlctl.cli.cockpit`: where output goes and how a table cell reads (this module), `rlctl rewards list/test`
(`rewards`), `rlctl eval` (`evaluation`), `rlctl report` (`report`), `rlctl doctor` (`doctor`) and `rlctl verify`
(`verify`)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from rlctl.errors import UserError


@dataclass
class UI:
    """Where output goes: `console` (silent with --quiet) and, for final results, `results()` (always)."""

    console: Console
    verbose: bool = False

    def results(self) -> Console:
        return Console(highlight=False, emoji=False) if self.console.quiet else self.console

    def short(self, value: object, width: int = 48) -> str:
        """A prompt or completion on one table line (full text with --verbose)."""
        from rlctl.rewards import completion_text

        text = completion_text(value) if isinstance(value, list) else str(value)
        text = text.replace("\n", "\\n")
        if not self.verbose and len(text) > width:
            text = text[: width - 1] + "…"
        return escape(text)


def fmt(value: object) -> str:
    """A table cell: numbers to 4 significant digits, text with rich markup escaped."""
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.4g}"
    return "-" if value is None else escape(str(value))


def columns_opt(items: list[str] | None) -> dict[str, str]:
    """`--column prompt=question` options as a mapping."""
    out = {}
    for item in items or []:
        name, sep, src = item.partition("=")
        if not sep or not name or not src:
            raise UserError(f"--column expects NAME=SOURCE (e.g. prompt=question), got '{item}'.")
        out[name] = src
    return out
