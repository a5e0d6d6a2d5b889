"""A GGUF file converted once into a Hugging Face folder (transformers' GGUF loader, dequantized), with its special
tokens checked and fixed, before launch: every stage, vLLM and export then read an ordinary folder.

The checks: a chat model's eos must be the token that ends the assistant's turn in its chat template (transformers'
GGUF tokenizer conversion names `<|im_start|>` as eos for SmolLM2, whose turns end with `<|im_end|>`), the model's
config and generation config must stop on that token, and a pad token must exist (batched generation refuses to pad
without one). Each fix is said on the console and kept in the folder's `rlctl_import.json`, copied into the run.
The folder is written under a temporary name, fsync'ed, its record (with every file's size and checksum) written
last, and renamed into place, so concurrent runs and tests share it safely. A cached folder is used only when it
checks out against its record (`problem`); otherwise it is set aside and converted again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl import atomic
from rlctl.checkpoint import integrity
from rlctl.plan import gguf
from rlctl.rundir import write_record

PROBE = "rlctl-end-of-turn-probe"


@dataclass(frozen=True)
class Imported:
    """The folder a GGUF file became, what the import fixed, and whether it ran now (or was cached)."""

    folder: Path
    record: gguf.ImportRecord
    converted_now: bool

    @property
    def fixes(self) -> list[str]:
        return self.record.fixes


def end_of_turn(tok: Any) -> str | None:
    """The special token right after the assistant's content in the chat template (None without a template or
    when no special token follows it)."""
    if not getattr(tok, "chat_template", None):
        return None
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    text = tok.apply_chat_template(chat, tokenize=False)
    tail = text.split(PROBE, 1)[1].lstrip() if PROBE in text else ""
    specials = sorted({*tok.all_special_tokens, *tok.get_added_vocab()}, key=len, reverse=True)
    return next((s for s in specials if s and tail.startswith(s)), None)


def fix_specials(tok: Any, model: Any, header: gguf.GgufHeader) -> list[str]:
    """Make eos the end-of-turn token (the GGUF's own eos without a chat template) and give the tokenizer a pad
    token, in the tokenizer, the model config and its generation config; one line per fix."""
    fixes: list[str] = []
    turn = end_of_turn(tok)
    want = turn or header.token(header.eos_id) or tok.eos_token
    if want is not None and tok.eos_token != want:
        why = "the token that ends the assistant's turn in the chat template" if turn else "the GGUF's eos"
        fixes.append(f"eos {tok.eos_token} -> {want} (id {tok.convert_tokens_to_ids(want)}): {why}")
        tok.eos_token = want
    if tok.pad_token is None:
        pad = header.token(header.pad_id) or tok.eos_token
        source = "the GGUF's padding token" if header.token(header.pad_id) else "the eos"
        fixes.append(f"pad none -> {pad} (id {tok.convert_tokens_to_ids(pad)}): {source}; batched generation pads")
        tok.pad_token = pad
    eos_id, pad_id = tok.eos_token_id, tok.pad_token_id
    for where, conf in (("config", model.config), ("generation config", model.generation_config)):
        for key, value in (("eos_token_id", eos_id), ("pad_token_id", pad_id)):
            have = getattr(conf, key, None)
            if have != value and not (isinstance(have, list) and value in have):
                fixes.append(f"{where} {key} {have} -> {value}")
                setattr(conf, key, value)
    return fixes


def fix_decoder(tok: Any) -> list[str]:
    """A byte-level BPE tokenizer (ByteLevel pre-tokenizer) whose decoder transformers' GGUF conversion built as
    SentencePiece's (ByteFallback, Fuse, Replace '▁', then ByteLevel) gets the plain ByteLevel decoder its model was
    trained with: decoding is the same, and llama.cpp's converter, which reads that decoder as the sign of a
    SentencePiece vocabulary, then keeps the BPE merges of an exported GGUF. Kept only when a probe text decodes
    the same both ways."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return []
    spec = json.loads(backend.to_str())
    pre, dec = spec.get("pre_tokenizer") or {}, spec.get("decoder") or {}
    parts = [d.get("type") for d in dec.get("decoders", [])] if dec.get("type") == "Sequence" else []
    if pre.get("type") != "ByteLevel" or "ByteFallback" not in parts or "ByteLevel" not in parts:
        return []
    from tokenizers import decoders

    probe = "What is 47 + 38? Reply with only the number.\n  héllo wörld ✓ <b>x</b>"
    ids = backend.encode(probe, add_special_tokens=False).ids
    before = backend.decode(ids)
    old = backend.decoder
    backend.decoder = decoders.ByteLevel()
    if backend.decode(ids) != before:
        backend.decoder = old
        return []
    return [f"tokenizer decoder {'+'.join(parts)} -> ByteLevel: a byte-level BPE's own (GGUF exports keep its merges)"]


def _convert(path: Path, header: gguf.GgufHeader, dtype: str, tmp: Path) -> list[str]:
    """Load the GGUF file dequantized in `dtype`, fix its special tokens and save both into `tmp`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=getattr(torch, dtype),
        quantization_config=GgufConfig(dequantize=True),
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # dequantized weights are dense ones: saved as an ordinary checkpoint
        quantizer.remove_quantization_config(model)
    fixes = fix_specials(tok, model, header) + fix_decoder(tok)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return fixes


def problem(folder: Path) -> str | None:
    """Why the converted `folder` cannot be used (None when it can): `gguf.import_problem`, or a file its record
    lists changed since (checksum), or a file broken by its own format (a safetensors file cut short)."""
    found = gguf.import_problem(folder)
    if found is not None:
        return found
    return "; ".join(integrity.folder_problems(folder, gguf.read_import(folder).files)) or None


def ensure(spec: gguf.GgufImport, say: Callable[[str], None]) -> Imported:
    """The converted folder of `spec`, made now when it is not cached or the cached one does not check out; `say`
    gets the lines the user sees."""
    folder = Path(spec.folder)
    why = problem(folder)
    if why is not None:
        if folder.exists():
            say(f"The cached import {folder} cannot be used ({why}): converting again")
        _import(spec, folder, say)
    record = gguf.read_import(folder)
    if why is None:
        say(f"{Path(spec.file).name}: converted already ({folder})")
    for fix in record.fixes:
        say(f"GGUF import fixed: {fix}")
    return Imported(folder, record, why is not None)


def _import(spec: gguf.GgufImport, folder: Path, say: Callable[[str], None]) -> None:
    """Convert `spec`'s file into `folder`: built in a temporary folder beside it, fsync'ed with its record last,
    and renamed into place (a damaged folder there is set aside first)."""
    path = Path(spec.file)
    header = gguf.header(path)
    say(f"Importing {path.name} ({spec.quantization}): dequantizing to {spec.dtype}, once, into {folder}")
    start = time.monotonic()
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fixes = _convert(path, header, spec.dtype, tmp)
        record = gguf.ImportRecord(
            source=str(path),
            sha256=folder.name.split("-", 1)[0],
            quantization=spec.quantization,
            dtype=spec.dtype,
            fixes=fixes,
            seconds=round(time.monotonic() - start, 1),
            files=integrity.manifest(tmp),
        )
        write_record(tmp / gguf.RECORD, record)
        atomic.sync_tree(tmp)
        if folder.exists():  # a damaged one: moved out of the way in one step, then removed
            aside = folder.with_name(f".{folder.name}.{os.getpid()}.damaged")
            folder.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another run finished the same import first: its folder is the same
            if problem(folder) is not None:
                raise
        atomic.sync(folder.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
