"""What `rlctl eval` does and prints: generate, score, the table, the JSON result and its samples."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from rlctl import atomic, strictjson, tables
from rlctl.cli.cockpit import UI, fmt
from rlctl.errors import UserError
from rlctl.rundir import RunDir, eval_samples

if TYPE_CHECKING:
    from rlctl.config import RunConfig

TOOL_METRICS = ("turns", "tool_calls", "tool_errors", "tool_call_rate")  # what a run with rl.tools reports
PLAIN_EVERY_S = 10.0  # `rlctl eval` off a terminal: one progress line at most this often


@dataclass
class EvalOptions:
    stage: str | None = None
    samples: int = 1
    temperature: float | None = None
    top_p: float = 1.0
    greedy: bool = False
    max_new_tokens: int | None = None
    limit: int | None = None
    reward: list[str] | None = None
    accuracy: str | None = None
    columns: dict[str, str] | None = None
    answer_field: str | None = None
    batch_size: int = 16
    out: Path | None = None


def _is_eval_result(path: Path) -> bool:
    """Whether `path` holds an earlier `rlctl eval` result (the JSON object it writes)."""
    try:
        found = strictjson.read(path)
    except strictjson.DamagedFile:
        return False
    return {"model", "data", "rewards", "max_new_tokens"} <= set(found)


def _check_eval_out(out: Path) -> None:
    """Refuse to replace a file that is not an earlier eval result (the JSON or its samples): rlctl replaces only
    what it wrote, so a file of the user's in the way is refused, whatever the flags."""
    from rlctl.checkpoint import safewrite

    safewrite.check_file(out, _is_eval_result, "eval result")
    samples = eval_samples(out)
    safewrite.check_file(samples, lambda _: out.is_file() and _is_eval_result(out), "eval samples file")


def _run_eval_data(target: Path, cfg: RunConfig | None) -> str:
    """The held-out file a run scored its stages on (summary.json's eval_accuracy): the default of `--data`."""
    from rlctl.plan import planner

    if cfg is None:
        raise UserError(
            f"rlctl eval {target} needs --data FILE: held-out prompts with ground truth. Only a run directory has "
            "a default, the held-out data it was trained with."
        )
    found = planner.data_paths(cfg, target).get("eval")
    if found is None:
        raise UserError(
            f"The run {target} has no held-out data (data.eval was not set): pass --data FILE with held-out prompts "
            "and ground truth."
        )
    return str(found)


def _vision_of(target: Path, cfg: RunConfig | None) -> Any:
    """The vision tower (`VisionArch`) of the model `rlctl eval` evaluates, as far as its config says before it is
    loaded: the run's model.arch, else the config.json of the folder (or cached Hub id) of the run's model or of the
    target itself; None when unknown or a text model."""
    from rlctl.plan import arch as model_arch

    if cfg is not None and cfg.model.arch is not None:
        return cfg.model.arch.vision
    name = cfg.model.name_or_path if cfg is not None else str(target)
    folder = Path(name).expanduser()
    path = folder / "config.json" if folder.is_dir() else model_arch.cached_config(name)
    try:
        found = model_arch.arch_from_config(strictjson.read(path), str(path)) if path and path.is_file() else None
    except (UserError, KeyError, ValueError, TypeError):  # not a model config: loading the model says so
        return None
    return found.vision if found is not None else None


