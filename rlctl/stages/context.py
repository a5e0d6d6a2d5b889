"""What a stage runs with: its context (config, plan, run directory, metrics log), the clock of a step's phases,
and the ways a stage stops.
Imported by every stage module; imports nothing of the stages."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.config import RunConfig
from rlctl.plan import Plan, StagePlan, final_dir, stage_dir


class MetricsLog:
    """Appends one JSON record per line to run_dir/metrics.jsonl (main process only)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled

    def write(self, **record: Any) -> None:
        if not self.enabled:
            return
        record["time"] = round(time.time(), 3)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


@dataclass
class StageContext:
    cfg: RunConfig
    plan: Plan
    stage: StagePlan
    run_dir: Path
    data: dict[str, Path]
    log: MetricsLog
    is_main: bool
    device: Any = "cpu"
    notes: dict[str, Any] = field(default_factory=dict)  # data facts for summary.json (rows dropped as too long)

    @property
    def settings(self):
        """This stage's section of the config (cfg.sft, cfg.rm or cfg.rl)."""
        return getattr(self.cfg, self.stage.name)

    @property
    def checkpoints(self) -> Path:
        return stage_dir(self.run_dir, self.stage.name) / "checkpoints"

    @property
    def final(self) -> Path:
        return final_dir(self.run_dir, self.stage.name)


class Interrupted(Exception):
    """A stop was asked for (SIGINT/SIGTERM); the stage saved a checkpoint at a step boundary."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.exit_code = 128 + signum


class Stopped(RuntimeError):
    """A stage stopped itself; its message says why and what to do (the run exits 1)."""


class NonFiniteError(Stopped):
    """A loss or reward became NaN/inf; the stage stopped without saving that state."""


class PhaseClock:
    """Seconds each phase of a step took (sync, generate, score, prepare, update), logged as `time_<phase>`.
    On a GPU it waits for the queued kernels at each boundary, so work is charged to the phase that launched it."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.start()

    def start(self) -> None:
        self.spent, self.mark = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        now = time.perf_counter()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.mark
        self.mark = now

    def times(self) -> dict[str, float]:
        return {f"time_{phase}": round(seconds, 4) for phase, seconds in self.spent.items()}
