"""The architecture numbers the memory planner works from, read from the model being trained.

A GGUF file (`rlctl.plan.gguf`) is planned from its header. Otherwise `model.name_or_path` is looked up as a local
folder (its config.json), a Hub id in the local Hugging Face cache, or - when online and HF_HUB_OFFLINE is not set -
by fetching config.json alone from the Hub (kilobytes, never the weights). A preset's `model.arch` is the offline
fallback; when the real config disagrees with it, the real config wins with a one-line warning. Pure Python, no
torch: `rlctl plan` stays fast.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rlctl import vision
from rlctl.config import ModelArch, RunConfig
from rlctl.config.sections import BUILTIN_MODELS, VisionArch
from rlctl.errors import UserError
from rlctl.plan import gguf
from rlctl.plan.parts import Noted

# dense decoders the planner models; with the language models of the vision-language families (rlctl.vision)
DENSE = {"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "phi3", "phi", "olmo2", "granite"}
DENSE |= vision.text_model_types()
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
FETCH_TIMEOUT_S = 3.0
CONFIG, PREPROCESSOR = "config.json", "preprocessor_config.json"


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloaded repositories (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the local cache: the snapshot refs/main points at, else any snapshot."""
    repo = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    found = sorted((repo / "snapshots").glob("*/config.json")) if repo.is_dir() else []
    return found[-1] if found else None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def fetch_config(repo_id: str, name: str = CONFIG) -> Path | None:
    """One JSON file of a Hub repository (config.json, or a VLM's preprocessor_config.json), one attempt with a
    short timeout, kept in ~/.cache/rlctl/configs for the next plan; None when it cannot be had (offline, unknown or
    gated repository)."""
    if offline() or repo_id.count("/") != 1:
        return None
    keep = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "rlctl" / "configs"
    path = keep / f"{repo_id.replace('/', '--')}{'' if name == CONFIG else '.' + name.removesuffix('.json')}.json"
    failed = path.with_suffix(".unreachable")  # a failed attempt is not repeated for an hour
    if path.is_file():
        return path
    if failed.is_file() and time.time() - failed.stat().st_mtime < 3600:
        return None
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{repo_id}/resolve/main/{name}")
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
            text = response.read(1 << 20).decode("utf-8")
        json.loads(text)
    except (OSError, ValueError):
        keep.mkdir(parents=True, exist_ok=True)
        failed.touch()
        return None
    keep.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def locate(name_or_path: str) -> tuple[Path | None, str]:
    """(config.json, where it came from) for a folder or Hub id; (None, why) when there is none to read."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        config = folder / "config.json"
        return (config, str(config)) if config.is_file() else (None, f"{folder} has no config.json")
    cached = cached_config(name_or_path)
    if cached is not None:
        return cached, f"Hugging Face cache ({cached})"
    fetched = fetch_config(name_or_path)
    if fetched is not None:
        return fetched, f"the Hub ({name_or_path}/config.json)"
    return None, "not in the local Hugging Face cache" + (" (HF_HUB_OFFLINE is set)" if offline() else "")


def arch_from_config(config: dict[str, Any], source: str) -> ModelArch:
    """The planner's numbers from a transformers config.json (text configs of multimodal models included). A
    vision-language model's (a vision_config) is read by its family (`rlctl.vision`): its language model's numbers
    and its tower's; a vision-language model of a family rlctl does not train is refused by name."""
    top = config
    family = None
    if isinstance(top.get("vision_config"), dict):
        family = vision.of_model_type(top.get("model_type"), source)
        config = family.text_config(top)
    else:
        config = config.get("text_config") or config
    kind = config.get("model_type", "")
    if any(config.get(k) for k in MOE_KEYS):
        raise UserError(
            f"Invalid model: {source} is a mixture-of-experts model ({kind}); rlctl's memory planner models dense "
            "decoder models only (Qwen2/Qwen3, Llama, Mistral, Gemma, Phi). Plan a dense model, or set "
            "model.arch by hand to an equivalent dense shape at your own risk."
        )
    if kind not in DENSE:
        raise UserError(
            f"Invalid model: {source} has model_type '{kind}', which rlctl's memory planner does not model; "
            f"supported: {', '.join(sorted(DENSE))}. Set model.arch to the model's numbers to plan it anyway."
        )
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    intermediate = config["intermediate_size"]
    if kind == "phi":  # Phi-1/2: a two-matrix GELU MLP; 2 of the planner's 3 SwiGLU matrices hold its weights
        intermediate = intermediate * 2 // 3
    return ModelArch(
        layers=config["num_hidden_layers"],
        hidden=hidden,
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        vocab=config["vocab_size"],
        intermediate=intermediate,
        max_position=config.get("max_position_embeddings", 32768),
        tie_embeddings=bool(config.get("tie_word_embeddings", kind.startswith("gemma"))),
        head_dim=config["head_dim"] if config.get("head_dim") not in (None, hidden // heads) else None,
        vision=VisionArch(**family.tower_config(top)) if family is not None else None,
    )


def resolve(cfg: RunConfig) -> Noted[tuple[RunConfig, str]]:
    """`cfg` with model.arch taken from the model itself where it can be read, and where the numbers came from."""
    preset = cfg.model.arch
    if cfg.model.name_or_path in BUILTIN_MODELS:
        return Noted((cfg, f"the preset ({cfg.model.name_or_path})"))
    if gguf.is_gguf(cfg.model):
        file = gguf.locate(cfg.model)
        return _with_arch(cfg, gguf.header(file).arch, str(file), f"the GGUF header ({file.name})")
    name = cfg.model.name_or_path
    path, where = locate(name)
    if path is None:
        if preset is None:
            return Noted((cfg, f"none: {cfg.model.name_or_path} {where}, and no model.arch is set"))
        return Noted((cfg, f"the preset's model.arch ({cfg.model.name_or_path} {where})"))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        real = arch_from_config(data, str(path))
    except (KeyError, ValueError) as e:
        raise UserError(f"Invalid model: {path} is not a transformers config.json (no {e}).") from None
    if real.vision is not None:  # beside config.json (a folder, the cache), else from the Hub as config.json came
        beside = path.with_name(PREPROCESSOR)
        found = (beside if beside.is_file() else None) if path.name == CONFIG else fetch_config(name, PREPROCESSOR)
        cfg = with_model_pixels(cfg, found, vision.of_tower(real.vision))
    return _with_arch(cfg, real, str(path), where)


def with_model_pixels(cfg: RunConfig, preprocessor: Path | None, family: vision.Family) -> RunConfig:
    """`cfg` with data.min_pixels / data.max_pixels, where unset, taken from the model's preprocessor_config.json
    as its `family` reads it (what its processor resizes within at run time, and so what the planner counts image
    tokens with)."""
    if preprocessor is None or (cfg.data.min_pixels is not None and cfg.data.max_pixels is not None):
        return cfg
    try:
        low, high = family.preprocessor_bounds(json.loads(preprocessor.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):  # unreadable: the processor's own defaults, as before
        return cfg
    update = {"min_pixels": cfg.data.min_pixels or low, "max_pixels": cfg.data.max_pixels or high}
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=update)})


