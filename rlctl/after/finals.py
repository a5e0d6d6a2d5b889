"""A finished stage whose final folder is gone (deleted, moved) gets it back on `rlctl resume`: copied from the stage's
newest intact checkpoint when that is a model folder (TRL's stages) holding the stage's last step, else by reopening
the stage, which resumes from that checkpoint (rlctl's RL loop at its last step trains nothing and saves the final
folder from it)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlctl import rundir
from rlctl.after import export
from rlctl.checkpoint import verify
from rlctl.config import RunConfig
from rlctl.errors import UserError
from rlctl.launch import resume_check
from rlctl.plan import resolved


def restore_finals(run_dir: Path, cfg: RunConfig) -> list[str]:
    """Finished stages whose final folder is gone get it back: copied (LoRA merged) from the stage's newest intact
    checkpoint when that holds its last step, else the stage is marked unfinished in summary.json, so the resume
    trains it from that checkpoint (or its start) to its end. One line per stage saying which."""
    summary = resume_check.read_summary(run_dir, cfg)
    gone = [s for s in cfg.stages if s in summary.completed and not rundir.RunDir(run_dir).final(s).is_dir()]
    ends = {s.name: s.max_steps for s in resolved.read(run_dir).stages} if gone else {}
    notes = [_restore_final(run_dir, cfg, stage, ends[stage], summary) for stage in gone]
    if gone:
        rundir.write_summary(run_dir, summary)
    return notes


def _restore_final(run_dir: Path, cfg: RunConfig, stage: str, end: int, summary: rundir.Summary) -> str:
    """Re-create `stage`'s final folder from its checkpoint of step `end`, or reopen the stage in `summary`."""
    final = rundir.RunDir(run_dir).final(stage)
    ckpt = verify.choose(stage, rundir.RunDir(run_dir).checkpoints(stage)).intact
    loadable = ckpt is not None and (ckpt / "config.json").is_file()  # a TRL stage's; rlctl's RL loop keeps state
    if loadable and (rundir.checkpoint_step(ckpt) or 0) >= end:
        if stage == "rm" and not export.copyable(ckpt):  # a reward model's LoRA is not merged as a policy's is
            raise UserError(
                f"{final} is gone and the rm stage's last checkpoint, {ckpt}, holds a LoRA "
                "adapter that rlctl merges only into a policy: restore the folder from a copy, or start a new run."
            )
        tmp = rundir.final_staging(final)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        export._write(tmp, cfg, ckpt, None)  # as an export makes it: the weights copied, or LoRA merged
        tmp.rename(final)
        return f"stage {stage}: its final folder was gone; re-created from {ckpt.name}, the stage's last step."
    summary.completed.remove(stage)
    start = f"{ckpt.name}, its newest intact checkpoint" if ckpt else "its start (no intact checkpoint is left)"
    return f"stage {stage}: its final folder was gone; the stage trains again from {start} to re-create it."
