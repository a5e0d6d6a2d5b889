"""The records of a run's checkpoints and monitors, each with `to_json`/`from_json`: a checkpoint's completion marker
(`CheckpointMark`, its files' `FileEntry`), the manifest of a folder rlctl wrote whole (`FilesManifest`), the RL
loop's state in a checkpoint (`LoopState`), a stage's per-process layout and memory records (`LayoutRecord`,
`MemoryRecord`) and what summary.json makes of them (`StageMemory`, `MeasuredPhase`, `BestCheckpoint`); how a
record is read (`read_record`) and written (`write_record`); and `typed`, which reads a record of plain fields by
the types its fields are declared with (the plan's parts, the data's lengths, the GGUF import record)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from rlctl import atomic, strictjson

NUMBER = (int, float)
R = TypeVar("R")


class WrongKind(ValueError):
    """A record's key holds a value of another kind than rlctl writes there (`completed` a string where it writes a
    list of stage names): the record is refused, naming the key, rather than read as if the key were absent."""

    def __init__(self, key: str, value: Any, kind: Any):
        self.key, self.value, self.kind = key, value, kind
        super().__init__(f"its `{key}` is {_kind_of(value)}, where rlctl writes {_kind_name(kind)}")

    def within(self, prefix: str) -> WrongKind:
        """The same refusal for the record nested at `prefix` (`memory.rl`)."""
        return WrongKind(f"{prefix}.{self.key}", self.value, self.kind)


def _kind_of(value: Any) -> str:
    names = {dict: "a JSON object", list: "a JSON array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), f"the number {value!r}" if isinstance(value, int | float) else type(value).__name__)


def _kind_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {dict: "a JSON object", list: "a JSON array", str: "a string", int: "a whole number", float: "a number"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def of_kind(value: Any, kind: Any) -> bool:
    """Whether `value` is of `kind` (a boolean is no number, though Python's bool is an int)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kind) and not (isinstance(value, bool) and bool not in kinds)


def pick(data: dict[str, Any], kinds: dict[str, Any]) -> dict[str, Any]:
    """The values of `data` under the keys of `kinds` (absent or null ones left out, to take their defaults); a
    value of another kind is a WrongKind naming its key."""
    out = {}
    for k, kind in kinds.items():
        value = data.get(k)
        if value is None:
            continue
        if not of_kind(value, kind):
            raise WrongKind(k, value, kind)
        out[k] = value
    return out


def typed(cls: type[R], data: Any, key: str = "") -> R:
    """The dataclass `cls` read from the JSON object `data` by the types its fields are declared with: str, int,
    float (a whole number too), bool, their `| None`, lists, tuples and dicts of them, and dataclasses of such fields
    (read the same way). A field absent or null takes its default; one without a default is a KeyError naming it;
    a value of another kind is a WrongKind naming its key (`hardware.nodes`, `stages[1].max_steps`), and keys the
    dataclass has no field for are left out (`key`: where `data` lies in its record, for the names)."""
    if not isinstance(data, dict):
        raise WrongKind(key or "record", data, dict)
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        where = f"{key}.{f.name}" if key else f.name
        if data.get(f.name) is not None or (f.name in data and _optional(hints[f.name])):
            values[f.name] = typed_value(hints[f.name], data[f.name], where)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise KeyError(where)
    return cls(**values)


_UNIONS = (typing.Union, types.UnionType)


def _optional(hint: Any) -> bool:
    """Whether a field of type `hint` may hold None (null is then its value, not its default)."""
    return typing.get_origin(hint) in _UNIONS and type(None) in typing.get_args(hint)


def typed_value(hint: Any, value: Any, key: str) -> Any:
    """`value` read as the type `hint` (see `typed`); a WrongKind naming `key` when it is of another kind."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"{key}: a field of one of {kinds} cannot be read by its type")
        return None if value is None else typed_value(kinds[0], value, key)
    if is_dataclass(hint):
        return typed(hint, value, key)  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise WrongKind(key, value, list)
        items = [typed_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise WrongKind(key, value, dict)
        return {k: typed_value(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint not in (str, int, float, bool, dict, list):
        raise TypeError(f"{key}: a field of type {hint} cannot be read by its type")
    kind = NUMBER if hint is float else hint
    if not of_kind(value, kind):
        raise WrongKind(key, value, kind)
    return value


def unknown(data: dict[str, Any], kinds: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` this rlctl does not know, kept to be written back as they were."""
    return {k: v for k, v in data.items() if k not in kinds}


class Record(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class WrongRecord(strictjson.DamagedFile):
    """A record file that reads as JSON but not as the record rlctl wrote (a key of another kind, or missing):
    someone or something edited it, so nothing decides for the user what it should have said."""


def read_record(path: Path, parse: Callable[[dict[str, Any]], R], works: str = "") -> R:
    """The record in the JSON file at `path`, read with a size bound and parsed by `parse` (a `from_json`); a
    DamagedFile naming the file and what is wrong (the key of a value of another kind, a key missing), followed
    by `works`, when it is not a record rlctl wrote."""
    try:
        return parse(strictjson.read(path, works))
    except WrongKind as e:
        raise WrongRecord(path, str(e), works) from None
    except KeyError as e:
        raise WrongRecord(path, f"it lacks its `{e.args[0]}`", works) from None
    except (TypeError, ValueError) as e:
        raise strictjson.DamagedFile(path, f"it is not a record rlctl wrote ({e})", works) from None


def write_record(path: Path, record: Record, indent: int | None = 2) -> None:
    """Write `record.to_json()` whole or not at all (strict JSON: NaN and infinities as null)."""
    atomic.write_text(path, strictjson.dumps(record.to_json(), indent=indent) + "\n")


@dataclass(frozen=True)
class FileEntry:
    """One file's size and xxh3-128 checksum; `sampled`: of its size, header and sampled blocks (files over
    `rlctl.checkpoint.integrity.FULL_HASH_BYTES`)."""

    size: int
    xxh3: str
    sampled: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "xxh3": self.xxh3} | ({"sampled": True} if self.sampled else {})

    KINDS: ClassVar[dict[str, Any]] = {"size": int, "xxh3": str, "sampled": bool}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        """KeyError naming a key it lacks, WrongKind one of another kind, when `data` is not an entry rlctl wrote."""
        values = pick(data, cls.KINDS)
        for key in ("size", "xxh3"):
            if key not in values:
                raise KeyError(key)
        return cls(values["size"], values["xxh3"], values.get("sampled", False))


def files_from_json(data: Any) -> dict[str, FileEntry]:
    """{relative path: FileEntry} of a manifest's `files`: a WrongKind naming `files` (or the entry of another
    kind), a KeyError naming the key an entry lacks (`files.model.safetensors.xxh3`)."""
    if not isinstance(data, dict):
        raise WrongKind("files", data, dict)
    return {rel: nested(FileEntry.from_json, entry, f"files.{rel}") for rel, entry in data.items()}


@dataclass
class CheckpointMark:
    """A complete checkpoint's marker (COMPLETE): its step, the held-out `metric` and its `value` when one was
    measured (keep-best), how the files were checksummed, and every file's entry (None in a marker written before
    rlctl recorded them)."""

    step: int = 0
    metric: str | None = None
    value: float | None = None
    checksums: str | None = None
    files: dict[str, FileEntry] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[dict[str, Any]] = {"step": int, "metric": str, "value": NUMBER, "checksums": str, "files": dict}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        if self.metric is not None:
            out |= {"metric": self.metric, "value": self.value}
        if self.checksums is not None:
            out["checksums"] = self.checksums
        if self.files is not None:
            out["files"] = {rel: entry.to_json() for rel, entry in self.files.items()}
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointMark:
        """ValueError (or KeyError, TypeError) when a file entry is not one rlctl wrote."""
        values = pick(data, cls.KINDS)
        if "files" in data:
            values["files"] = files_from_json(data["files"])
        return cls(**values, extra=unknown(data, cls.KINDS))


@dataclass
class BestCheckpoint:
    """summary.json's record of a stage's best checkpoint: where it is, its step, metric and value."""

    path: str = ""
    step: int = 0
    metric: str | None = None
    value: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "step": self.step}
        return out | ({"metric": self.metric, "value": self.value} if self.metric is not None else {})

    @classmethod
    def of(cls, ckpt: Path, mark: CheckpointMark) -> BestCheckpoint:
        return cls(str(ckpt), mark.step, mark.metric, mark.value)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BestCheckpoint:
        return cls(**pick(data, {"path": str, "step": int, "metric": str, "value": NUMBER}))


