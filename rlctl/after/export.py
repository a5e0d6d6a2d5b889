"""Export a run's final policy as a Hugging Face folder with a model card, and optionally push it to the Hub."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlctl import strictjson
from rlctl.after.card import model_card, on_hub
from rlctl.checkpoint import safewrite, verify
from rlctl.config import RunConfig
from rlctl.errors import UserError
from rlctl.plan import final_policy
from rlctl.rundir import RunDir, Summary, read_summary


@dataclass
class Source:
    """What an export reads from a run: its config, its summary (empty when damaged), and a note saying what was
    done instead when summary.json is damaged."""

    config: RunConfig
    summary: Summary
    note: str = ""


def _intact_finals(run_dir: Path, cfg: RunConfig) -> list[str]:
    """The stages whose final folder is in place and intact: what finished, when summary.json cannot say."""
    from rlctl.checkpoint.integrity import folder_problems

    finals = {s: RunDir(run_dir).final(s) for s in cfg.stages}
    return [s for s, f in finals.items() if f.is_dir() and not folder_problems(f, None)]


def _run(run_dir: Path) -> Source:
    cfg = verify.run_config(run_dir)
    try:
        return Source(cfg, read_summary(run_dir))
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
        return Source(cfg, Summary(completed=finished), note)


def adapter_source(run_dir: Path, cfg: RunConfig, stage: str) -> Path:
    """The LoRA adapter of a finished stage: its last complete checkpoint (the final folder holds merged
    weights). Only an adapter trained directly on the base model can stand alone on the Hub."""
    from rlctl.checkpoint import complete_checkpoints

    ckpts = [
        c
        for c in complete_checkpoints(RunDir(run_dir).checkpoints(stage))
        if (c / "adapter_config.json").is_file() and not verify.checkpoint_problems(c)
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
    starts_from_base = base in (cfg.model.name_or_path, str(RunDir(run_dir).base)) or Path(base) == RunDir(run_dir).base
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
    stage, src = final_policy(run_dir, cfg, summary.completed)
    src, fallback = intact_source(run_dir, stage, src)
    ckpt = adapter_source(run_dir, cfg, stage) if adapter else None  # refuse before loading anything
    safewrite.check_target(out, kind(adapter), force)
    with safewrite.lock(out, "export"):
        stale = safewrite.drop_stale(out)
        tmp = safewrite.staging(out)
        try:
            _write(tmp, cfg, src, ckpt)
            card = model_card(cfg, summary, stage, repo_id=repo_id, adapter=adapter, where=str(out.resolve()))
            (tmp / "README.md").write_text(card)
            safewrite.publish(tmp, out, kind(adapter), force)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out, " ".join(n for n in (source.note, fallback, stale) if n)


def card_text(run_dir: Path, out: Path, adapter: bool = False, repo_id: str | None = None) -> str:
    """The model card `export` would write into `out`, nothing written (what `rlctl ui` shows before it exports)."""
    source = _run(run_dir)
    stage, _ = final_policy(run_dir, source.config, source.summary.completed)
    return model_card(source.config, source.summary, stage, repo_id=repo_id, adapter=adapter, where=str(out.resolve()))


def intact_source(run_dir: Path, stage: str, final: Path) -> tuple[Path, str]:
    """The folder to export `stage` from: its final folder when intact, else its newest intact checkpoint that is a
    model folder (TRL's stages save one; rlctl's RL loop saves training state, which `rlctl resume` turns back into
    a final folder), with a note saying so; a DamagedFile naming the damage and the way out when neither is left
    (weights are never copied damaged)."""
    from rlctl.checkpoint import complete_checkpoints
    from rlctl.checkpoint.integrity import folder_problems

    problems = folder_problems(final, None)
    if not problems:
        return final, ""
    shown = "; ".join(problems[:2]) + (f" and {len(problems) - 2} more" if len(problems) > 2 else "")
    intact = [c for c in complete_checkpoints(RunDir(run_dir).checkpoints(stage)) if not verify.checkpoint_problems(c)]
    for ckpt in reversed(intact):
        if (ckpt / "config.json").is_file():
            return ckpt, (
                f"{final} is damaged ({shown}); exported the newest intact {stage} checkpoint instead, {ckpt} "
                f"(it may be older than the stage's end). `rlctl verify {run_dir}` lists every damaged folder."
            )
    if intact:  # the RL loop's training state: resume re-creates the final folder from it
        works = (
            f"Its newest intact checkpoint, {intact[-1].name}, holds training state, not a model: move {final} "
            f"away, then `rlctl resume {run_dir}` re-creates the final folder from that checkpoint, and export again."
        )
    else:
        works = f"No intact {stage} checkpoint is left to export instead; `rlctl verify {run_dir}` lists what is left."
    raise strictjson.DamagedFile(final, shown, works)


COPIED = ("*.safetensors", "*.safetensors.index.json", "*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken", "*.py")
NOT_COPIED = ("training_args.json", "trainer_state.json", safewrite.MANIFEST)  # records, not part of a model


def copyable(src: Path) -> bool:
    """Whether `src` can be exported by copying its files: full weights in safetensors, no adapter to merge (the
    export never changes the dtype, so nothing else would change the weights)."""
    return (
        not (src / "adapter_config.json").exists()
        and (src / "config.json").is_file()
        and any(src.glob("*.safetensors"))
        and not any(src.glob("pytorch_model*.bin"))
    )


def _copy_folder(src: Path, tmp: Path) -> None:
    """The weights, config and tokenizer files of `src` copied byte for byte into `tmp`; a generation_config.json
    made from the model config when `src` has none (as `save_pretrained` would write it)."""
    for pattern in COPIED:
        for path in src.glob(pattern):
            if path.is_file() and path.name not in NOT_COPIED and not (tmp / path.name).exists():
                shutil.copy2(path, tmp / path.name)
    if not (tmp / "generation_config.json").exists():
        from transformers import GenerationConfig, PretrainedConfig

        config = PretrainedConfig.from_json_file(str(src / "config.json"))
        generation = GenerationConfig.from_model_config(config)
        if generation.to_diff_dict():
            generation.save_pretrained(tmp)


def _write(tmp: Path, cfg: RunConfig, src: Path, ckpt: Path | None) -> None:
    """The weights (the adapter of `ckpt`, the files of `src` copied when nothing changes them, or the merged
    model of `src`) and the tokenizer into `tmp`."""
    if ckpt is None and copyable(src):
        _copy_folder(src, tmp)
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    from rlctl.rollout import vision

    hf_logging.disable_progress_bar()
    remote = cfg.model.trust_remote_code
    if ckpt is not None:
        config = strictjson.read(ckpt / "adapter_config.json", "Export without --adapter to merge the final weights.")
        if on_hub(cfg.model.name_or_path):
            config["base_model_name_or_path"] = cfg.model.name_or_path
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        for weights in ckpt.glob("adapter_model.*"):
            shutil.copy2(weights, tmp / weights.name)
        AutoTokenizer.from_pretrained(src, trust_remote_code=remote).save_pretrained(tmp)
        processor = vision.processor_of(src, remote)
        if processor is not None:
            processor.save_pretrained(tmp)
        return
    processor = vision.processor_of(src, remote)  # a vision-language model's, exported beside it
    if (src / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(src, trust_remote_code=remote).merge_and_unload()
    else:
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText if processor is not None else AutoModelForCausalLM
        model = auto.from_pretrained(src, trust_remote_code=remote)
    tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=remote)
    if model.generation_config is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if processor is not None:
        processor.save_pretrained(tmp)


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
