"""The process `accelerate launch -m rlctl.launch.runner RUN_DIR` starts on every rank.

It reads the run directory's config.yaml, builds the tiny base model when the run uses one, evaluates the
starting policy, then runs each stage not yet finished: a finished stage is recorded in summary.json
with its held-out metrics, so `rlctl resume` skips it and continues the interrupted one from its last
complete checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import traceback
from pathlib import Path

from rlctl import checkpoint, rundir
from rlctl.checkpoint import faults
from rlctl.config import RunConfig
from rlctl.config.sections import BUILTIN_MODELS as BUILTIN
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.launch import restarts, resume_check, trackers
from rlctl.monitors import alarms
from rlctl.plan import planner as plan_mod
from rlctl.plan import resolved
from rlctl.rewards.worker import Workers
from rlctl.runtime import context
from rlctl.scrub import scrub

# Each stage's module, imported only when that stage runs: the TRL stages' modules pull in transformers' trainer
# (peft, bitsandbytes: seconds at import), which a run of the rl stage alone never needs. Each has `run(ctx)`.
STAGE_MODULES = {
    "sft": "rlctl.stages.sft",
    "rm": "rlctl.stages.rm",
    "rl": "rlctl.stages.rl",
    "dpo": "rlctl.stages.dpo",
    "kto": "rlctl.stages.kto",
}


def build_base(cfg: RunConfig, run_dir: Path) -> None:
    """The random-init tiny model (builtin:tiny, or builtin:tiny-vlm / builtin:tiny-gemma3 with its processor),
    built once into run_dir/base from the run's own data."""
    from rlctl.stages import tiny

    base = rundir.RunDir(run_dir).base
    if base.exists():
        return
    texts = tasks.corpus(plan_mod.data_paths(cfg, run_dir))
    tiny.build(base, cfg.model.arch, texts, cfg.seed, (cfg.data.min_pixels, cfg.data.max_pixels))


def _traceback() -> None:
    """The exception being handled, in full, on stderr (the run's log): its messages scrubbed of credentials."""
    print(scrub(traceback.format_exc()), file=sys.stderr, end="")


def _record_restart(run_dir: Path, the_plan, summary: rundir.Summary, log: context.MetricsLog, state) -> None:
    """After torchrun's elastic agent restarted the processes: summary.json `restarts` and a `restart` event say
    which nodes were replaced, where the interrupted stage was and the checkpoint it resumes from."""
    from accelerate.utils import gather_object

    here = [restarts.ProcessStart.here()]
    starts = gather_object(here) if state.num_processes > 1 else here
    pending = next((s.name for s in the_plan.stages if s.name not in summary.completed), None)
    if not state.is_main_process or pending is None:
        return
    restart = restarts.record(run_dir, starts, pending)
    if restart is not None:
        summary.restarts.append(restart)
        rundir.write_summary(run_dir, summary)
        fields = {k: v for k, v in restart.to_json().items() if k != "time"}  # the log stamps its own
        log.write(event="restart", **fields)


def main(run_dir: Path) -> None:
    """Run the stages; a fault outside any stage (a damaged run file, a failing base model build) ends the run
    with one paragraph on stderr too, never a bare traceback."""
    from rlctl.processes import die_with_parent

    die_with_parent()  # no trainer outlives its launcher
    stop, workers = context.install_stop_handlers(), Workers()
    try:
        _main(run_dir, stop, workers)
    except Exception as e:
        if isinstance(e, UserError):
            message, code = str(e), 2
        else:
            _traceback()
            message, code = faults.unexpected(e, run_dir, "setup", rundir.RunDir(run_dir).log()), 1
        print(f"rlctl: {scrub(message)}", file=sys.stderr)
        sys.exit(code)
    finally:
        workers.stop_all()


