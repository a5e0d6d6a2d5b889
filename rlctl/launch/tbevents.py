"""TensorBoard event files, written without TensorBoard or protobuf installed (no account, no extra package).

The format: a sequence of records, each `uint64 length | uint32 masked_crc32c(length) | data |
uint32 masked_crc32c(data)`, whose data is a serialized `tensorflow.Event` protobuf. rlctl writes only scalar
summaries: Event{wall_time=1 (double), step=2 (int64), file_version=3 (string) | summary=5 (Summary)},
Summary{value=1 (repeated Value)}, Value{tag=1 (string), simple_value=2 (float)}.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path


def _crc_table() -> tuple[int, ...]:
    """CRC-32C (Castagnoli, reflected) of every byte value."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 as two's complement, like protobuf
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """A serialized Event holding one scalar summary value."""
    value_msg = _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", float(value))
    summary = _bytes_field(1, value_msg)
    return _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(int(step)) + _bytes_field(5, summary)


def version_event(wall_time: float) -> bytes:
    return _field(1, 1) + struct.pack("<d", wall_time) + _bytes_field(3, b"brain.Event:2")


def record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


class EventWriter:
    """Appends scalars to one `events.out.tfevents.*` file in `logdir` (created on the first write)."""

    SUFFIX = ".rlctl"

    def __init__(self, logdir: Path, wall_time: float | None = None):
        self.logdir = Path(logdir)
        self.path: Path | None = None
        self.start = wall_time or time.time()

    def _open(self) -> Path:
        if self.path is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{int(self.start)}.{socket.gethostname()}{self.SUFFIX}"
            self.path = self.logdir / name
            with self.path.open("wb") as f:
                f.write(record(version_event(self.start)))
        return self.path

    def scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        wall = wall_time or time.time()
        with self._open().open("ab") as f:
            for tag, value in values.items():
                f.write(record(scalar_event(tag, value, step, wall)))


SKIP = ("step", "max_steps", "time", "epoch")


def metric_scalars(rec: dict) -> dict[str, float]:
    """The `stage/metric` scalars of one metrics.jsonl record (training steps), `stage/eval/metric` for held-out
    evaluations (at each checkpoint and after the stage), `stage/memory/phase/peak_gib` for memory records and
    `stage/alarm/name` (1) for alarms."""
    stage = rec.get("stage", "run")
    if rec.get("event") == "alarm":
        return {f"{stage}/alarm/{rec.get('alarm')}": 1.0}
    if rec.get("event") == "memory":
        return {
            f"{stage}/memory/{phase}/{k}": float(v)
            for phase, peaks in (rec.get("phases") or {}).items()
            for k, v in peaks.items()
            if _number(v)
        }
    prefix = f"{stage}/eval" if rec.get("event") in ("eval", "checkpoint") else stage
    return {f"{prefix}/{k.removeprefix('eval_')}": float(v) for k, v in rec.items() if k not in SKIP and _number(v)}


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class Scalars:
    """The scalars of each metrics.jsonl record and the step they belong at: the stage's step (a held-out
    evaluation after the stage: the stage's last step). Shared by the TensorBoard files and the trackers."""

    def __init__(self):
        self.stage_step: dict[str, int] = {}

    def of(self, rec: dict) -> tuple[dict[str, float], int] | None:
        """(scalars, step) of `rec`, or None for a record without scalars at a step (start, end, data...)."""
        stage = rec.get("stage", "run")
        if "step" in rec and _number(rec["step"]):
            self.stage_step[stage] = int(rec["step"])
        elif rec.get("event") not in ("eval", "alarm"):
            return None
        values = metric_scalars(rec)
        return (values, self.stage_step.get(stage, 0)) if values else None


class MetricsEvents:
    """metrics.jsonl records -> TensorBoard scalars (`stage/metric` at the stage's step; held-out evaluations
    as `stage/eval/metric` at the checkpoint's step, or the stage's last step after it). Used live by `rlctl
    train` and by `rlctl report`."""

    def __init__(self, logdir: Path, wall_time: float | None = None):
        self.writer = EventWriter(logdir, wall_time)
        self.scalars = Scalars()

    def add(self, rec: dict) -> None:
        point = self.scalars.of(rec)
        if point is not None:
            self.writer.scalars(point[0], point[1], rec.get("time"))


def write_metrics(records: list[dict], logdir: Path) -> Path | None:
    """One event file holding every scalar of `records` (replacing the files rlctl wrote there before)."""
    for old in Path(logdir).glob(f"events.out.tfevents.*{EventWriter.SUFFIX}"):
        old.unlink()
    events = MetricsEvents(logdir, next((r["time"] for r in records if r.get("time")), None))
    for rec in records:
        events.add(rec)
    return events.writer.path
