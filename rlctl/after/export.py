"""Export a run's final policy as a Hugging Face folder with a model card, and optionally push it to the Hub."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlctl import strictjson
from rlctl.checkpoint import safewrite, verify
from rlctl.config import RunConfig
from rlctl.errors import UserError
from rlctl.plan import final_policy


def _hyperparameters(cfg: RunConfig, stage: str) -> dict[str, object]:
    sc = getattr(cfg, stage)
    keys = ["max_steps", "learning_rate", "batch_size", "lr_scheduler"]
    if stage == "rl":
        keys = [
            "algorithm",
            "max_steps",
            "learning_rate",
            "prompts_per_step",
            "group_size",
            "beta",
            "clip_low",
            "clip_high",
            "temperature",
            "max_new_tokens",
        ]
    elif stage == "dpo":
        keys += ["beta", "loss_type"]
    return {k: getattr(sc, k) for k in keys if hasattr(sc, k)}


def _on_hub(name: str) -> bool:
    return not name.startswith("builtin:") and not Path(name).exists()


def model_card(cfg: RunConfig, summary: dict, stage: str, repo_id: str | None = None, adapter: bool = False) -> str:
    """A README.md model card: base model, stages, algorithm, key hyper-parameters, final metrics, and how to
    load it (from `repo_id` once pushed; as a PEFT adapter on its base model when `adapter`)."""
    base = cfg.model.name_or_path
    algo = cfg.rl.algorithm if "rl" in cfg.stages else stage
    library = "peft" if adapter else "transformers"
    front = ["---", f"library_name: {library}", f"tags: [rlctl, {', '.join(cfg.stages)}, {algo}]"]
    if _on_hub(base):
        front.append(f"base_model: {base}")
    front.append("---")
    lines = [
        *front,
        "",
        f"# {cfg.name}",
        "",
        cfg.description or "Post-trained with rlctl.",
        "",
        f"- **Base model:** {base}",
        f"- **Stages:** {' -> '.join(cfg.stages)}",
        f"- **Algorithm:** {algo}",
        f"- **Seed:** {cfg.seed}",
        "",
        "## Hyper-parameters",
        "",
    ]
    for st in cfg.stages:
        params = ", ".join(f"{k}={v}" for k, v in _hyperparameters(cfg, st).items())
        lines.append(f"- `{st}`: {params}")
    lines += ["", "## Held-out metrics", "", "| stage | metric | value |", "| --- | --- | --- |"]
    for st, metrics in summary.get("stages", {}).items():
        for k, v in metrics.items():
            lines.append(f"| {st} | {k} | {v:.4f} |" if isinstance(v, float) else f"| {st} | {k} | {v} |")
    where = repo_id or "PATH"
    if adapter:
        lines += [
            "",
            "## Use",
            "",
            f"A LoRA adapter (rank {cfg.model.lora_r}, alpha {cfg.model.lora_alpha}) on `{base}`:",
            "",
            "```python",
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer",
            f'model = AutoPeftModelForCausalLM.from_pretrained("{where}")  # loads the base, applies the adapter',
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
            "model = model.merge_and_unload()  # optional: plain transformers weights",
            "```",
            "",
        ]
    else:
        lines += [
            "",
            "## Use",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'model = AutoModelForCausalLM.from_pretrained("{where}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
            "```",
            "",
        ]
    return "\n".join(lines)


@dataclass
class Source:
    """What an export reads from a run: its config, its summary (empty when damaged), and a note saying what was
    done instead when summary.json is damaged."""

    config: RunConfig
    summary: dict
    note: str = ""


def _intact_finals(run_dir: Path, cfg: RunConfig) -> list[str]:
    """The stages whose final folder is in place and intact: what finished, when summary.json cannot say."""
    from rlctl.checkpoint.integrity import folder_problems
    from rlctl.plan import final_dir

    finals = {s: final_dir(run_dir, s) for s in cfg.stages}
    return [s for s, f in finals.items() if f.is_dir() and not folder_problems(f, None)]


def _run(run_dir: Path) -> Source:
    cfg = verify.run_config(run_dir)
    empty = {"stages": {}, "completed": []}
    try:
        return Source(cfg, strictjson.read(run_dir / "summary.json", missing=empty))
    except strictjson.DamagedFile as e:
        finished = _intact_finals(run_dir, cfg)
        if not finished:
            raise strictjson.DamagedFile(
                e.path,
                e.damage,
                f"No stage has an intact final folder to export instead; `rlctl verify {run_dir}` lists what is left.",
            ) from None
        note = (
            f"{e.path} is damaged ({e.damage}); exporting from the stages' final folders, which are intact "
            f"({', '.join(finished)}); the model card has no held-out metrics."
        )
        return Source(cfg, {"stages": {}, "completed": finished}, note)


def adapter_source(run_dir: Path, cfg: RunConfig, stage: str) -> Path:
    """The LoRA adapter of a finished stage: its last complete checkpoint (the final folder holds merged
    weights). Only an adapter trained directly on the base model can stand alone on the Hub."""
    from rlctl.checkpoint import complete_checkpoints
    from rlctl.plan import stage_dir

    ckpts = [
        c
        for c in complete_checkpoints(stage_dir(run_dir, stage) / "checkpoints")
        if (c / "adapter_config.json").is_file()
    ]
    if not ckpts:
        raise UserError(
            f"{run_dir}: stage {stage} trained no LoRA adapter (model.adapter was {cfg.model.adapter}); "
            "export the full weights without --adapter."
        )
    ckpt = ckpts[-1]
    state_path = ckpt / "trainer_state.json"
    if state_path.is_file():
        state = strictjson.read(state_path, "Export without --adapter to merge the final weights.")
        if state.get("global_step", 0) < state.get("max_steps", 0):
            raise UserError(
                f"The last {stage} adapter checkpoint ({ckpt.name}) is older than the stage's end (step "
                f"{state['max_steps']}); export without --adapter to get the final weights merged."
            )
    works = "Export without --adapter to merge the final weights."
    base = strictjson.read(ckpt / "adapter_config.json", works).get("base_model_name_or_path", "")
    starts_from_base = base in (cfg.model.name_or_path, str(run_dir / "base")) or Path(base) == run_dir / "base"
    if not starts_from_base and Path(base).resolve().is_relative_to(run_dir.resolve()):
        raise UserError(
            f"The {stage} adapter was trained on top of an earlier stage's weights ({base}), which are not on the "
            "Hub, so it cannot be loaded on its own; export without --adapter to merge it into full weights."
        )
    return ckpt


def kind(adapter: bool) -> str:
    """What an export folder holds, as its manifest records it."""
    return "adapter export" if adapter else "export"


def export(
    run_dir: Path, out: Path, adapter: bool = False, repo_id: str | None = None, force: bool = False
) -> tuple[Path, str]:
    """Write the final policy (LoRA merged, or with `adapter` the LoRA adapter alone), tokenizer, generation
    config and model card to `out`, through `safewrite` (the user's files in `out` are never touched; `force`
    writes next to them). Returns the folder and a note when summary.json was damaged (see `Source`)."""
    source = _run(run_dir)
    cfg, summary = source.config, source.summary
    stage, src = final_policy(run_dir, cfg, summary.get("completed", []))
    ckpt = adapter_source(run_dir, cfg, stage) if adapter else None  # refuse before loading anything
    safewrite.check_target(out, kind(adapter), force)
    with safewrite.lock(out, "export"):
        tmp = safewrite.staging(out)
        try:
            _write(tmp, cfg, src, ckpt)
            (tmp / "README.md").write_text(model_card(cfg, summary, stage, repo_id=repo_id, adapter=adapter))
            safewrite.publish(tmp, out, kind(adapter), force)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out, source.note


def _write(tmp: Path, cfg: RunConfig, src: Path, ckpt: Path | None) -> None:
    """The weights (the adapter of `ckpt`, or the merged model of `src`) and the tokenizer into `tmp`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    remote = cfg.model.trust_remote_code
    if ckpt is not None:
        config = strictjson.read(ckpt / "adapter_config.json", "Export without --adapter to merge the final weights.")
        if _on_hub(cfg.model.name_or_path):
            config["base_model_name_or_path"] = cfg.model.name_or_path
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        for weights in ckpt.glob("adapter_model.*"):
            shutil.copy2(weights, tmp / weights.name)
        AutoTokenizer.from_pretrained(src, trust_remote_code=remote).save_pretrained(tmp)
        return
    if (src / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(src, trust_remote_code=remote).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(src, trust_remote_code=remote)
    tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=remote)
    if model.generation_config is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)


