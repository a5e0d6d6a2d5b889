"""What `rlctl train` shows of each running stage: the latest loss/reward (kept across checkpoint and eval events),
an ETA from the measured step time, held-out scoring as it goes (rows scored, ETA), and - when the console is not
a terminal (a log file, SLURM, CI) - plain lines: one per logged step, and a held-out scoring's progress at most
every `logging.console_every_s` seconds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# when a step logs them: vLLM's weight-sync check, async RL's staleness and the rollout correction's mean IS ratio
MAIN_KEYS = ("loss", "reward", "kl", "sync_logp_diff_mean", "staleness_mean", "is_ratio_mean")


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class RowProgress:
    """Rows of a held-out scoring done so far, with an ETA from the rate measured since it started."""

    what: str
    total: int
    done: int = 0
    started: float = 0.0
    now: float = 0.0

    def advance(self, rows: int, now: float | None = None) -> None:
        self.done = min(self.total, self.done + rows)
        self.now = time.monotonic() if now is None else now

    def eta(self) -> float | None:
        """Seconds left at the rate so far (None before the first batch)."""
        if self.done == 0 or self.now <= self.started:
            return None
        return (self.now - self.started) / self.done * (self.total - self.done)

    def text(self) -> str:
        eta = self.eta()
        return f"{self.what} {self.done}/{self.total} rows  " + (f"ETA {duration(eta)}" if eta is not None else "ETA -")


@dataclass
class StageProgress:
    """One stage's progress as the metrics stream reports it."""

    name: str
    total: int | None = None
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    evals: dict[str, float] = field(default_factory=dict)
    first: tuple[float, int] | None = None  # (time, step) of the first step seen in this session
    last_step_at: float = 0.0
    scoring: RowProgress | None = None  # a held-out scoring under way (base model, checkpoint, final)
    plain: bool = False  # off a terminal: keep a plain line of each logged step for `plain_lines`
    pending: list[str] = field(default_factory=list)
    printed_at: float = 0.0  # when `plain_lines` last gave a line (the CLI's monotonic clock)
    printed_scoring: str = ""

    def update(self, rec: dict[str, Any], now: float | None = None) -> None:
        """Take one metrics.jsonl record; a newly logged step is timed by the record's own clock, so that the
        steps read in one poll keep their own ETAs."""
        now = time.monotonic() if now is None else now
        self.total = rec.get("max_steps") or self.total
        scores = {k: v for k, v in rec.items() if k.startswith("eval_") and k != "eval_rows"}
        self.evals.update({k: v for k, v in scores.items() if isinstance(v, int | float)})
        if rec.get("event") == "scoring":
            self._scoring(rec, now)
        if "step" not in rec or rec.get("event") is not None:
            return
        self.metrics.update({k: rec[k] for k in MAIN_KEYS if isinstance(rec.get(k), int | float)})
        if rec["step"] > self.step:
            self.step = rec["step"]
            self.last_step_at = rec.get("time", now)
            if self.first is None:
                self.first = (self.last_step_at, self.step)
            if self.plain:
                self.pending.append(self.line())

    def _scoring(self, rec: dict[str, Any], now: float) -> None:
        """A held-out scoring's progress record: rows done of rows, timed by the record's own clock."""
        at = rec.get("time", now)
        if rec["done"] == 0 or self.scoring is None:
            self.scoring = RowProgress(f"scoring {rec['scope']}", rec["rows"], 0, at, at)
        self.scoring.advance(rec["done"] - self.scoring.done, at)
        if self.scoring.done >= self.scoring.total:
            self.scoring = None

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at the step time measured so far in this session (None before two steps)."""
        if self.first is None or not self.total or self.step <= self.first[1]:
            return None
        per_step = (self.last_step_at - self.first[0]) / (self.step - self.first[1])
        return max(0.0, per_step * (self.total - self.step))

    def info(self) -> str:
        """The stage's main metrics, then its latest held-out scores."""
        shown = [f"{k.removesuffix('_logp_diff_mean')} {v:.4g}" for k, v in self.metrics.items()]
        shown += [f"{k} {v:.3f}" for k, v in self.evals.items()]
        if self.scoring is not None:
            shown.append(f"[{self.scoring.text()}]")
        return "  ".join(shown)

    def eta_text(self) -> str:
        eta = self.eta()
        return f"ETA {duration(eta)}" if eta is not None else "ETA -"

    def line(self) -> str:
        """The plain line of the latest logged step."""
        return f"{self.name} step {self.step}/{self.total or '?'}  {self.info()}  {self.eta_text()}"

    def plain_lines(self, every_s: float, now: float | None = None) -> list[str]:
        """The lines to print off a terminal now: each step logged since the last call, in step order; else a
        held-out scoring's progress, when it moved and `every_s` have passed since the stage's last line."""
        now = time.monotonic() if now is None else now
        lines, self.pending = self.pending, []
        if lines:
            self.printed_at = now
        scoring = f"{self.name} {self.scoring.text()}" if self.scoring is not None else ""
        if scoring and scoring != self.printed_scoring and now - self.printed_at >= every_s:
            lines, self.printed_scoring, self.printed_at = [scoring], scoring, now
        return lines


def dropped_line(rec: dict[str, Any]) -> str:
    """The console line of a stage's `data` event: rows dropped as too long."""
    dropped, kept = rec["dropped_too_long"], rec["kept"]
    share = dropped / max(1, dropped + kept)
    return (
        f"{rec.get('stage', '?')}: {dropped} of {dropped + kept} rows ({share:.1%}) are longer than {rec['limit']} "
        "tokens and were left out (data.over_length=drop)"
    )
