"""What `rlctl resume` checks before it continues a run: a finished run is reported as such (nothing launched), and
the RESUMABLE keys whose safety depends on the run are checked against it (config.RESUMABLE lists them all)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl import rundir, strictjson
from rlctl.config import ModelConfig, RunConfig
from rlctl.config.sections import BUILTIN_MODELS as BUILTIN
from rlctl.errors import UserError
from rlctl.plan import resolved


def read_summary(run_dir: Path, cfg: RunConfig) -> rundir.Summary:
    """The run's summary.json (a new one when there is none); DamagedFile when it cannot be read."""
    new = rundir.Summary(run=cfg.name, model=cfg.model.name_or_path)
    return rundir.read_summary(run_dir, rundir.REPAIR.format(run_dir=run_dir), missing=new)


def rebuild_summary(run_dir: Path, cfg: RunConfig) -> tuple[rundir.Summary, str]:
    """summary.json rebuilt from metrics.jsonl (each stage's held-out `eval` record, `end` marking it completed),
    the damaged file kept as summary.json.damaged; returns it and a line saying so."""
    summary = rundir.Summary(run=cfg.name, model=cfg.model.name_or_path)
    path = rundir.RunDir(run_dir).metrics
    lines = strictjson.lines(path, "summary.json cannot be rebuilt from it: restore either from a copy.")
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or rec.get("stage") not in ("base", *cfg.stages):
            continue
        stage = rec["stage"]
        if rec.get("event") == "eval":
            summary.stages[stage] = rundir.StageSummary(
                {k: v for k, v in rec.items() if k not in ("stage", "event", "time")}
            )
        elif rec.get("event") == "end" and stage not in summary.completed:
            summary.completed.append(stage)
    damaged = rundir.RunDir(run_dir).summary
    aside = rundir.set_aside(damaged)
    os.replace(damaged, aside)
    rundir.write_summary(run_dir, summary)
    done = ", ".join(summary.completed) or "none"
    return summary, f"rebuilt from metrics.jsonl (completed: {done}); the damaged copy is kept as {aside.name}"


def finished(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether every stage of the run is recorded as completed in its summary.json."""
    return read_summary(run_dir, cfg).finished(cfg.stages)


def _last_step(run_dir: Path, stage: str) -> int:
    from rlctl import checkpoint

    last = checkpoint.last_complete(rundir.RunDir(run_dir).checkpoints(stage))
    return int(last.name.rsplit("-", 1)[1]) if last else 0


def _same_rewards(old: RunConfig, new: RunConfig) -> None:
    before = [(r.name, r.weight) for r in old.rl.rewards]
    after = [(r.name, r.weight) for r in new.rl.rewards]
    if before != after:
        raise UserError(
            "--set rl.rewards on resume may change only each reward's on_error, timeout_s and correctness: the run's "
            f"rewards are {before}, the new list {after}. Start a new run to change the rewards or their weights."
        )


def _arch_of(model: ModelConfig) -> dict | None:
    """The architecture numbers of `model` (folder, cached Hub id, or GGUF file's header), None without one."""
    from rlctl.plan import arch as model_arch
    from rlctl.plan import gguf

    if gguf.is_gguf(model):
        try:
            return gguf.header(gguf.locate(model)).arch.model_dump()
        except UserError:
            return None
    path, _ = model_arch.locate(model.name_or_path)
    if path is None:
        return None
    return model_arch.arch_from_config(json.loads(path.read_text(encoding="utf-8")), str(path)).model_dump()


def _same_weights(old: RunConfig, new: RunConfig, run_dir: Path) -> None:
    """model.name_or_path may point elsewhere on resume only at the same model (moved, or its Hub id): the same
    architecture as the old path's, or as the plan.json the run started with when the old path is gone."""
    name = new.model.name_or_path
    if {old.model.name_or_path, name} & set(BUILTIN):
        raise UserError(
            f"model.name_or_path cannot change on resume for {old.model.name_or_path} (its weights live in the run)."
        )
    after = _arch_of(new.model)
    if after is None:
        raise UserError(
            f"--set model.name_or_path={name}: no config.json there (not a model folder, nor a Hub id in the local "
            "cache, nor a readable GGUF file), so rlctl cannot check that it is the run's model."
        )
    before = _arch_of(old.model)
    if before is None and rundir.RunDir(run_dir).plan.is_file():
        works = "Resume without --set model.name_or_path, or restore plan.json from a copy."
        planned = resolved.read(run_dir, works).model.arch
        before = planned.model_dump() if planned is not None else None
    if before is not None and before != after:
        differ = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in after.items() if before.get(k) != v)
        raise UserError(
            f"--set model.name_or_path={name} is another model than the run's ({differ}); resume continues the "
            "same weights only (a moved folder, or its Hub id). Start a new run for another model."
        )


def check(old: RunConfig, new: RunConfig, run_dir: Path) -> None:
    """Refuse a resume override that would not continue the same training (a UserError saying why)."""
    if new.model.name_or_path != old.model.name_or_path:
        _same_weights(old, new, run_dir)
    if [r.model_dump() for r in new.rl.rewards] != [r.model_dump() for r in old.rl.rewards]:
        _same_rewards(old, new)
    for stage in new.stages:
        steps, done = getattr(new, stage).max_steps, _last_step(run_dir, stage)
        done -= new.rl.critic.pretrain_steps if stage == "rl" else 0  # rl: its value pretraining ran before max_steps
        if steps != getattr(old, stage).max_steps and steps < done:
            raise UserError(
                f"--set {stage}.max_steps={steps} is below the {done} steps stage {stage} has already checkpointed; "
                f"give at least {done}."
            )
