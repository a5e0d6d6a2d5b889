"""What a stage runs with: its context (config, plan, run directory, data files, metrics log, stop flag, reward
workers, memory probe), built by the runner for each stage it starts, and the narrow values the stage builds from
it for what it calls: its starting model and how models load (`source`), where its rows come from
(`stage_data`), its rewards (`rewards`), its held-out scoring (`held_out`) and its monitors (`monitors`: the
loop's hooks). Nothing below the stages takes the context itself; the TRL stages' argument builders
(`rlctl.stages.trl_common`) are stage code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.config import RunConfig
from rlctl.data import stage_columns
from rlctl.monitors.heldout import HeldOut
from rlctl.monitors.hooks import Monitors
from rlctl.monitors.layout import Contract
from rlctl.monitors.memory_probe import Probe
from rlctl.plan import Plan, StagePlan
from rlctl.rewards.worker import Workers
from rlctl.rundir import DataNote, RunDir
from rlctl.runtime.context import MetricsLog, StopFlag, Stops
from rlctl.runtime.models import ModelSource
from rlctl.runtime.rewarding import RewardSetup
from rlctl.runtime.rows import StageData


@dataclass
class StageContext:
    """What a stage runs with. The runner hands every stage it starts the same `stop` flag and reward `workers`,
    and the memory probe measuring this stage (`probe`, None when nothing is measured); the stage keeps the note of
    the rows it dropped as too long (`notes`) for summary.json."""

    cfg: RunConfig
    plan: Plan
    stage: StagePlan
    run_dir: Path
    data: dict[str, Path]
    log: MetricsLog
    is_main: bool
    device: Any = "cpu"
    notes: DataNote | None = None
    stop: StopFlag = field(default_factory=StopFlag)
    probe: Probe | None = None
    workers: Workers = field(default_factory=Workers)

    @property
    def settings(self):
        """This stage's section of the config (cfg.sft, cfg.rm or cfg.rl)."""
        return getattr(self.cfg, self.stage.name)

    @property
    def checkpoints(self) -> Path:
        return RunDir(self.run_dir).checkpoints(self.stage.name)

    @property
    def final(self) -> Path:
        return RunDir(self.run_dir).final(self.stage.name)

    def notify(self, event: str, **fields: Any) -> None:
        """An event of this stage (a reward running slow, ...) for metrics.jsonl and the console."""
        self.log.write(stage=self.stage.name, event=event, **fields)

    @property
    def stops(self) -> Stops:
        """The errors that end this stage."""
        name = self.stage.name
        tolerance = self.cfg.rl.mismatch.sync_tolerance
        return Stops(name, self.run_dir, self.checkpoints, self.log, tolerance)

    # --- the narrow values the stage hands what it calls (each built anew: none is the context) ---------------------

    def source(self) -> ModelSource:
        """The stage's starting model, loaded as the plan says."""
        plan, fsdp2 = self.plan, self.stage.strategy == "fsdp2"
        return ModelSource(
            self.stage.init_from, self.cfg.model, self.cfg.data.chat_template, plan.mixed_precision, plan.adapter, fsdp2
        )

    def stage_data(self) -> StageData:
        """Where this stage's rows come from, and the length policy they pass."""
        cfg, name = self.cfg, self.stage.name
        limit = cfg.data.max_prompt_length if name == "rl" else self.settings.max_length
        columns, eval_columns = stage_columns(cfg, name), stage_columns(cfg, "eval")
        return StageData(name, self.data, cfg.data, columns, eval_columns, limit, cfg.seed, cfg.rl.tools)

    def rewards(self) -> RewardSetup:
        """The run's rewards (rl.rewards) in the runner's workers, their events logged as this stage's, and the rm
        stage's reward model."""
        cfg, reward_model = self.cfg, self.source().at(RunDir(self.run_dir).final("rm"))
        return RewardSetup(cfg.rl.rewards, cfg.data.answer_field, self.workers, self.notify, reward_model)

    def held_out(self) -> HeldOut:
        """What scores this stage's models on held-out data."""
        return HeldOut(
            rows=self.stage_data(),
            settings=self.settings,
            rl=self.cfg.rl,
            as_rl="rl" in self.cfg.stages,
            rewards=self.rewards(),
            source=self.source(),
            log=self.log,
            is_main=self.is_main,
            device=self.device,
        )

    def monitors(self) -> Monitors:
        """What watches this stage: its memory probe, held-out scoring and checkpoints, and its layout check."""
        contract = Contract(self.plan, self.stage, self.run_dir)
        return Monitors(contract, self.held_out(), self.checkpoints, self.cfg.checkpoint, self.probe)
