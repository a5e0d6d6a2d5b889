"""What `rlctl rewards list` and `rlctl rewards test` do and print."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from rlctl import tables
from rlctl.cli.cockpit import UI, fmt
from rlctl.errors import UserError
from rlctl.rundir import RunDir


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
            from rlctl.evaluation import evaluate

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
