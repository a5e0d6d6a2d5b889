"""The offline tiny models: a random-init Qwen2-architecture model (`builtin:tiny`), Qwen2.5-VL vision-language model
(`builtin:tiny-vlm`) or Gemma 3 vision-language model (`builtin:tiny-gemma3`, a SigLIP tower: `model.arch.vision.kind`
siglip), each VLM with its processor, and a BPE tokenizer trained locally.

The tokenizer is trained with Qwen2's own pre-tokenizer regex, so reloading it through AutoTokenizer
(which rebuilds Qwen2's pre-tokenizer) tokenizes exactly as it was trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlctl.config import ModelArch
from rlctl.data.tokens import CHATML, CHATML_GEMMA3, EOS, GEMMA3_TOKENS, SPECIAL_TOKENS, VISION_TOKENS, train_bpe

# lets conversational data (chat `messages`, verl's message-list prompts, tools) train; it renders a
# vision-language prompt's image parts as Qwen2-VL's template does
CHAT_TEMPLATE = CHATML


def train_tokenizer(texts: list[str], vocab_size: int, named: dict[str, str] | None = None):
    """A Qwen2Tokenizer whose byte-level BPE was trained on `texts`; `named`: special tokens it names as attributes
    (Gemma 3's image tokens)."""
    from transformers import Qwen2Tokenizer

    tok = train_bpe(texts, vocab_size)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    extra = {"extra_special_tokens": named} if named else {}
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token=EOS, pad_token=EOS, **extra
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})  # one token each, as in Qwen2
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def model_tokenizer(arch: ModelArch, texts: list[str]):
    """The tokenizer of the built-in model of `arch`, trained on `texts`: a vision-language one's with the family's
    image tokens, and <|im_end|> its EOS as Qwen2.5-VL-Instruct's (a reply ends there)."""
    gemma3 = arch.vision is not None and arch.vision.kind == "siglip"
    tokenizer = train_tokenizer(texts, arch.vocab, GEMMA3_TOKENS if gemma3 else None)
    if arch.vision is not None:
        vision_tokens = [] if gemma3 else VISION_TOKENS  # Gemma 3's were named above
        tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:] + vision_tokens})
        tokenizer.eos_token = "<|im_end|>"
    return tokenizer


def build(
    out_dir: Path, arch: ModelArch, texts: list[str], seed: int, pixels: tuple[int | None, int | None] = (None, None)
) -> Path:
    """Write a random-init Qwen2 model and its tokenizer to `out_dir` (atomically); with `arch.vision` a Qwen2.5-VL
    model (a siglip tower: Gemma 3) and its processor (`pixels`: data.min_pixels / max_pixels); returns
    `out_dir`."""
    import torch
    from transformers import GenerationConfig

    gemma3 = arch.vision is not None and arch.vision.kind == "siglip"
    tokenizer = model_tokenizer(arch, texts)
    torch.manual_seed(seed)
    if arch.vision is None:
        model = _lm(arch, tokenizer)
    else:
        model = _gemma3(arch, tokenizer) if gemma3 else _vlm(arch, tokenizer)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if arch.vision is not None:
        (gemma3_processor(arch, tokenizer) if gemma3 else processor(arch, tokenizer, *pixels)).save_pretrained(tmp)
    else:
        tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def _lm(arch: ModelArch, tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**_text_config(arch, tokenizer), tie_word_embeddings=arch.tie_embeddings))


def _text_config(arch: ModelArch, tokenizer) -> dict:
    """The language model's numbers from `arch` and the tokenizer's special ids, as every tiny model's config
    takes them (the vocabulary grown to the tokenizer's added tokens; no BOS)."""
    return {
        "vocab_size": max(arch.vocab, len(tokenizer)),
        "hidden_size": arch.hidden,
        "intermediate_size": arch.intermediate,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
        "max_position_embeddings": arch.max_position,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
    }


def _vlm(arch: ModelArch, tokenizer):
    """A random-init Qwen2.5-VL model: the language model of `arch`, the vision tower of `arch.vision` (full
    attention in every block: the demo's images fit one window anyway)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    v = arch.vision
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = _text_config(arch, tokenizer) | {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope(arch)},
    }
    vision = {
        "depth": v.layers,
        "hidden_size": v.hidden,
        "intermediate_size": v.intermediate,
        "num_heads": v.heads,
        "patch_size": v.patch,
        "spatial_merge_size": v.merge,
        "temporal_patch_size": v.temporal_patch,
        "out_hidden_size": arch.hidden,
        "window_size": v.patch * v.merge * 4,
        "fullatt_block_indexes": list(range(v.layers)),
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=arch.tie_embeddings,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def _gemma3(arch: ModelArch, tokenizer):
    """A random-init Gemma 3 model: the language model of `arch` (its sliding window as long as the context, so every
    layer attends to it all), the SigLIP tower of `arch.vision` and the projector pooling its patches into
    `tokens_per_image` image tokens. transformers initialises the projection at zero; a random one here makes the
    random-init model read its images from the start, as the tiny Qwen2.5-VL does."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    v, head_dim = arch.vision, arch.head_dim or arch.hidden // arch.heads
    ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in GEMMA3_TOKENS.items()}
    text = _text_config(arch, tokenizer) | {
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": arch.max_position,
    }
    vision = {
        "num_hidden_layers": v.layers,
        "hidden_size": v.hidden,
        "intermediate_size": v.intermediate,
        "num_attention_heads": v.heads,
        "patch_size": v.patch,
        "image_size": v.image_size,
        "vision_use_head": False,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=v.tokens_per_image,
        tie_word_embeddings=arch.tie_embeddings,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
    )
    model = Gemma3ForConditionalGeneration(config)
    projection = model.model.multi_modal_projector.mm_input_projection_weight
    torch.nn.init.normal_(projection.data, std=config.initializer_range)
    return model


def _mrope(arch: ModelArch) -> list[int]:
    """Qwen2-VL's multimodal rotary split of a head's half-dimension into (time, height, width) sections."""
    half = (arch.head_dim or arch.hidden // arch.heads) // 2
    side = half * 3 // 8
    return [half - 2 * side, side, side]


def processor(arch: ModelArch, tokenizer, min_pixels: int | None, max_pixels: int | None):
    """The tiny VLM's processor: Qwen2-VL's image processor (Pillow backend) sized by `arch.vision` and the pixel
    bounds, the tokenizer and the chat template that renders image parts."""
    from transformers import Qwen2VLImageProcessorPil

    from rlctl.rollout.vision import ImagesOnly

    v, bounds = arch.vision, {}
    if min_pixels is not None:
        bounds["min_pixels"] = min_pixels
    if max_pixels is not None:
        bounds["max_pixels"] = max_pixels
    images = Qwen2VLImageProcessorPil(
        patch_size=v.patch, temporal_patch_size=v.temporal_patch, merge_size=v.merge, **bounds
    )
    return ImagesOnly(images, tokenizer, chat_template=CHAT_TEMPLATE)


def gemma3_processor(arch: ModelArch, tokenizer):
    """The tiny Gemma 3's processor: Gemma 3's image processor (Pillow backend) at the tower's image size, the
    tokenizer, `tokens_per_image` soft tokens per image and the chat template that renders image parts."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    v = arch.vision
    images = Gemma3ImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return Gemma3Processor(images, tokenizer, chat_template=CHATML_GEMMA3, image_seq_length=v.tokens_per_image)
