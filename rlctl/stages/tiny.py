"""The offline tiny model: a random-init Qwen2-architecture model and a BPE tokenizer trained locally.

The tokenizer is trained with Qwen2's own pre-tokenizer regex, so reloading it through AutoTokenizer
(which rebuilds Qwen2's pre-tokenizer) tokenizes exactly as it was trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlctl.config import ModelArch
from rlctl.data.tokens import CHATML, EOS, SPECIAL_TOKENS, train_bpe

CHAT_TEMPLATE = CHATML  # lets conversational data (chat `messages`, verl's message-list prompts) train


def train_tokenizer(texts: list[str], vocab_size: int):
    """A Qwen2Tokenizer whose byte-level BPE was trained on `texts`."""
    from transformers import Qwen2Tokenizer

    tok = train_bpe(texts, vocab_size)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token=EOS, pad_token=EOS
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})  # one token each, as in Qwen2
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build(out_dir: Path, arch: ModelArch, texts: list[str], seed: int) -> Path:
    """Write a random-init Qwen2 model and its tokenizer to `out_dir` (atomically); returns `out_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(texts, arch.vocab)
    config = Qwen2Config(
        vocab_size=max(arch.vocab, len(tokenizer)),
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        max_position_embeddings=arch.max_position,
        tie_word_embeddings=arch.tie_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir
