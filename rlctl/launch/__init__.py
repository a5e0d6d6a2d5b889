"""Prepare a run directory and start the stages through `accelerate launch`, showing live progress.

The launched processes (rlctl.launch.runner) write `metrics.jsonl`; this side tails it into rich progress bars,
keeps the full log in `logs/train.log` (`logs/train.node{R}.log` on node R > 0 of a multi-node run, so nodes
sharing the run directory do not write one file), and prints the summary table at the end.

Package `rlctl.launch`: a new run directory prepared (this module: the inputs checked by the pre-flight in
`preflight`, the plan, config.yaml, accelerate.yaml and the data written), the launch started and waited for
(`start`: the lock, the environment, stopping at a checkpoint, why a launch failed), what the console shows
meanwhile (`live`, each stage's progress in `progress`), the process every rank runs (`runner`), what an elastic
restart was (`restarts`), the job files of schedulers (`jobs`: SLURM scripts in `slurm`, Kubernetes manifests in
`k8s`, SkyPilot tasks in `sky`) and TensorBoard event files (`tbevents`).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, evaluation,
runtime, monitors, trainer, stages.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from rich.console import Console
from rich.markup import escape

from rlctl import atomic, data
from rlctl import config as config_mod
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.launch import preflight
from rlctl.plan import data_lengths, packages
from rlctl.plan import planner as plan_mod
from rlctl.rundir import RunDir, write_record

if TYPE_CHECKING:
    from rlctl.plan.gguf import GgufImport, ImportRecord


def _absolute(cfg: config_mod.RunConfig) -> config_mod.RunConfig:
    """Data files and reward plugins as absolute paths, so `rlctl resume` works from any folder (Hub dataset
    names stay as they are)."""
    cfg = cfg.model_copy(deep=True)
    for role in plan_mod.DATA_ROLES:
        value = getattr(cfg.data, role)
        if value:
            setattr(cfg.data, role, data.absolute(value))
    for spec in cfg.rl.rewards:
        if ".py:" in spec.name:
            path, _, fn = spec.name.rpartition(":")
            spec.name = f"{Path(path).resolve()}:{fn}"
    return cfg


def check_inputs(
    cfg: config_mod.RunConfig, run_dir: Path, paths: dict[str, Path] | None, bf16: bool = False
) -> preflight.Report:
    """The pre-flight over every row (model, chat template, run directory, datasets, lengths), then the rewards
    called on the first RL rows; raises UserError. Returns the pre-flight's report."""
    from rlctl import rewards

    missing = plan_mod.missing_data(cfg)
    if missing:
        raise UserError("Missing data: " + "; ".join(missing) + ".")
    report = preflight.run(cfg, run_dir, full=True, paths=paths, bf16=bf16)
    preflight.require(report)
    if "rl" in cfg.stages:
        specs = [spec for spec in cfg.rl.rewards if spec.name not in rewards.MODEL_REWARDS]
        names, timeouts = [s.name for s in specs], [s.timeout_s for s in specs]
        rewards.dry_run(names, report.rows["rl"], cfg.data.answer_field, timeouts=timeouts)  # plugin errors surface now
    return report


@dataclass
class Prepared:
    """A new run directory's plan, and the pre-flight report of its inputs (what was recognised in the data, the
    rows over their length limits)."""

    plan: plan_mod.Plan
    report: preflight.Report


def prepare(cfg: config_mod.RunConfig, run_dir: Path) -> Prepared:
    """Validate everything, then write config.yaml, accelerate.yaml and the data into a new run directory. The plan
    is built once, from the plan's facts and the lengths the pre-flight counts in the data (recorded: every rank and
    resume plans the same)."""
    cfg = _absolute(cfg)
    facts = plan_mod.facts(cfg, run_dir)
    problem = preflight.run_dir_problem(run_dir)
    if problem:
        raise UserError(problem)
    imported = import_model(facts.model_import, Console(highlight=False), quiet=False)
    with tempfile.TemporaryDirectory(prefix="rlctl-data-") as scratch:  # a refused run leaves nothing behind
        paths = None
        if cfg.data.generate:
            tasks.GENERATORS[cfg.data.generate](RunDir(Path(scratch)).data, cfg.seed)
            paths = plan_mod.data_paths(cfg, scratch)
        report = check_inputs(facts.cfg, run_dir, paths, facts.precision == "bf16")
        lengths = preflight.longest(report)
        the_plan = plan_mod.build_from(facts, lengths or None, report.images or None)  # the data's lengths
        packages.require(the_plan)  # after the inputs: a data problem is named whether or not the extras are here
        run_dir.mkdir(parents=True, exist_ok=True)
        if paths:
            shutil.move(RunDir(Path(scratch)).data, RunDir(run_dir).data)
    data_lengths.record(run_dir, lengths, report.images)  # what the plan used, for every rank and resume
    if imported is not None:  # what the import fixed, kept with the run
        write_record(RunDir(run_dir).model_import, imported)
    atomic.write_text(RunDir(run_dir).accelerate, yaml.safe_dump(the_plan.accelerate, sort_keys=False))
    write_record(RunDir(run_dir).plan, the_plan)
    atomic.write_text(RunDir(run_dir).config, config_mod.dump(the_plan.config))  # as the plan resolved it
    return Prepared(the_plan, report)


def import_model(spec: GgufImport | None, console: Console, quiet: bool) -> ImportRecord | None:
    """The plan's GGUF model (`spec`) converted into its cached folder (rlctl.stages.gguf_import), once per machine
    before the ranks start; the import's record (what it fixed), or None for other models. `quiet`: say nothing when
    it is cached already (a resume). A file transformers cannot convert is a UserError (exit 2)."""
    if spec is None:
        return None
    from rlctl.stages import gguf_import

    lines: list[str] = []
    try:
        done = gguf_import.ensure(spec, lines.append)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise UserError(
            f"transformers could not convert {spec.file} into a Hugging Face model ({type(e).__name__}: {e}). "
            "rlctl trains GGUF files of the architectures transformers' GGUF loader supports (Llama, Qwen2/3, "
            "Mistral, Gemma, Phi-3 ...); convert it by hand into a folder and point model.name_or_path there."
        ) from None
    if done.converted_now or not quiet:
        for line in lines:
            console.print(f"[bold]Model[/] {escape(line)}", soft_wrap=True)  # the cached folder's path stays whole
    return done.record