@dataclass
class FilesManifest:
    """rlctl_files.json (`rlctl.checkpoint.safewrite.MANIFEST`): the files rlctl wrote into a folder (an export, a
    report), by the kind of write, with their entries."""

    kind: str
    files: dict[str, FileEntry]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": {rel: entry.to_json() for rel, entry in self.files.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FilesManifest:
        """Raises KeyError, TypeError or ValueError when `data` is not a manifest rlctl wrote."""
        return cls(str(data["kind"]), files_from_json(data["files"]))


@dataclass
class LayoutRecord:
    """What a stage ran against what its plan chose (STAGE/layout/rankN.json; the main process's in summary.json,
    with `processes_recorded`): the plan's values (`planned`), the same read from the live objects with what was
    counted (`observed`: parameters, optimizer state, offload switches), and `mismatches` ("KEY: planned X,
    observed Y"). `planned` and `observed` stay tables of settings by name: they are compared key by key, and
    which keys a stage has depends on its kind and strategy."""

    planned: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    processes_recorded: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[dict[str, Any]] = {"planned": dict, "observed": dict, "mismatches": list, "processes_recorded": int}

    @property
    def mismatched(self) -> set[str]:
        """The settings the live objects contradict."""
        return {m.split(":")[0] for m in self.mismatches}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"planned": self.planned, "observed": self.observed, "mismatches": self.mismatches}
        return out | ({"processes_recorded": self.processes_recorded} if self.processes_recorded is not None else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayoutRecord:
        return cls(**pick(data, cls.KINDS), extra=unknown(data, cls.KINDS))


@dataclass
class MemoryRecord:
    """One process's measured memory of a stage (STAGE/memory/rankN.json): `device` ("gpu" or "cpu"), the
    `source` of device memory in use ("nvml", "cudaMemGetInfo"; "rss" on CPU), and per phase its peaks in GiB by
    measure ({phase: {"reserved_gib" | "allocated_gib" | "device_used_gib" | "rss_gib": GiB}})."""

    device: str = "cpu"
    source: str = "rss"
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "source": self.source, "phases": self.phases}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryRecord:
        values = pick(data, {"device": str, "source": str, "phases": dict})
        phases = values.get("phases", {}).items()
        values["phases"] = {
            p: {k: v for k, v in m.items() if isinstance(v, NUMBER)} for p, m in phases if isinstance(m, dict)
        }
        return cls(**values)