def _hub_error(e: Exception, repo_id: str) -> UserError:
    """A one-paragraph error for a refused Hub call (the token is never part of it)."""
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        why = "the Hub refused the token (missing, expired, or without write access)"
        fix = "log in with `hf auth login` (or set HF_TOKEN to a write token); `rlctl doctor` shows the login state"
    elif status == 404:
        why, fix = "the repo or namespace was not found", "check the repo id (namespace/name) and your rights on it"
    elif status is None:
        why, fix = f"the Hub could not be reached ({type(e).__name__})", "check the network, HF_ENDPOINT and proxies"
    else:
        why, fix = f"the Hub answered {status}", "see the message above and retry"
    detail = str(e).splitlines()[0] if str(e) else ""
    return UserError(f"Could not push to {repo_id}: {why}. {detail} Fix: {fix}.")


def push(folder: Path, repo_id: str, private: bool = False, quiet: bool = False) -> str:
    """Create the Hub repo (if needed) and upload the exported folder with its model card; returns the repo URL.
    The token comes from HF_TOKEN or `hf auth login`, and is never printed."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import disable_progress_bars

    if quiet:
        disable_progress_bars()
    if repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise UserError(f"--push expects a repo id like namespace/name, got '{repo_id}'.")
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(
            folder_path=str(folder),
            repo_id=url.repo_id,
            repo_type="model",
            commit_message="Upload model exported by rlctl",
        )
    except Exception as e:
        if type(e).__module__.startswith(("huggingface_hub", "httpx", "requests")) or isinstance(e, OSError):
            raise _hub_error(e, repo_id) from None
        raise
    return str(url)
