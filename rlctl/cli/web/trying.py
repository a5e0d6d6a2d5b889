"""Trying a run's model from `rlctl ui`, as plain data: the folders it can load, the chat's answer generated as
`rlctl eval` generates (the run's own prompt format: plain text for a run trained on text prompts, the chat template
with the whole conversation only for a run trained on message lists), an example prompt from the run's task, the
latest `rlctl eval` result, and the model card an export writes. No UI library here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.cli.web.paths import inside
from rlctl.cli.web.watch import served_run_config
from rlctl.errors import UserError
from rlctl.rundir import RunDir, eval_samples


def model_folders(root: Path, run_dir: Path) -> list[str]:
    """What the chat box can load from a run: each policy stage's final folder, then its checkpoints, newest first,
    and the run's exports."""
    from rlctl.checkpoint import complete_checkpoints
    from rlctl.plan.planner import POLICY_STAGES

    base = RunDir(root / run_dir)
    found: list[Path] = []
    for stage in POLICY_STAGES:
        found += [base.final(stage)] if base.final(stage).is_dir() else []
        found += reversed(complete_checkpoints(base.checkpoints(stage)))
    found += [d for d in (base.export(), base.export("gguf")) if (d / "config.json").is_file()]
    return [d.relative_to(root).as_posix() for d in found]


def run_of(root: Path, folder: Path) -> Path | None:
    """The run directory (relative to `root`) a model folder lies in, if any."""
    for parent in [folder, *folder.parents]:
        if parent == Path("."):
            return None
        if RunDir(root / parent).is_run():
            return parent
    return None


@dataclass(frozen=True)
class TaskFormat:
    """How a run's prompts look: as text (`chat` False: the prompt is the user's text as is, no template) or as
    message lists (`chat`: the conversation through the chat template); an example prompt from its held-out data,
    and the completion length `rlctl eval` uses for it."""

    chat: bool
    example: str
    max_new_tokens: int | None


PLAIN = TaskFormat(False, "", None)


def task_format(root: Path, run_dir: Path | None) -> TaskFormat:
    """The prompt format of a run's task (its held-out data, else its RL or SFT data), read as `rlctl eval` reads it."""
    from rlctl import data
    from rlctl.config import presets
    from rlctl.plan import planner

    if run_dir is None:
        return PLAIN
    cfg = served_run_config(root, run_dir)
    paths = planner.data_paths(cfg, root / run_dir)
    for role in reversed(presets.DATA_FILES):  # held-out rows first: what `rlctl eval` scores
        path = paths.get(role)
        if path is None or not (path if path.is_absolute() else root / path).exists():
            continue
        try:  # a stage's role (held-out rows read as RL's) has its columns; the preference role data.columns
            columns = data.stage_columns(cfg, role)
        except AttributeError:
            columns = dict(cfg.data.columns)
        rows, _ = data.sample(str(path), role, cfg.data.answer_field, columns, cfg.data.encoding)
        prompt = rows[0].get("prompt") if rows else None
        if isinstance(prompt, list):
            last = next((m.get("content") for m in reversed(prompt) if m.get("role") == "user"), "")
            return TaskFormat(True, last if isinstance(last, str) else "", cfg.rl.max_new_tokens)
        if isinstance(prompt, str):
            return TaskFormat(False, prompt, cfg.rl.max_new_tokens)
    return TaskFormat(False, "", cfg.rl.max_new_tokens)


@dataclass
class Loaded:
    """The model the chat box talks to (one at a time, loaded on first use) and its run's prompt format."""

    folder: str = ""
    model: Any = None
    tokenizer: Any = None
    task: TaskFormat = PLAIN


@dataclass(frozen=True)
class Sampling:
    """The chat's settings: a system prompt (chat runs), temperature (0: greedy, as `rlctl eval`), top-p, length."""

    system: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 32


