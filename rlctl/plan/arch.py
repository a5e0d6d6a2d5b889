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

from rlctl.config import ModelArch, RunConfig
from rlctl.config.sections import BUILTIN_MODELS, VisionArch
from rlctl.errors import UserError
from rlctl.plan import gguf
from rlctl.plan.parts import Noted

DENSE = {"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "phi", "olmo2", "granite"}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
# vision-language models whose vision tower the planner models (Qwen2-VL's design, Gemma 3's SigLIP), and their text
# model_type
VISION_LANGUAGE = {"qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text", "gemma3": "gemma3_text"}
# what transformers 5.17 reads where a Gemma 3 config.json leaves a number out (Gemma3TextConfig's, and
# SiglipVisionConfig's and Gemma3Config's defaults): google/gemma-3-*-it's files omit several
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
}
SIGLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 16,
}
GEMMA3_TOKENS_PER_IMAGE = 256
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


def vision_from_config(vision: dict[str, Any], top: dict[str, Any] | None = None) -> VisionArch:
    """The vision tower's numbers from a Qwen2-VL / Qwen2.5-VL config.json's vision_config. Qwen2-VL's width is
    `embed_dim` (its `hidden_size` is the language model's) and its MLP two matrices of mlp_ratio x width, read as
    the planner's three-matrix MLP of 2/3 that size (as Phi's). A Gemma 3 config's SigLIP tower (`top`: the whole
    config, whose mm_tokens_per_image it pools into)."""
    if (top or {}).get("model_type") == "gemma3":
        v = SIGLIP_DEFAULTS | vision
        return VisionArch(
            kind="siglip",
            layers=v["num_hidden_layers"],
            hidden=v["hidden_size"],
            heads=v["num_attention_heads"],
            intermediate=v["intermediate_size"],
            patch=v["patch_size"],
            image_size=v["image_size"],
            tokens_per_image=(top or {}).get("mm_tokens_per_image") or GEMMA3_TOKENS_PER_IMAGE,
        )
    hidden = vision.get("embed_dim") or vision["hidden_size"]
    intermediate = vision.get("intermediate_size") or int(hidden * vision.get("mlp_ratio", 4)) * 2 // 3
    return VisionArch(
        layers=vision["depth"],
        hidden=hidden,
        heads=vision["num_heads"],
        intermediate=intermediate,
        patch=vision.get("patch_size", 14),
        merge=vision.get("spatial_merge_size", 2),
        temporal_patch=vision.get("temporal_patch_size", 2),
    )


def arch_from_config(config: dict[str, Any], source: str) -> ModelArch:
    """The planner's numbers from a transformers config.json (text configs of multimodal models included; a
    Qwen2-VL / Qwen2.5-VL config's text numbers at the top level or under text_config, its vision_config too)."""
    top = config
    vision_language = top.get("model_type") in VISION_LANGUAGE and isinstance(top.get("vision_config"), dict)
    if vision_language:  # the text numbers: text_config's over the top level's (transformers 5 nests them)
        outer = {k: v for k, v in top.items() if k != "text_config"}
        config = {**outer, **(top.get("text_config") or {}), "model_type": "qwen2"}
        if top["model_type"] == "gemma3":  # the text numbers under text_config alone, transformers' defaults filled
            tied = {k: top[k] for k in ("tie_word_embeddings",) if k in top}
            config = GEMMA3_TEXT_DEFAULTS | tied | (top.get("text_config") or {}) | {"model_type": "gemma3_text"}
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
        vision=vision_from_config(top["vision_config"], top) if vision_language else None,
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
        cfg = with_model_pixels(cfg, found)
    return _with_arch(cfg, real, str(path), where)


def pixel_bounds(preprocessor: dict[str, Any]) -> tuple[int | None, int | None]:
    """A Qwen2-VL-family image processor's resize bounds (min_pixels, max_pixels), as its processor reads them:
    the `min_pixels` / `max_pixels` keys (the models' own files), else transformers 5's `size` (`shortest_edge`,
    `longest_edge`); None where neither says."""
    size = preprocessor.get("size") if isinstance(preprocessor.get("size"), dict) else {}
    low = preprocessor.get("min_pixels") or size.get("shortest_edge")
    high = preprocessor.get("max_pixels") or size.get("longest_edge")
    return (low if isinstance(low, int) else None, high if isinstance(high, int) else None)


def with_model_pixels(cfg: RunConfig, preprocessor: Path | None) -> RunConfig:
    """`cfg` with data.min_pixels / data.max_pixels, where unset, taken from the model's preprocessor_config.json
    (what its processor resizes within at run time, and so what the planner counts image tokens with)."""
    if preprocessor is None or (cfg.data.min_pixels is not None and cfg.data.max_pixels is not None):
        return cfg
    try:
        low, high = pixel_bounds(json.loads(preprocessor.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):  # unreadable: the processor's own defaults, as before
        return cfg
    update = {"min_pixels": cfg.data.min_pixels or low, "max_pixels": cfg.data.max_pixels or high}
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=update)})


def _with_arch(cfg: RunConfig, real: ModelArch, source: str, where: str) -> Noted[tuple[RunConfig, str]]:
    """`cfg` planning `real` (read from `source`, described as `where`), with a warning when the preset's
    model.arch said otherwise."""
    preset, warnings = cfg.model.arch, ()
    if preset is not None and preset != real:
        keys = [k for k in type(real).model_fields if getattr(preset, k) != getattr(real, k)]
        differ = ", ".join(f"{k} {getattr(preset, k)} -> {getattr(real, k)}" for k in keys)
        warnings = (f"model.arch from {source} differs from the preset's ({differ}): planning the real one",)
    model = cfg.model.model_copy(update={"arch": real})
    return Noted((cfg.model_copy(update={"model": model}), where), warnings)


def vision_stages_problem(cfg: RunConfig) -> str | None:
    """Why a vision-language model cannot train the configured stages (None: it can). rlctl trains one with the sft
    and rl stages: the rm, dpo and kto stages' TRL trainers take text (transformers 5.17 has no
    sequence-classification class for the Qwen2-VL family)."""
    text_only = [s for s in cfg.stages if s in ("rm", "dpo", "kto")]
    if cfg.model.arch is None or cfg.model.arch.vision is None or not text_only:
        return None
    return (
        f"{cfg.model.name_or_path} is a vision-language model (model.arch.vision), which rlctl trains with the sft "
        f"and rl stages only; the {', '.join(text_only)} stage cannot train it. Set stages=[sft, rl] (PPO's critic "
        "starts from the policy: rl.critic.init=policy). See docs/vlm.md."
    )
