"""The RL loop's checkpoints: models, optimizers, schedulers and every process's RNG through accelerate (sharded
models and their optimizers through DCP), plus the loop's own state (step, prompt cursor, KL coefficient, world
size) in `rlctl_loop.json`."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl import checkpoint
from rlctl.monitors import heldout
from rlctl.runtime.context import StageContext, resume_point
from rlctl.stages import sharding

LOOP_STATE = "rlctl_loop.json"


def load(ctx: StageContext, acc, shards: dict) -> dict | None:
    """Restore the last complete checkpoint into the prepared objects; its loop state, or None to start anew."""
    last = resume_point(ctx)
    if not last:
        return None
    acc.load_state(last)
    if shards:
        sharding.load(Path(last), shards)  # resharded when the process count changed
    return json.loads((Path(last) / LOOP_STATE).read_text())


def save(ctx: StageContext, acc, step: int, state: dict, policy, tokenizer, shards: dict) -> None:
    """Models, optimizers, schedulers and every process's RNG (accelerate; sharded models and their optimizers
    through DCP, one file per process), plus the loop state, written under `.incoming` and published (scored for
    keep-best, marked complete, renamed into place) once all is written."""
    folder = checkpoint.incoming(ctx.checkpoints) / f"checkpoint-{step}"
    acc.wait_for_everyone()
    acc.save_state(str(folder))
    if shards:
        sharding.save(folder, shards)
    if acc.is_main_process:
        checkpoint.write_json_atomic(folder / LOOP_STATE, state)
    heldout.publish_checkpoint(ctx, step, acc.unwrap_model(policy), tokenizer)
