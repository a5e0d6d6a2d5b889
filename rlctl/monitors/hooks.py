"""A stage's monitors as one object whose methods are its trainer's hooks: rlctl's RL loop calls them at its phase
boundaries, after each step's record, with each checkpoint, at its first step and at its end; a TRL trainer reaches
them through callbacks (`rlctl.monitors.trl_callbacks.follow`, and the TRL stages' own callback publishes each
checkpoint).

The stage builds its `Monitors` from narrow values (the memory probe the runner started, what scores the stage on
held-out data, what the plan promises it, where its checkpoints go and how many are kept); none of them is the
stage's context."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl import checkpoint
from rlctl.config.sections import CheckpointConfig
from rlctl.monitors import layout
from rlctl.monitors.heldout import HeldOut
from rlctl.monitors.memory_probe import Probe

if TYPE_CHECKING:
    from rlctl.monitors.layout import Beside


@dataclass(frozen=True)
class Monitors:
    """What watches one stage: the memory probe measuring it (`probe`, None when nothing is measured), what scores
    its models on held-out data (`held_out`), what the plan promises its layout (`contract`), and its checkpoints
    folder with how many are kept (`keeping`: checkpoint.keep_last and keep_best)."""

    contract: layout.Contract
    held_out: HeldOut
    checkpoints: Path
    keeping: CheckpointConfig
    probe: Probe | None = None

    def lap(self, phase: str) -> None:
        """The interval since the last lap was `phase` (a no-op when nothing is measured)."""
        if self.probe is not None:
            self.probe.lap(phase)

    def flush(self, step: int) -> None:
        """After step `step`'s record: the memory peaks since the last one."""
        if self.probe is not None:
            self.probe.flush(step)

    def publish(self, step: int, model: Any, tokenizer: Any) -> None:
        """Once every process has written `.incoming/checkpoint-STEP`: score the model on held-out data (when
        `checkpoint.keep_best`), log the score, mark the checkpoint complete and rename it into place (main process).
        Called at each save by the TRL stages' callback and by the rlctl RL loop."""
        _barrier()
        held = self.held_out
        keep_best = self.keeping.keep_best and held.can_score
        sharded = self.contract.stage.strategy == "fsdp2"  # every rank holds a shard: all must take part in generation
        value = None
        if keep_best and (held.is_main or sharded):
            scores = held.score(model, tokenizer, synced=sharded, scope="checkpoint")
            value = scores[checkpoint.METRIC]
            held.log.write(stage=held.stage, step=step, event="checkpoint", **scores)
        if held.is_main:
            checkpoint.publish(self.checkpoints, step, value, self.keeping.keep_last, keep_best)
        _barrier()
        self.lap("checkpoint")  # the save and its held-out scoring

    def check_layout(
        self, model: Any, optimizer: Any, engine: str | None, beside: Beside, switches: dict | None = None
    ) -> None:
        """At the first step: record this process's layout, and stop the stage when it contradicts the plan."""
        layout.check(self.contract, model, optimizer, engine, beside, switches)

    def finish_layout(self, switches: dict | None) -> None:
        """When the stage ends: its layout record gets the optimizer offload's switches over the whole stage."""
        layout.finish(self.contract, switches)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
