"""Export a run's final policy as a Hugging Face folder with a model card, and optionally push it to the Hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlctl.config import RunConfig, load_run_config
from rlctl.errors import UserError
from rlctl.plan import final_dir

POLICY_STAGES = ("rl", "dpo", "sft")  # latest first: the policy a run ends with


def final_policy(run_dir: Path, cfg: RunConfig, completed: list[str]) -> tuple[str, Path]:
    """(stage, folder) of the last policy stage that finished."""
    for stage in POLICY_STAGES:
        folder = final_dir(run_dir, stage)
        if stage in cfg.stages and stage in completed and folder.is_dir():
            return stage, folder
    raise UserError(
        f"{run_dir} has no finished policy stage to export (finished: {', '.join(completed) or 'none'}). "
        f"Finish it with `rlctl resume {run_dir}`."
    )


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


def model_card(cfg: RunConfig, summary: dict, stage: str) -> str:
    """A README.md model card: base model, stages, algorithm, key hyper-parameters, final metrics."""
    base = cfg.model.name_or_path
    algo = cfg.rl.algorithm if "rl" in cfg.stages else stage
    front = ["---", "library_name: transformers", f"tags: [rlctl, {', '.join(cfg.stages)}, {algo}]"]
    if not base.startswith("builtin:") and not Path(base).exists():
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
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
    ]
    return "\n".join(lines)


def export(run_dir: Path, out: Path) -> Path:
    """Write the final policy (LoRA merged), tokenizer, generation config and model card to `out`."""
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml).")
    cfg = load_run_config(cfg_path)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"stages": {}, "completed": []}
    stage, src = final_policy(run_dir, cfg, summary.get("completed", []))

    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    remote = cfg.model.trust_remote_code
    if (src / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(src, trust_remote_code=remote).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(src, trust_remote_code=remote)
    tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=remote)
    if model.generation_config is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "README.md").write_text(model_card(cfg, summary, stage))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def push(folder: Path, repo_id: str, private: bool = False) -> str:
    """Upload an exported folder to the Hub (creating the repo); returns the repo URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message="Upload model exported by rlctl"
    )
    return str(url)
