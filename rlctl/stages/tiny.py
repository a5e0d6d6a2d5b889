"""The offline tiny models: a random-init Qwen2-architecture model (`builtin:tiny`) or a vision-language model of the
family of `model.arch.vision.kind` (`builtin:tiny-vlm`, `builtin:tiny-gemma3`; its family builds the model and its
processor, `rlctl.vision.family.Family.tiny_model`), and a BPE tokenizer trained locally.

The tokenizer is trained with Qwen2's own pre-tokenizer regex, so reloading it through AutoTokenizer
(which rebuilds Qwen2's pre-tokenizer) tokenizes exactly as it was trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlctl import vision
from rlctl.config import ModelArch
from rlctl.data.tokens import CHATML, EOS, SPECIAL_TOKENS, template_text, train_bpe

# lets conversational data (chat `messages`, verl's message-list prompts, tools) train; a vision-language model's
# renders image parts as its family's placeholder (`template_text`)
CHAT_TEMPLATE = CHATML


def train_tokenizer(texts: list[str], vocab_size: int, named: dict[str, str] | None = None):
    """A Qwen2Tokenizer whose byte-level BPE was trained on `texts`; `named`: special tokens it names as attributes
    (a vision-language family's image tokens, where its processor reads them so)."""
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
    image tokens, and <|im_end|> its EOS as an instruction-tuned chat model's (a reply ends there)."""
    family = vision.of_arch(arch)
    named = dict(family.named_tokens) if family is not None else {}
    tokenizer = train_tokenizer(texts, arch.vocab, named or None)
    if family is not None:
        unnamed = [t for t in family.tokenizer_tokens if t not in named.values()]  # the named ones are added above
        tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:] + unnamed})
        tokenizer.eos_token = "<|im_end|>"
    return tokenizer


def build(
    out_dir: Path, arch: ModelArch, texts: list[str], seed: int, pixels: tuple[int | None, int | None] = (None, None)
) -> Path:
    """Write a random-init Qwen2 model and its tokenizer to `out_dir` (atomically); with `arch.vision` a model of its
    family and its processor (`pixels`: data.min_pixels / max_pixels); returns `out_dir`."""
    import torch
    from transformers import GenerationConfig

    family = vision.of_arch(arch)
    tokenizer = model_tokenizer(arch, texts)
    torch.manual_seed(seed)
    if family is None:
        model = _lm(arch, tokenizer)
    else:
        model = family.tiny_model(arch, tokenizer, _text_config(arch, tokenizer))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if family is not None:
        template = template_text("chatml", family.placeholder)
        family.tiny_processor(arch, tokenizer, template, pixels).save_pretrained(tmp)
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