def load(root: Path, loaded: Loaded, folder: str) -> Loaded:
    """The model of `folder` (a folder of the served folder), loaded once, with its run's prompt format."""
    from rlctl.evaluation import evaluate

    rel = inside(root, folder, "model folder")
    if loaded.folder != rel.as_posix():
        if not (root / rel / "config.json").is_file() and not (root / rel / "adapter_config.json").is_file():
            raise UserError(f"{folder} holds no model (no config.json): pick one of the run's models.")
        loaded.task = task_format(root, run_of(root, rel))
        loaded.model, loaded.tokenizer = evaluate.load_causal_lm(root / rel, evaluate.default_device())
        loaded.folder = rel.as_posix()
    return loaded


def prompt_of(task: TaskFormat, history: list[dict], text: str, system: str) -> Any:
    """What the model is given, as `rlctl eval` gives it the run's rows: a text run gets the text alone (a system
    prompt, if any, before it); a chat run gets the whole conversation as messages."""
    if not task.chat:
        return f"{system}\n{text}" if system else text
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, *history, {"role": "user", "content": text}]


def reply(root: Path, loaded: Loaded, folder: str, history: list[dict], text: str, how: Sampling) -> str:
    """The model's answer to `text` after `history`, generated as `rlctl eval` generates (greedy at temperature 0)."""
    from rlctl.evaluation import evaluate

    load(root, loaded, folder)
    prompt = prompt_of(loaded.task, history, text, how.system)
    temperature = how.temperature if how.temperature > 0 else None
    texts, _ = evaluate.sample(
        loaded.model, loaded.tokenizer, [prompt], how.max_new_tokens, 1, temperature, how.top_p, batch_size=1
    )
    return texts[0][0]


# ------------------------------------------------------------------------------------------------ eval results
@dataclass(frozen=True)
class EvalShown:
    """The latest `rlctl eval` result of a run: its metrics table and a few of its samples."""

    path: str = ""
    metrics: list[list[object]] = field(default_factory=list)
    samples: list[list[object]] = field(default_factory=list)


EVAL_METRICS = ("accuracy", "mean_reward", "mean_response_tokens", "prompts", "samples_per_prompt", "decoding")
SAMPLE_COLUMNS = ["prompt", "answer", "completion", "correct", "reward"]
SAMPLES_SHOWN = 8


def latest_eval(root: Path, run_dir: Path) -> EvalShown:
    """The newest result `rlctl eval` wrote into the run (RUN/eval/*.json) and its first samples."""
    from rlctl import strictjson

    folder = RunDir(root / run_dir).eval("x").parent
    results = [p for p in folder.glob("*.json")] if folder.is_dir() else []
    if not results:
        return EvalShown()
    newest = max(results, key=lambda p: p.stat().st_mtime)
    try:
        found = strictjson.read(newest)
    except strictjson.DamagedFile as e:
        return EvalShown(newest.relative_to(root).as_posix(), [["error", str(e)]])
    keys = [k for k in found if k in EVAL_METRICS or k.startswith(("pass@", "reward/"))]
    metrics = [[k, found[k]] for k in sorted(keys, key=lambda k: (k not in EVAL_METRICS[:2], k))]
    samples = []
    lines = eval_samples(newest)
    if lines.is_file():
        import json

        with lines.open(encoding="utf-8", errors="replace") as f:
            for line, _ in zip(f, range(SAMPLES_SHOWN), strict=False):
                try:
                    s = json.loads(line)
                    samples.append([str(s["prompt"]), str(s["answer"]), s["completions"][0], s["correct"][0],
                                    s["reward"][0]])  # fmt: skip
                except (ValueError, KeyError, IndexError, TypeError):
                    continue
    return EvalShown(newest.relative_to(root).as_posix(), metrics, samples)


def card(run_dir: Path, out: Path, repo_id: str | None) -> str:
    """The model card `rlctl export` writes, before anything is written."""
    from rlctl.after import export

    return export.card_text(run_dir, out, repo_id=repo_id or None)