@dataclass
class MeasuredPhase:
    """A phase of summary.json's memory section: the peaks measured (the maximum over processes, by measure as in
    MemoryRecord, written `measured_<measure>`), the headline one (`peak_gib`), and the plan's peak for it."""

    measured: dict[str, float] = field(default_factory=dict)
    peak_gib: float | None = None
    planned_peak_gib: float | None = None
    planned_phase: str | None = None
    error_pct: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"measured_{k}": v for k, v in self.measured.items()}
        out |= {"measured_peak_gib": self.peak_gib, "planned_peak_gib": self.planned_peak_gib}
        return out | {"planned_phase": self.planned_phase, "error_pct": self.error_pct}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasuredPhase:
        kinds = {"planned_peak_gib": NUMBER, "planned_phase": str, "error_pct": NUMBER}
        measured = {k.removeprefix("measured_"): v for k, v in data.items() if k.startswith("measured_")}
        peak = measured.pop("peak_gib", None)
        measured = {k: v for k, v in measured.items() if isinstance(v, NUMBER)}
        return cls(measured, peak if isinstance(peak, NUMBER) else None, **pick(data, kinds))


@dataclass
class StageMemory:
    """summary.json's memory record of a stage: each phase measured beside the plan's, and the stage's peak
    (phases the plan does not model, the checkpoint and the evaluation, left out) against the plan's."""

    device: str = "cpu"
    measured_source: str = "rss"
    processes_recorded: int = 0
    phases: dict[str, MeasuredPhase] = field(default_factory=dict)
    measured_peak_gib: float | None = None
    measured_peak_phase: str | None = None
    planned_peak_gib: float | None = None
    planned_peak_phase: str | None = None
    error_pct: float | None = None

    KINDS: ClassVar[dict[str, Any]] = {"processes_recorded": int, "phases": dict, "error_pct": NUMBER}
    KINDS |= dict.fromkeys(("device", "measured_source", "measured_peak_phase", "planned_peak_phase"), str)
    KINDS |= dict.fromkeys(("measured_peak_gib", "planned_peak_gib"), NUMBER)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"phases": {name: phase.to_json() for name, phase in self.phases.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageMemory:
        values = pick(data, cls.KINDS)
        phases = values.get("phases", {}).items()
        values["phases"] = {p: nested(MeasuredPhase.from_json, m, f"phases.{p}") for p, m in phases}
        return cls(**values)


def nested(parse: Callable[[dict[str, Any]], R], data: Any, key: str) -> R:
    """The record nested under `key` of another, parsed by `parse`; a WrongKind naming `key` when it is no JSON
    object, or naming its own key within `key` (as the KeyError of a key it lacks does: `files.NAME.xxh3`)."""
    if not isinstance(data, dict):
        raise WrongKind(key, data, dict)
    try:
        return parse(data)
    except WrongKind as e:
        raise e.within(key) from None
    except KeyError as e:
        raise KeyError(f"{key}.{e.args[0]}") from None


@dataclass
class LoopState:
    """The RL loop's state in a checkpoint (LOOP_STATE): the step it ended, the prompt stream's cursor, the adaptive
    KL coefficient, and the number of processes that wrote it (None in a checkpoint written before it was
    recorded)."""

    step: int
    cursor: int
    kl_coef: float
    world: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "cursor": self.cursor, "kl_coef": self.kl_coef}
        return out | ({"world": self.world} if self.world is not None else {})

    KINDS: ClassVar[dict[str, Any]] = {"step": int, "cursor": int, "kl_coef": NUMBER, "world": int}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopState:
        """KeyError naming a key rlctl always writes that is missing; WrongKind for a value of another kind."""
        values = pick(data, cls.KINDS)
        missing = [k for k in ("step", "cursor", "kl_coef") if k not in values]
        if missing:
            raise KeyError(missing[0])
        return cls(values["step"], values["cursor"], float(values["kl_coef"]), values.get("world"))
