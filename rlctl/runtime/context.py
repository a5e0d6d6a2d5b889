"""What every stage runs with beside its models and rows: the metrics log, the stop flag, the ways a stage stops (a
signal, an alarm, agreed over every process; a non-finite value, a broken weight sync), the checkpoint it resumes
from and what its training hands the final save. The stage's context itself (`rlctl.stages.context`) lives with the
stages: nothing below them takes it. Imported by every stage, the trainer and the monitors; imports none of them."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl import checkpoint, strictjson
from rlctl.rundir import RunDir


class MetricsLog:
    """Appends one strict-JSON record per line to run_dir/metrics.jsonl (main process only; NaN/inf as null, see
    rlctl.strictjson), followed by the alarms the record completes (`watch`, an `rlctl.monitors.alarms.Watch`
    the runner hands in), which are also printed. Each record also goes to `to_trackers` (the experiment trackers
    of logging.report_to: rlctl.launch.trackers.Fanout.add)."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        watch: Any = None,
        to_trackers: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.path = RunDir(run_dir).metrics
        self.enabled = enabled
        self.watch = watch
        self.to_trackers = to_trackers

    def write(self, **record: Any) -> None:
        if not self.enabled:
            return
        record["time"] = round(time.time(), 3)
        fired = self.watch.feed(record) if self.watch is not None else []
        with self.path.open("a") as f:
            for rec in (record, *fired):
                f.write(strictjson.dumps({**rec, "time": record["time"]}) + "\n")
        for alarm in fired:
            print(f"rlctl alarm ({alarm['stage']}, step {alarm['step']}): {alarm['message']}", file=sys.stderr)
        if self.to_trackers is not None:
            for rec in (record, *fired):
                self.to_trackers({**rec, "time": record["time"]})


@dataclass
class StopFlag:
    """The stop signal this process received (0: none): set by the runner's SIGINT/SIGTERM handler, agreed across
    processes at step boundaries (`stop_signal`)."""

    signal: int = 0


@dataclass
class Stops:
    """The errors that end a stage (`stage`, of the run in `run_dir`), each naming its last good checkpoint (in
    `checkpoints`) and what to do; `log` holds the alarms' watch, `sync_tolerance` is rl.mismatch.sync_tolerance."""

    stage: str
    run_dir: Path
    checkpoints: Path
    log: MetricsLog
    sync_tolerance: float

    def alarm_stopped(self, step: int) -> Stopped:
        """The error that ends the stage when an alarm asked to stop (logging.alarms: stop)."""
        watch = self.log.watch
        why = watch.stop if watch is not None and watch.stop else "an alarm on the main process."
        last = checkpoint.last_complete(self.checkpoints)
        return Stopped(
            f"Stage {self.stage} stopped at step {step} by an alarm (logging.alarms: stop): {why} The last good "
            f"checkpoint is {last or 'none'}. To train on regardless: "
            f"`rlctl resume {self.run_dir} --set logging.alarms=warn`."
        )

    def non_finite_stopped(self, key: str, value: float, step: int) -> NonFiniteError:
        """The error that ends the stage when `key` (a loss, reward or grad norm) became NaN/inf at `step`; that
        state is not saved."""
        last = checkpoint.last_complete(self.checkpoints)
        name = self.stage
        return NonFiniteError(
            f"Stage {name} stopped: {key} became {value} at step {step}. The last good checkpoint is "
            f"{last or 'none (the stage restarts from its start)'}. Lower {name}.learning_rate or "
            f"check the rewards and data, then `rlctl resume {self.run_dir}`."
        )

    def check_sync(self, step: int, gap: float, worst: float, on: str = "its sampled tokens") -> None:
        """The weight-sync check's verdict, before the step trains: when the mean |log-prob difference| between
        the trainer and vLLM (`on` what; `worst`: its max) is beyond rl.mismatch.sync_tolerance (0: off), vLLM
        generated with weights other than the policy's and the stage stops."""
        if not (self.sync_tolerance and gap > self.sync_tolerance):
            return
        last = checkpoint.last_complete(self.checkpoints)
        raise SyncMismatch(
            f"Stage {self.stage} stopped at step {step}: vLLM generated with weights other than the policy's "
            f"(mean |log-prob difference| on {on} {gap:.4f}, max {worst:.4f}; rl.mismatch.sync_tolerance "
            f"{self.sync_tolerance}). Likely causes: LoRA adapters pushed unmerged, a tied embedding / "
            "LM head not refreshed, a stale engine after wake-up (weights not reloaded), or a parameter pushed under "
            f"the wrong name. Nothing of this step was trained; the last good checkpoint is {last or 'none'}. Report "
            "it with logs/train.log; to run anyway, resume with --set rl.use_vllm=false."
        )

    def push_stopped(self, step: int, version: int) -> SyncMismatch:
        """The error that ends an async stage when the generator sampled with weights other than those pushed as
        `version` (their per-tensor sums differ)."""
        last = checkpoint.last_complete(self.checkpoints)
        return SyncMismatch(
            f"Stage {self.stage} stopped at step {step}: the async generator sampled with weights other than "
            f"the policy version {version} the trainer pushed (their per-tensor sums differ). Likely causes: a "
            "parameter pushed under the wrong name, or a tied embedding / LM head not refreshed. Nothing of this "
            f"step was trained; the last good checkpoint is {last or 'none'}. Report it with logs/train.log; to run "
            "anyway, resume with --set rl.async_rollout.enabled=false."
        )


