"""What `rlctl train` shows of each running stage: the latest loss/reward (kept across checkpoint and eval events),
an ETA from the measured step time, and - when the console is not a terminal (a log file, SLURM, CI) - one plain
line per stage every `logging.console_every_s` seconds, flushed at once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

MAIN_KEYS = ("loss", "reward", "kl", "sync_logp_diff_mean")  # the last: vLLM's weight-sync check, when it runs


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


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
    printed_at: float = 0.0
    printed_step: int = 0

    def update(self, rec: dict[str, Any], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.total = rec.get("max_steps") or self.total
        self.evals.update({k: v for k, v in rec.items() if k.startswith("eval_") and isinstance(v, int | float)})
        if "step" in rec and rec.get("event") is None:
            self.metrics.update({k: rec[k] for k in MAIN_KEYS if isinstance(rec.get(k), int | float)})
            if rec["step"] > self.step:
                self.step = rec["step"]
                self.last_step_at = now
                if self.first is None:
                    self.first = (now, self.step)

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
        return "  ".join(shown)

    def eta_text(self) -> str:
        eta = self.eta()
        return f"ETA {duration(eta)}" if eta is not None else "ETA -"

    def line(self) -> str:
        """The plain progress line printed off a terminal."""
        total = self.total or "?"
        return f"{self.name} step {self.step}/{total}  {self.info()}  {self.eta_text()}".rstrip()

    def due(self, every_s: float, now: float | None = None) -> bool:
        """Whether the plain line is due (and mark it printed)."""
        now = time.monotonic() if now is None else now
        if self.step == 0 or now - self.printed_at < every_s:
            return False
        self.printed_at, self.printed_step = now, self.step
        return True


def dropped_line(rec: dict[str, Any]) -> str:
    """The console line of a stage's `data` event: rows dropped as too long."""
    dropped, kept = rec["dropped_too_long"], rec["kept"]
    share = dropped / max(1, dropped + kept)
    return (
        f"{rec.get('stage', '?')}: {dropped} of {dropped + kept} rows ({share:.1%}) are longer than {rec['limit']} "
        "tokens and were left out (data.over_length=drop)"
    )