def evaluate_command(ui: UI, target: Path, data_file: str | None, opt: EvalOptions) -> dict[str, Any]:
    """Generate, score, print the table, write the JSON and the samples; returns the metrics."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rlctl import data, rewards
    from rlctl.checkpoint import safewrite, verify
    from rlctl.data import images
    from rlctl.launch.progress import RowProgress
    from rlctl.rewards import scoring

    if opt.top_p <= 0:
        raise UserError("--top-p 0 keeps no token to sample; give a nucleus mass above 0 (at most 1, the default).")
    if opt.greedy and (opt.samples > 1 or opt.temperature is not None):
        raise UserError("--greedy gives one completion per prompt; drop --samples/--temperature, or drop --greedy.")
    is_run = RunDir(target).is_run()
    name = str(target)
    if not target.exists() and (target.is_absolute() or name.startswith(".") or name.count("/") > 1):
        raise UserError(
            f"Cannot load a model from '{target}': no such folder, and not a Hub model id (namespace/name)."
        )
    cfg = verify.run_config(target) if is_run else None
    if data_file is None:
        data_file = _run_eval_data(target, cfg)
    specs = (
        [(r, 1.0) for r in opt.reward] if opt.reward else [(r.name, r.weight) for r in cfg.rl.rewards] if cfg else []
    )
    answer_field = opt.answer_field or (cfg.data.answer_field if cfg else "answer")
    columns = {**(data.stage_columns(cfg, "eval") if cfg else {}), **(opt.columns or {})}
    rows, info = data.load(data_file, "eval", answer_field, columns, cfg.data.encoding if cfg else "utf-8")
    rows = rows[: opt.limit] if opt.limit else rows
    images.read_sizes(rows, info.base, info.row, decode=True, cap=None, vision=_vision_of(target, cfg))
    accuracy = opt.accuracy
    if accuracy is None:  # the run's correctness reward with its arguments (or the --reward ones)
        accuracy = scoring.accuracy_name(specs if opt.reward or cfg is None else cfg.rl.rewards, info.format)
    if not specs:
        specs = [(accuracy, 1.0)]
    for name, _ in specs:
        if name not in rewards.MODEL_REWARDS:
            rewards.resolve(name, answer_field)
    rewards.resolve(accuracy, answer_field)
    temperature = opt.temperature
    if temperature is None and opt.samples > 1:
        temperature = cfg.rl.temperature if cfg else 1.0
    max_new = opt.max_new_tokens or (cfg.rl.max_new_tokens if cfg else None)
    out = opt.out
    if out is None:
        stem = re.sub(r"[^\w.-]+", "_", Path(info.source.split("://")[-1]).stem or "data")
        out = RunDir(target).eval(stem) if is_run else Path(f"eval-{stem}.json")

    _check_eval_out(out)
    from rlctl.evaluation import evaluate  # torch: only once the inputs are known to be good

    ui.console.print(
        f"[bold]Evaluating[/] {escape(str(target))} on {escape(info.source)} ({len(rows)} x {opt.samples})"
    )
    with ui.console.status("Loading the model..."):
        policy = evaluate.load_policy(target, opt.stage)
        rm_scorer = None
        if any(n in rewards.MODEL_REWARDS for n, _ in specs):
            rm_dir = RunDir(target).final("rm")
            if is_run and rm_dir.is_dir():
                rm_scorer = evaluate.reward_model_scorer(rm_dir)
            else:
                specs = [s for s in specs if s[0] not in rewards.MODEL_REWARDS]
                ui.console.print("[yellow]note:[/] reward_model left out: it needs a run with a finished rm stage")
    if max_new is None:  # neither --max-new-tokens nor a run: a length that fits the held-out answers
        max_new = evaluate.fitting_max_new_tokens(policy.tokenizer, [r.get(answer_field) for r in rows])
        ui.console.print(
            f"max new tokens: {max_new} (twice the longest ground-truth answer in tokens + 32; --max-new-tokens to "
            "change); each completion ends at the model's end-of-turn token"
        )
    agent = None
    if cfg is not None and "rl" in cfg.stages and cfg.rl.tools:  # a tool run: evaluated as it was trained
        from rlctl.rollout import multiturn

        agent = multiturn.agent_for(cfg.rl, policy.tokenizer)
        agent = dataclasses.replace(agent, max_new_tokens=max_new)
    bar = [TextColumn("[bold]generate"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    rows_done = RowProgress("generate", len(rows), started=time.monotonic())
    printed = [0.0]

    def advance(k: int) -> None:
        progress.advance(task, k)
        rows_done.advance(k)
        if not ui.console.is_terminal and (rows_done.now - printed[0] >= PLAIN_EVERY_S or rows_done.done == len(rows)):
            printed[0] = rows_done.now  # off a terminal (a log, CI) a plain line at most every PLAIN_EVERY_S
            ui.console.print(rows_done.text(), markup=False)
            ui.console.file.flush()

    with Progress(*bar, console=ui.console, transient=True, disable=not ui.console.is_terminal) as progress:
        task = progress.add_task("generate", total=len(rows))
        result = evaluate.evaluate_rows(
            policy,
            rows,
            specs,
            accuracy,
            answer_field,
            max_new,
            n=opt.samples,
            temperature=temperature,
            top_p=opt.top_p,
            batch_size=opt.batch_size,
            reward_model=rm_scorer,
            on_batch=advance,
            agent=agent,
            image_base=Path(str(data_file)).parent,
        )
    metrics = {
        "model": policy.source,
        "stage": policy.stage,
        "data": info.source,
        "data_format": info.format,
        "rewards": [{"name": n, "weight": w} for n, w in specs],
        "max_new_tokens": max_new,
        **result.metrics,
    }
    samples_path = eval_samples(out)
    with safewrite.lock(out, "eval"):
        _check_eval_out(out)  # again: another eval may have written it meanwhile
        for note in filter(None, (safewrite.drop_stale(out), safewrite.drop_stale(samples_path))):
            ui.console.print(f"[yellow]note:[/] {escape(note)}")
        atomic.write_text(samples_path, "".join(strictjson.dumps(s, default=str) + "\n" for s in result.samples))
        atomic.write_text(out, strictjson.dumps(metrics, indent=2) + "\n")
    print_eval(ui, metrics, result.samples)
    ui.console.print(f"[green]Wrote[/] {out} and {samples_path}")
    return metrics


def print_eval(ui: UI, metrics: dict, samples: list[dict]) -> None:
    table = Table(title="Evaluation", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("model", "data", "prompts", "samples_per_prompt", "decoding", "accuracy_reward"):
        table.add_row(key, fmt(metrics[key]))
    for key, value in metrics.items():
        if key in ("accuracy", "mean_reward", "mean_response_tokens", *TOOL_METRICS) or key.startswith(
            ("pass@", "reward/")
        ):
            table.add_row(f"[bold]{key}[/]", fmt(value))
    tables.show(ui.results(), table)
    if ui.verbose:
        detail = Table(title="Samples", title_justify="left")
        for col in ("prompt", "answer", "completion", "correct", "reward"):
            detail.add_column(col, overflow="fold")
        for s in samples:
            for c, ok, r in zip(s["completions"], s["correct"], s["reward"], strict=True):
                detail.add_row(ui.short(s["prompt"]), ui.short(s["answer"]), ui.short(c), str(ok), fmt(r))
        tables.show(ui.console, detail)
