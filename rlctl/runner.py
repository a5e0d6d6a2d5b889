"""The process `accelerate launch -m rlctl.runner RUN_DIR` starts on every rank.

It reads the run directory's config.yaml, builds the tiny base model when the run uses one, evaluates the
starting policy, then runs each stage not yet finished: a finished stage is recorded in summary.json
with its held-out metrics, so `rlctl resume` skips it and continues the interrupted one from its last
complete checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlctl import checkpoint, tasks
from rlctl import plan as plan_mod
from rlctl.config import RunConfig, load_run_config
from rlctl.stages import common


def read_summary(run_dir: Path, cfg: RunConfig) -> dict:
    path = run_dir / "summary.json"
    if path.exists():
        return json.loads(path.read_text())
    return {"run": cfg.name, "model": cfg.model.name_or_path, "stages": {}, "completed": []}


def build_base(cfg: RunConfig, run_dir: Path) -> None:
    """The random-init tiny model, built once into run_dir/base from the run's own data."""
    from rlctl import tiny

    base = run_dir / "base"
    if base.exists():
        return
    texts = tasks.corpus(plan_mod.data_paths(cfg, run_dir))
    tiny.build(base, cfg.model.arch, texts, cfg.seed)


def evaluate_policy(ctx: common.StageContext, path: str) -> dict[str, float]:
    """Held-out eval_accuracy / eval_reward of the causal LM at `path` (main process only)."""
    from rlctl import data, evaluate, rewards
    from rlctl.stages import models

    cfg = ctx.cfg
    rows = data.check(ctx.data["eval"], "eval", cfg.data.answer_field)[: cfg.rl.eval_samples]
    fns = [
        (rewards.resolve(r.name, cfg.data.answer_field), r.weight)
        for r in cfg.rl.rewards
        if r.name not in rewards.MODEL_REWARDS
    ]
    model = models.causal_lm(ctx, path, trainable=False).to(ctx.device)
    tok = models.tokenizer(ctx, path)
    return evaluate.score_policy(model, tok, rows, fns, cfg.data.answer_field, cfg.rl.max_new_tokens)


def evaluate_reward_model(ctx: common.StageContext) -> dict[str, float]:
    from rlctl import evaluate
    from rlctl.stages import models
    from rlctl.stages.rm import preference_split

    path = str(ctx.final)
    tok = models.tokenizer(ctx, path)
    model = models.reward_model(ctx, path, tok.pad_token_id, trainable=False).to(ctx.device)
    _, held = preference_split(ctx)
    return evaluate.score_reward_model(model, tok, held[: ctx.settings.eval_samples])


def main(run_dir: Path) -> None:
    from accelerate import PartialState

    from rlctl.launch import die_with_parent

    die_with_parent()  # no trainer outlives its launcher
    common.install_stop_handlers()

    from rlctl.stages import dpo, kto, rl, rm, sft

    cfg = load_run_config(run_dir / "config.yaml")
    the_plan = plan_mod.build(cfg, run_dir)
    state = PartialState(cpu=the_plan.hardware.is_cpu)
    log = common.MetricsLog(run_dir, state.is_main_process)
    paths = plan_mod.data_paths(cfg, run_dir)
    summary = read_summary(run_dir, cfg)
    summary["world_size"] = state.num_processes
    stage_fns = {"sft": sft.run, "dpo": dpo.run, "kto": kto.run, "rm": rm.run, "rl": rl.run}

    def save(name: str, metrics: dict) -> None:
        if state.is_main_process:
            summary["stages"][name] = metrics
            checkpoint.write_json_atomic(run_dir / "summary.json", summary)
            log.write(stage=name, event="eval", **metrics)

    if cfg.model.name_or_path == "builtin:tiny" and state.is_main_process:
        build_base(cfg, run_dir)
    state.wait_for_everyone()

    def context(stage: plan_mod.StagePlan) -> common.StageContext:
        return common.StageContext(cfg, the_plan, stage, run_dir, paths, log, state.is_main_process, state.device)

    first = the_plan.stages[0]
    if "base" not in summary["stages"] and "eval" in paths and first.name != "rm" and state.is_main_process:
        save("base", evaluate_policy(context(first), first.init_from))
    for stage in the_plan.stages:
        if stage.name in summary["completed"]:
            continue
        ctx = context(stage)
        log.write(stage=stage.name, event="start", max_steps=stage.max_steps)
        try:
            stage_fns[stage.name](ctx)
        except common.Interrupted as e:
            log.write(stage=stage.name, event="interrupted")
            sys.exit(e.exit_code)
        except common.NonFiniteError as e:
            log.write(stage=stage.name, event="error", message=str(e))
            sys.exit(1)
        if state.is_main_process:
            if stage.name == "rm":
                metrics = evaluate_reward_model(ctx)
            else:
                metrics = evaluate_policy(ctx, str(ctx.final)) if "eval" in paths else {}
            summary["completed"].append(stage.name)
            save(stage.name, metrics)
            log.write(stage=stage.name, event="end", max_steps=stage.max_steps)
        state.wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
