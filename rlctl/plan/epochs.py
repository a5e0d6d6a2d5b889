"""Stage lengths given in epochs (`STAGE.epochs`), turned into optimizer steps from the rows the plan counts.

An epoch is one pass over the stage's training rows: sft rows at sft.batch_size per step; rm, dpo and kto the
preference rows less the held-out tenth (kto counting its unpaired rows) at batch_size; rl the prompts at
rl.prompts_per_step. Rows dropped later as too long (data.over_length) are counted here."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from rlctl import data
from rlctl.config import RunConfig
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.plan.parts import Noted

DATA_ROLE = {"sft": "sft", "dpo": "preference", "kto": "preference", "rm": "preference", "rl": "rl"}


def train_rows(cfg: RunConfig, stage: str, spec: str | Path, generated: bool) -> int:
    """The rows one epoch of `stage` passes over in the dataset `spec`."""
    role = "kto" if stage == "kto" else DATA_ROLE[stage]
    answer = cfg.data.answer_field if role == "rl" else None
    columns = data.stage_columns(cfg, stage)
    if generated:  # a temporary file: read without recording it among the run's datasets
        table = data.read(spec, role, cfg.data.encoding)
        mapped = data.Table([data.map_columns(r, columns) for r in table.rows], table.where, table.source)
        rows = len(data.normalise(mapped, role, answer)[0])
    else:
        info = data.describe(spec, role, answer, columns, cfg.data.encoding)
        if info.format == "hub":
            raise UserError(
                f"Invalid config: {stage}.epochs needs the rows of data.{DATA_ROLE[stage]} at plan time, but {spec} "
                f"is a Hub dataset, counted only when training starts; set {stage}.max_steps instead."
            )
        rows = info.rows
    if stage in ("rm", "dpo", "kto"):
        rows -= len(data.held_out(rows, data.PREFERENCE_HOLDOUT, cfg.seed))
    return rows


def resolve(cfg: RunConfig) -> Noted[RunConfig]:
    """`cfg` with `max_steps` set for every stage given in epochs (so config.yaml holds the steps the stage trains),
    and the plan's decisions saying so. A UserError when the rows cannot be counted."""
    stages = [s for s in cfg.stages if getattr(cfg, s).epochs is not None]
    if not stages:
        return Noted(cfg)
    decisions: list[dict[str, str]] = []
    update: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        generated = tasks.GENERATORS[cfg.data.generate](Path(tmp), cfg.seed) if cfg.data.generate else {}
        for stage in stages:
            role = DATA_ROLE[stage]
            spec = generated.get(role) or getattr(cfg.data, role)
            if spec is None:
                raise UserError(
                    f"Invalid config: {stage}.epochs counts the rows of data.{role}, which is not set; set "
                    f"data.{role} (or data.generate) or use {stage}.max_steps."
                )
            sc = getattr(cfg, stage)
            rows = train_rows(cfg, stage, spec, bool(generated))
            per_step = cfg.rl.prompts_per_step if stage == "rl" else sc.batch_size
            steps = max(1, math.ceil(sc.epochs * rows / per_step))
            update[stage] = sc.model_copy(update={"max_steps": steps})
            unit = "prompts" if stage == "rl" else "rows"
            why = f"{stage}.epochs={sc.epochs:g} over {rows} training {unit}, {per_step} {unit} per step"
            decisions.append({"setting": f"{stage}.max_steps", "value": str(steps), "why": why})
    return Noted(cfg.model_copy(update=update), decisions=tuple(decisions))