def _with_arch(cfg: RunConfig, real: ModelArch, source: str, where: str) -> Noted[tuple[RunConfig, str]]:
    """`cfg` planning `real` (read from `source`, described as `where`), with a warning when the preset's
    model.arch said otherwise."""
    preset, warnings = cfg.model.arch, tuple[str, ...]()
    if preset is not None and preset != real:
        keys = [k for k in type(real).model_fields if getattr(preset, k) != getattr(real, k)]
        differ = ", ".join(f"{k} {getattr(preset, k)} -> {getattr(real, k)}" for k in keys)
        warnings = (f"model.arch from {source} differs from the preset's ({differ}): planning the real one",)
    model = cfg.model.model_copy(update={"arch": real})
    return Noted((cfg.model_copy(update={"model": model}), where), warnings)


def vision_stages_problem(cfg: RunConfig) -> str | None:
    """Why a vision-language model cannot train the configured stages (None: it can): its family says which stages
    train it (`rlctl.vision`; the rm, dpo and kto stages' TRL trainers take text, and transformers 5.17 has no
    sequence-classification class for these models)."""
    family = vision.of_arch(cfg.model.arch)
    untrained = [s for s in cfg.stages if family is not None and s not in family.stages]
    if not untrained:
        return None
    return (
        f"{cfg.model.name_or_path} is a vision-language model (model.arch.vision), which rlctl trains with the "
        f"{' and '.join(family.stages)} stages only; the {', '.join(untrained)} stage cannot train it. Set "
        f"stages=[{', '.join(family.stages)}] (PPO's critic starts from the policy: rl.critic.init=policy). See "
        "docs/vlm.md."
    )
