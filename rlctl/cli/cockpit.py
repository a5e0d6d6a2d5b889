"""What `rlctl eval`, `rlctl rewards`, `rlctl report` and `rlctl doctor` do and print. The command-line
signatures live in rlctl.cli; their bodies live here, imported only when one of these commands runs, so
`rlctl --help` stays fast."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlctl import atomic, strictjson, tables
from rlctl.errors import UserError
from rlctl.rundir import RunDir, eval_samples

if TYPE_CHECKING:
    from rlctl.config import RunConfig

TOOL_METRICS = ("turns", "tool_calls", "tool_errors", "tool_call_rate")  # what a run with rl.tools reports
PLAIN_EVERY_S = 10.0  # `rlctl eval` off a terminal: one progress line at most this often


@dataclass
class UI:
    """Where output goes: `console` (silent with --quiet) and, for final results, `results()` (always)."""

    console: Console
    verbose: bool = False

    def results(self) -> Console:
        return Console(highlight=False, emoji=False) if self.console.quiet else self.console

    def short(self, value: object, width: int = 48) -> str:
        """A prompt or completion on one table line (full text with --verbose)."""
        from rlctl.rewards import completion_text

        text = completion_text(value) if isinstance(value, list) else str(value)
        text = text.replace("\n", "\\n")
        if not self.verbose and len(text) > width:
            text = text[: width - 1] + "…"
        return escape(text)


def fmt(value: object) -> str:
    """A table cell: numbers to 4 significant digits, text with rich markup escaped."""
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.4g}"
    return "-" if value is None else escape(str(value))


def columns_opt(items: list[str] | None) -> dict[str, str]:
    """`--column prompt=question` options as a mapping."""
    out = {}
    for item in items or []:
        name, sep, src = item.partition("=")
        if not sep or not name or not src:
            raise UserError(f"--column expects NAME=SOURCE (e.g. prompt=question), got '{item}'.")
        out[name] = src
    return out


# ------------------------------------------------------------------------------------------- rewards
def rewards_list(ui: UI) -> None:
    from rlctl import rewards

    table = Table(title="Built-in rewards", title_justify="left")
    for col in ("name", "arguments", "what it scores"):
        table.add_column(col, overflow="fold")
    for name, args, doc in rewards.describe_builtins():
        table.add_row(escape(name), escape(args), escape(doc))
    tables.show(ui.results(), table)
    eps = rewards.entry_points()
    if eps:
        extra = Table(title=f"Installed ({rewards.ENTRY_POINT_GROUP} entry points)", title_justify="left")
        extra.add_column("name")
        extra.add_column("function")
        for name, ep in eps.items():
            extra.add_row(name, ep.value)
        tables.show(ui.results(), extra)
    ui.console.print(
        "Plugins: path/to/file.py:function. Arguments: name(key=value), e.g. length_penalty(max_length=512)."
    )


def reward_setup(
    run: Path | None, cfg: Any, reward: list[str] | None
) -> tuple[list[tuple[str, float]], str, dict[str, str], Path | None]:
    """(reward specs, answer field, column mapping, reward-model folder) from --reward, a run or a config."""
    from rlctl import data

    if cfg is None and not reward:
        raise UserError("No rewards to use: pass --reward NAME (repeatable), --run RUN_DIR, --preset or --config.")
    specs = [(r, 1.0) for r in reward] if reward else [(r.name, r.weight) for r in cfg.rl.rewards]
    answer_field = cfg.data.answer_field if cfg else "answer"
    columns = data.stage_columns(cfg, "rl") if cfg else {}
    rm_dir = RunDir(run).final("rm") if run is not None and RunDir(run).final("rm").is_dir() else None
    return specs, answer_field, columns, rm_dir


def _prompt_str(prompt: object) -> str:
    from rlctl.rewards import completion_text

    return completion_text(prompt) if isinstance(prompt, list) else str(prompt)


def rewards_test(
    ui: UI,
    data_file: str,
    specs: list[tuple[str, float]],
    answer_field: str,
    columns: dict[str, str],
    rm_dir: Path | None,
    limit: int,
    as_json: bool,
    encoding: str = "utf-8",
) -> None:
    """Score `data_file`'s rows with each reward; a row is `correct` when the correctness reward among `specs`
    (scoring.accuracy_name) scores it above 0.5, a list ground truth meaning any of its answers."""
    from rlctl import data, rewards
    from rlctl.rewards import scoring

    rows, _ = data.load(data_file, "rl", None, columns, encoding)
    rows = rows[:limit]
    if "completion" in rows[0]:
        completions, scored = [r.get("completion", "") for r in rows], "completion"
    elif answer_field in rows[0]:
        completions = [scoring.first_truth(r.get(answer_field)) for r in rows]
        scored = f"{answer_field} (no completion column; the first of a list of accepted answers)"
    else:
        raise UserError(f"{data_file} has neither a completion column nor the ground truth '{answer_field}' to score.")
    prompts = [r["prompt"] for r in rows]
    cols = rewards.columns_of(rows)
    model_scores, notes = {}, []
    if any(name in rewards.MODEL_REWARDS for name, _ in specs):
        if rm_dir is None:
            notes.append("reward_model skipped: it needs --run RUN_DIR with a finished rm stage")
        else:
            from rlctl.rollout import evaluate

            scorer = evaluate.reward_model_scorer(rm_dir)
            texts = [_prompt_str(p) + rewards.completion_text(c) for p, c in zip(prompts, completions, strict=True)]
            model_scores["reward_model"] = scorer(texts)
    per, total = rewards.score(specs, prompts, completions, cols, answer_field, model_scores)
    accuracy = scoring.accuracy_name(specs)
    correct = scoring.correct(accuracy, answer_field, prompts, completions, cols) if answer_field in cols else []
    if as_json:
        out = [
            {"prompt": p, "completion": c, **{k: v[i] for k, v in per.items() if v is not None}, "total": total[i]}
            | ({"correct": correct[i]} if correct else {})
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
        ]
        result = {"scored": scored, "accuracy_reward": accuracy, "rows": out, "notes": notes}
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    weights = [w for _, w in specs]
    table = Table(title=f"Rewards on {data_file} (scoring: {scored})", title_justify="left", show_footer=True)
    table.add_column("#", footer="mean", justify="right")
    table.add_column("prompt", overflow="fold")
    table.add_column("completion", overflow="fold")
    for (name, values), weight in zip(per.items(), weights, strict=True):
        footer = "-" if values is None else fmt(sum(values) / len(values))
        table.add_column(f"{name} x{weight:g}", footer=footer, justify="right")
    table.add_column("total", footer=fmt(sum(total) / len(total)), justify="right")
    if correct:
        table.add_column(f"correct ({accuracy})", footer=fmt(sum(correct) / len(correct)), justify="right")
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        cells = [fmt(None if v is None else v[i]) for v in per.values()]
        mark = [str(correct[i])] if correct else []
        table.add_row(str(i + 1), ui.short(p), ui.short(c), *cells, fmt(total[i]), *mark)
    tables.show(ui.results(), table)
    for note in notes:
        ui.console.print(f"[yellow]note:[/] {note}")


# ---------------------------------------------------------------------------------------------- eval
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
    from rlctl.rollout import evaluate  # torch: only once the inputs are known to be good

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


# -------------------------------------------------------------------------------------------- report
def report_command(ui: UI, run_dir: Path, out: Path | None, force: bool = False) -> None:
    from rlctl.after import report as report_mod

    with ui.console.status("Plotting metrics..."):
        rep = report_mod.build(run_dir, out, force)
    for note in rep.notes:
        ui.console.print(f"[yellow]warning:[/] {escape(note)}")
    for name, path in rep.plots.items():
        ui.console.print(f"  {name}: {path}")
    if rep.tensorboard:
        ui.console.print(f"  tensorboard: tensorboard --logdir {rep.tensorboard.parent}")
    ui.results().print(f"[green]Wrote[/] {rep.markdown}")


# -------------------------------------------------------------------------------------------- doctor
STATUS_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]", "info": "[blue]info[/]"}


def doctor_command(ui: UI, online: bool, as_json: bool) -> int:
    """Print the checks; 1 when any failed (each with its fix command), else 0."""
    from rlctl.after import doctor

    with ui.console.status("Checking this machine..."):
        checks = doctor.run(online=online)
    failed = [c for c in checks if c.status == doctor.FAIL]
    if as_json:
        sys.stdout.write(json.dumps({"ok": not failed, "checks": doctor.as_json(checks)}, indent=2) + "\n")
        return 1 if failed else 0
    # Status and name never wrap, the detail wraps at spaces; each fix command is printed whole on its own line
    # below the table (four columns broke paths and commands mid-word at 80 columns).
    table = Table(title="rlctl doctor", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail")
    for c in checks:
        table.add_row(STATUS_STYLE[c.status], escape(c.name), escape(c.detail))
    tables.show(ui.results(), table)
    for c in checks:
        if c.fix:
            ui.results().print(f"[bold]fix {escape(c.name)}:[/] {escape(c.fix)}", soft_wrap=True)
        elif c.install:  # a command in the detail cell wrapped at its spaces
            ui.results().print(f"[bold]install {escape(c.name)} (optional):[/] {escape(c.install)}", soft_wrap=True)
    if failed:
        ui.results().print(
            f"[bold red]{len(failed)} problem(s).[/] Run the fix command(s) above, then rlctl doctor again."
        )
        if ui.verbose:
            for c in failed:
                ui.console.print(f"  {c.fix}", markup=False)
        return 1
    warned = sum(c.status == doctor.WARN for c in checks)
    ui.results().print("[green]Ready.[/]" + (f" {warned} warning(s) above." if warned else ""))
    return 0


# -------------------------------------------------------------------------------------------- verify
def _harmless_extras(folder: Path) -> list[str]:
    """The files beside an export that its manifest does not list and no model load reads (a README, notes)."""
    from rlctl.checkpoint import verify

    return verify.unrecorded(folder)[1] if verify.is_export(folder) else []


def verify_command(ui: UI, run_dir: Path, as_json: bool) -> int:
    """`rlctl verify`: one line per checkpoint, final folder and export of a run, or one for an export folder; 1
    when any is damaged."""
    from rlctl.checkpoint import verify
    from rlctl.checkpoint.safewrite import listed

    is_run = RunDir(run_dir).is_run()
    if is_run:
        checks = verify.verify_run(run_dir)
    elif verify.is_export(run_dir):
        checks = [(str(run_dir), verify.verify_export(run_dir))]
    else:
        raise UserError(
            f"{run_dir} is neither a run directory (no config.yaml) nor a folder written by `rlctl export` (no "
            f"{verify.MANIFEST})."
        )
    damaged = [name for name, problems in checks if problems]
    extras = {name: _harmless_extras(run_dir / name if is_run else run_dir) for name, _ in checks}
    if as_json:
        report = [
            {"path": name, "intact": not problems, "problems": problems, "not_written_by_rlctl": extras[name]}
            for name, problems in checks
        ]
        sys.stdout.write(json.dumps({"ok": not damaged, "checked": report}, indent=2) + "\n")
        return 1 if damaged else 0
    for name, problems in checks:
        mark = "[green]intact[/]" if not problems else "[red]damaged[/]: " + escape("; ".join(problems))
        also = f" (also holds {escape(listed(extras[name]))}, not written by rlctl; no model load reads them)"
        ui.results().print(f"{escape(name)}: {mark}{also if extras[name] else ''}")
    if not checks:
        ui.results().print(f"{escape(str(run_dir))} holds no checkpoint, final folder or export yet.")
    elif damaged and not is_run:
        ui.results().print("[red]Damaged.[/] Export it again with `rlctl export RUN_DIR --out FOLDER`.")
    elif damaged:
        ui.results().print(
            f"[red]{len(damaged)} of {len(checks)} damaged.[/] `rlctl resume {escape(str(run_dir))}` falls back to the "
            "newest intact checkpoint; re-export a damaged export with `rlctl export`."
        )
    else:
        ui.results().print(f"[green]All {len(checks)} intact.[/]")
    return 1 if damaged else 0