def _main(run_dir: Path, stop: context.StopFlag, workers: Workers) -> None:
    from accelerate import PartialState

    from rlctl.monitors import layout, memory_probe
    from rlctl.stages.context import StageContext

    the_plan = resolved.read(run_dir)  # the plan the CLI made and checked: ranks plan nothing again
    cfg = the_plan.config
    state = PartialState(cpu=the_plan.hardware.is_cpu)
    watch = alarms.Watch(cfg.logging.alarm_steps, cfg.logging.alarms)
    log = context.MetricsLog(run_dir, state.is_main_process, watch)
    fanout = trackers.Fanout(list(cfg.logging.report_to), run_dir, cfg.name, cfg.model_dump(mode="json"), log.write)
    log.to_trackers = fanout.add if fanout.pending else None
    paths = plan_mod.data_paths(cfg, run_dir)
    summary = resume_check.read_summary(run_dir, cfg)
    summary.world_size = state.num_processes
    if cfg.hardware.max_restarts:
        _record_restart(run_dir, the_plan, summary, log, state)

    def save(name: str, metrics: dict) -> None:
        if state.is_main_process:
            summary.stages[name] = rundir.StageSummary(metrics)
            rundir.write_summary(run_dir, summary)
            log.write(stage=name, event="eval", **metrics)

    if cfg.model.name_or_path in BUILTIN and state.is_main_process:
        build_base(cfg, run_dir)
    state.wait_for_everyone()

    def stage_context(stage: plan_mod.StagePlan, probe: memory_probe.Probe | None = None) -> StageContext:
        return StageContext(
            cfg=cfg,
            plan=the_plan,
            stage=stage,
            run_dir=run_dir,
            data=paths,
            log=log,
            is_main=state.is_main_process,
            device=state.device,
            stop=stop,
            probe=probe,
            workers=workers,
        )

    @contextlib.contextmanager
    def explained(ctx: StageContext):
        """Known faults end the run with an `error` event the CLI shows: bad data exit 2, runtime faults exit 1,
        a stop signal 128 + signal (its checkpoint already written)."""
        try:
            yield
        except context.Interrupted as e:
            log.write(stage=ctx.stage.name, event="interrupted")
            sys.exit(e.exit_code)
        except Exception as e:
            if isinstance(e, UserError | context.Stopped):
                message = str(e)
            else:
                measured = memory_probe.so_far(ctx.probe, ctx.stage.name, the_plan.memory)
                message = faults.explain(e, the_plan, ctx.stage.name, ctx.checkpoints, state.is_main_process, measured)
            if message is None:
                message = faults.unexpected(
                    e, run_dir, ctx.stage.name, rundir.RunDir(run_dir).log(cfg.hardware.node_rank)
                )
            if not isinstance(e, UserError | context.Stopped):
                _traceback()
            message, code = scrub(message), 2 if isinstance(e, UserError) else 1
            with contextlib.suppress(OSError):  # a run directory made read-only: the log below still says it
                log.write(stage=ctx.stage.name, event="error", message=message, exit_code=code)
            print(f"rlctl: {message}", file=sys.stderr)
            sys.exit(code)

    first = stage_context(the_plan.stages[0])
    if cfg.data.over_length == "refuse" and state.is_main_process:  # every stage's data, before any training
        from rlctl.runtime import models, rows

        tok = models.tokenizer(first.source())
        for stage in the_plan.stages:
            if stage.name not in summary.completed:
                ctx = stage_context(stage)
                with explained(ctx):
                    rows.training_rows(ctx.stage_data(), tok)
    state.wait_for_everyone()
    if "base" not in summary.stages and "eval" in paths and first.stage.name != "rm" and state.is_main_process:
        with explained(first):
            save("base", first.held_out().score_saved(first.stage.init_from, scope="base"))
    for stage in the_plan.stages:
        if stage.name in summary.completed:
            continue
        log.write(stage=stage.name, event="start", max_steps=stage.max_steps)
        probe = memory_probe.start(stage.name, run_dir, state.device, log)
        ctx = stage_context(stage, probe)
        with explained(ctx):
            importlib.import_module(STAGE_MODULES[stage.name]).run(ctx)
        if state.is_main_process:
            if ctx.notes is not None:
                summary.data[stage.name] = ctx.notes
            with explained(ctx):
                held_out = ctx.held_out()
                metrics = held_out.score_saved(str(ctx.final)) if held_out.can_score else {}
            probe.lap("evaluation")  # the final save and the held-out evaluation
        probe.close()  # the stage's memory record written
        if state.is_main_process:
            measured = memory_probe.summary(run_dir, stage.name, the_plan.memory)
            if measured is not None:
                summary.memory[stage.name] = measured
            best = checkpoint.best(ctx.checkpoints)
            if best is not None:
                summary.best_checkpoints[stage.name] = rundir.BestCheckpoint.of(best, checkpoint.mark(best))
            record = layout.read(run_dir, stage.name)
            if record is not None:
                summary.layout[stage.name] = record
            summary.completed.append(stage.name)
            save(stage.name, metrics)
            log.write(stage=stage.name, event="end", max_steps=stage.max_steps)
        state.wait_for_everyone()


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    finally:
        # exit hooks and module teardown run as usual, but the interpreter's last garbage collections skip the
        # run's objects: about a second less for every training process to end
        gc.freeze()