def install_stop_handlers() -> StopFlag:
    """First SIGINT/SIGTERM: stop at the next step boundary with a checkpoint. A second one: stop at once.
    Returns the flag the handlers set, for every stage's context."""
    stop = StopFlag()

    def handler(signum, frame) -> None:
        if stop.signal:
            os._exit(128 + signum)
        stop.signal = signum

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def over_ranks(value: int, op: str = "sum") -> int:
    """`value` summed (or its max) over every process; itself when not distributed. All processes call it."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    total = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return int(total.item())


def alarm_stop(log: MetricsLog) -> bool:
    """Whether an alarm asked to stop (logging.alarms: stop), agreed by every process (all call it at the same
    point; alarms are computed on the main process, which writes the metrics)."""
    watch = log.watch
    return bool(over_ranks(int(watch is not None and watch.stop is not None), op="max"))


def stop_signal(stop: StopFlag) -> int:
    """The stop signal any rank received (0 for none), agreed across processes so all stop at the same step."""
    stop.signal = over_ranks(stop.signal, op="max")
    return stop.signal


def signalled(stop: StopFlag) -> Interrupted | None:
    """The stop a signal asked for, if one did."""
    return Interrupted(stop.signal) if stop.signal else None


def resume_point(checkpoints: Path, is_main: bool) -> str | None:
    """The last complete checkpoint of a stage in `checkpoints` (partial ones from a crash are removed first, by
    the main process; `rlctl resume` has set damaged ones aside, see rlctl.checkpoint.verify)."""
    if is_main:
        checkpoint.drop_partial(checkpoints)
    last = checkpoint.last_complete(checkpoints)
    return str(last) if last else None


class Interrupted(Exception):
    """A stop was asked for (SIGINT/SIGTERM); the stage saved a checkpoint at a step boundary."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.exit_code = 128 + signum


class Stopped(RuntimeError):
    """A stage stopped itself; its message says why and what to do (the run exits 1)."""


class NonFiniteError(Stopped):
    """A loss or reward became NaN/inf; the stage stopped without saving that state."""


class SyncMismatch(Stopped):
    """vLLM generated with weights other than the policy's."""


@dataclass
class Trained:
    """What a stage's training hands its final save (`rlctl.stages.common.save_final`), from TRL's trainers and
    rlctl's RL loop alike: the accelerator, the trained model as trained (wrapped or not), its tokenizer, and why
    training ended early (None: it ran to the end), which the final save raises instead of saving."""

    accelerator: Any
    model: Any
    tokenizer: Any
    stopped: Exception | None = None
