"""The RL loop's checkpoints: models, optimizers, schedulers and every process's RNG through accelerate, models
sharded by rlctl (`rlctl.trainer.sharding`) and their optimizers through torch distributed checkpoint (DCP: one
file per process, `sharded/__R_0.distcp`, plus `.metadata`; a load reshards when the process count changed), plus
the loop's own state (step, prompt cursor, KL coefficient, world size) in `rlctl_loop.json`. Each save is
published by the checkpoint protocol of `rlctl.checkpoint` once every process wrote it, scored on held-out data
first when checkpoint.keep_best."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl import checkpoint
from rlctl.monitors import heldout
from rlctl.runtime.context import StageContext, resume_point

LOOP_STATE = "rlctl_loop.json"
SHARDS = "sharded"  # a checkpoint's DCP folder: one __R_0.distcp per process and .metadata


def load(ctx: StageContext, acc, shards: dict) -> dict | None:
    """Restore the last complete checkpoint into the prepared objects; its loop state, or None to start anew."""
    last = resume_point(ctx)
    if not last:
        return None
    acc.load_state(last)
    if shards:
        load_shards(Path(last), shards)  # resharded when the process count changed
    return json.loads((Path(last) / LOOP_STATE).read_text())


def save(ctx: StageContext, acc, step: int, state: dict, policy, tokenizer, shards: dict) -> None:
    """Models, optimizers, schedulers and every process's RNG (accelerate; sharded models and their optimizers
    through DCP, one file per process), plus the loop state, written under `.incoming` and published (scored for
    keep-best, marked complete, renamed into place) once all is written."""
    folder = checkpoint.incoming(ctx.checkpoints) / f"checkpoint-{step}"
    acc.wait_for_everyone()
    acc.save_state(str(folder))
    if shards:
        save_shards(folder, shards)
    if acc.is_main_process:
        checkpoint.write_json_atomic(folder / LOOP_STATE, state)
    heldout.publish_checkpoint(ctx, step, acc.unwrap_model(policy), tokenizer)


def _states(parts: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """The sharded state dicts of each (model, optimizer) pair, keyed `NAME` and `NAME_optim`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state: dict[str, Any] = {}
    for name, (model, optimizer) in parts.items():
        state[name], state[f"{name}_optim"] = get_state_dict(model, optimizer)
    return state


def save_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Write each (model, optimizer) of `parts` into `folder/sharded` with DCP; every process writes its shard."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(parts), checkpoint_id=str(folder / SHARDS))


def load_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Read `folder/sharded` into each (model, optimizer) of `parts`, resharded for this process count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _states(parts)
    dcp.load(state, checkpoint_id=str(folder / SHARDS))
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])
