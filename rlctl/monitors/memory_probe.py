"""Measured memory of every run, per stage and phase, beside the plan's prediction for the same phase.

Each training process measures, for every phase interval of its stage, the peak of

* `torch.cuda.max_memory_reserved()` and `max_memory_allocated()` (reset at each phase boundary);
* the device memory in use as nvidia-smi reports it (NVML through `torch.cuda.device_memory_used` when pynvml is
  installed, else the driver's `cudaMemGetInfo`), sampled every `SAMPLE_SECONDS` by a background thread: it
  holds what the torch allocator does not see (the CUDA context, vLLM's pool, NCCL);
* the process's resident set (`VmHWM` of /proc/self/status, reset at each boundary by writing 5 to
  /proc/self/clear_refs; where the kernel refuses that, `VmRSS` sampled by the thread). On CPU it is the measure.

A phase ends where the code says which phase the interval was (`lap`): the RL loop's `PhaseClock` laps
(sync, generate, score -> generation; prepare, update -> training; value_pretrain -> value pretraining) and its
optimizer steps; the TRL trainers through `TrainerPhases` (`on_pre_optimizer_step` / `on_optimizer_step`,
installed with the stage's monitors, `rlctl.monitors.trl_callbacks`); every checkpoint (`checkpoint`: save and held-out
scoring); the runner's final save and evaluation (`evaluation`).

Where it goes: a `{"event": "memory"}` record in metrics.jsonl at each logged step (peaks since the last record),
`STAGE/memory/rankN.json` (the stage's peaks so far, per process), summary.json's `memory` section (`summary`:
`measured_*` beside `planned_*` per stage and phase, the maximum over processes), `rlctl report`, and the
out-of-memory message (`so_far`).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.rundir import MeasuredPhase, MemoryRecord, RunDir, StageMemory, every_rank, read_record, write_record

if TYPE_CHECKING:
    from rlctl.plan.parts import MemoryTable, PhaseMemory

GiB = float(2**30)
SAMPLE_SECONDS = 0.05
# the RL loop's PhaseClock laps, by memory phase
LOOP_PHASES = {
    "sync": "generation",
    "generate": "generation",
    "score": "generation",
    "prepare": "training",
    "update": "training",
    "value_pretrain": "value pretraining",  # VAPO: the critic's updates before the policy moves
}
UNPLANNED = ("checkpoint", "evaluation")  # measured phases the plan does not model
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def status_kib(field: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/self/status in KiB (0 where there is no /proc)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_hwm() -> bool:
    """Reset the kernel's peak resident set (VmHWM) to the current one, after giving the C heap's freed memory back
    to the system (glibc's `malloc_trim`: else the resident set never shrinks and a phase after training would
    measure what training freed); False where the reset is not allowed."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class Sampler:
    """The running maximum of `read()` (bytes), sampled every `interval` seconds in a daemon thread."""

    def __init__(self, read: Callable[[], int], interval: float = SAMPLE_SECONDS):
        self.read, self.interval = read, interval
        self.lock, self.stop_event = threading.Lock(), threading.Event()
        self.high = read()
        self.thread = threading.Thread(target=self._run, name="rlctl-memory-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval):
            value = self.read()
            with self.lock:
                self.high = max(self.high, value)

    def take(self) -> int:
        """The peak since the last `take`, which restarts from the current value."""
        now = self.read()
        with self.lock:
            peak, self.high = max(self.high, now), now
        return peak

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()


def _device_used(device: Any) -> tuple[Callable[[], int], str]:
    """A reader of the device memory in use on `device`, and its source."""
    import torch

    try:
        torch.cuda.device_memory_used(device)
        return (lambda: torch.cuda.device_memory_used(device)), "nvml"
    except Exception:  # pynvml (nvidia-ml-py) absent, or NVML unavailable: the driver's view instead
        return (lambda: _mem_get_info_used(device)), "cudaMemGetInfo"


def _mem_get_info_used(device: Any) -> int:
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return total - free


class Probe:
    """The memory measurements of one stage in one process."""

    def __init__(self, stage: str, file: Path, device: Any = "cpu", log: Any = None):
        self.stage, self.file, self.log = stage, file, log
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.device = device
        self.since_flush: dict[str, dict[str, float]] = {}
        self.phases: dict[str, dict[str, float]] = {}
        self.hwm = reset_hwm()
        self.rss = None if self.hwm else Sampler(lambda: status_kib("VmRSS") * 1024)
        self.used, self.source = None, "rss"
        if self.cuda:
            import torch

            read, self.source = _device_used(device)
            self.used = Sampler(read)
            torch.cuda.reset_peak_memory_stats(device)
        file.parent.mkdir(parents=True, exist_ok=True)

    def current(self, reset: bool) -> dict[str, float]:
        """Peaks (bytes) of the open interval; `reset` starts the next one."""
        out: dict[str, float] = {}
        if self.cuda:
            import torch

            out["reserved"] = torch.cuda.max_memory_reserved(self.device)
            out["allocated"] = torch.cuda.max_memory_allocated(self.device)
            out["device_used"] = self.used.take() if reset else max(self.used.high, self.used.read())
            if reset:
                torch.cuda.reset_peak_memory_stats(self.device)
        if self.rss is not None:
            out["rss"] = self.rss.take() if reset else max(self.rss.high, self.rss.read())
        else:
            out["rss"] = status_kib("VmHWM") * 1024
            if reset:
                reset_hwm()
        return out

    def lap(self, phase: str) -> None:
        """The interval since the last lap was `phase` (a lap of the RL loop's `PhaseClock`: the memory phase it
        belongs to, `LOOP_PHASES`): keep its peaks (maximum with earlier intervals)."""
        phase = LOOP_PHASES.get(phase, phase)
        peaks = self.current(reset=True)
        for table in (self.since_flush, self.phases):
            old = table.setdefault(phase, {})
            for key, value in peaks.items():
                old[key] = max(old.get(key, 0), value)

    def record(self) -> MemoryRecord:
        return MemoryRecord("gpu" if self.cuda else "cpu", self.source, _gib(self.phases))

    def flush(self, step: int) -> None:
        """A metrics.jsonl record of the peaks since the last one, and this process's stage record on disk."""
        if self.since_flush and self.log is not None:
            self.log.write(stage=self.stage, event="memory", step=step, phases=_gib(self.since_flush))
        self.since_flush = {}
        write_record(self.file, self.record())

    def close(self) -> None:
        write_record(self.file, self.record())
        for sampler in (self.used, self.rss):
            if sampler is not None:
                sampler.stop()


def _gib(phases: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {p: {f"{k}_gib": round(v / GiB, 3) for k, v in m.items()} for p, m in phases.items()}


# --- The stage's probe: started by the runner, its phases marked by the stage's monitors ------------------------


def start(stage: str, run_dir: Path, device: Any = "cpu", log: Any = None) -> Probe:
    """Start measuring `stage` in this process (the runner, before the stage runs); `log`: the run's metrics log."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return Probe(stage, RunDir(run_dir).memory(stage, rank), device, log)


# --- Beside the plan ----------------------------------------------------------------------------------------------


def planned_phase(plan_memory: MemoryTable | None, stage: str, phase: str) -> PhaseMemory | None:
    """The plan's phase that predicts a measured one: the same name, or for the optimizer step of a plan written
    before it was planned apart (a resumed older run), the training phase it belongs to."""
    if plan_memory is None or phase in UNPLANNED:
        return None
    phases = {p.phase: p for p in plan_memory.stage_phases(stage)}
    return phases.get(phase) or (phases.get("training") if phase == "optimizer step" else None)


def headline(measured: dict[str, float]) -> float | None:
    """The measured number that the plan's peak predicts: device memory in use on a GPU, else the resident set."""
    for key in ("device_used_gib", "reserved_gib", "rss_gib"):
        if measured.get(key):
            return measured[key]
    return None


def _error(planned: float | None, measured: float | None) -> float | None:
    return round((planned - measured) / measured * 100, 1) if planned is not None and measured else None


def summary(run_dir: Path, stage: str, plan_memory: MemoryTable | None) -> StageMemory | None:
    """The measured peaks (the maximum over processes) beside the plan's for each phase of `stage`, and the stage's
    peak against the plan's; None when no process recorded any."""
    records = [read_record(f, MemoryRecord.from_json) for f in every_rank(RunDir(run_dir).memory(stage))]
    if not records:
        return None
    merged: dict[str, dict[str, float]] = {}
    for rec in records:
        for phase, values in rec.phases.items():
            into = merged.setdefault(phase, {})
            for key, value in values.items():
                into[key] = max(into.get(key, 0), value)
    phases: dict[str, MeasuredPhase] = {}
    for phase, values in merged.items():
        plan_side = planned_phase(plan_memory, stage, phase)
        row = MeasuredPhase(values, headline(values))
        if plan_side:
            row.planned_peak_gib, row.planned_phase = plan_side.peak_gib, plan_side.label
        row.error_pct = _error(row.planned_peak_gib, row.peak_gib)
        phases[phase] = row
    planned = plan_memory.stage_phases(stage) if plan_memory is not None else []
    trained = {p: r.peak_gib for p, r in phases.items() if p not in UNPLANNED and r.peak_gib is not None}
    top = max(trained, key=lambda p: trained[p], default=None)
    plan_top = max(planned, key=lambda p: p.peak_gib, default=None)
    out = StageMemory(records[0].device, records[0].source, len(records), phases)
    out.measured_peak_gib, out.measured_peak_phase = (trained[top], top) if top else (None, None)
    if plan_top:
        out.planned_peak_gib, out.planned_peak_phase = plan_top.peak_gib, plan_top.phase
    out.error_pct = _error(out.planned_peak_gib, out.measured_peak_gib)
    return out


def so_far(probe: Probe | None, stage: str, plan_memory: MemoryTable | None) -> str:
    """The out-of-memory message's measured part: this process's peak per finished phase interval of `stage`
    (beside the plan's) and of the interval that failed; empty when nothing was measured (`probe` None, or
    measuring another stage)."""
    if probe is None or probe.stage != stage:
        return ""
    parts = []
    for phase, values in _gib(probe.phases).items():
        plan_side = planned_phase(plan_memory, stage, phase)
        planned = f", planned {plan_side.peak_gib}" if plan_side else ""
        parts.append(f"{stage}/{phase} {headline(values)} GiB{planned}")
    failing = headline(_gib({"now": probe.current(reset=False)})["now"])
    parts.append(f"{failing} GiB in the phase that failed")
    unit = "device memory in use" if probe.cuda else "resident set"
    return f"; measured peaks of this process ({unit}): " + ", ".join(parts)
