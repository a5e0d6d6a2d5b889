"""The run directory: where each of its files lies, and the typed record of every file rlctl writes there.

`RunDir` gives the paths; each record has `to_json`/`from_json` as `Plan` has: summary.json (`Summary`, with its
stages' metrics, data notes, memory, best checkpoints and layouts), a stage's per-process layout and memory records
(`LayoutRecord`, `MemoryRecord`), a checkpoint's completion marker (`CheckpointMark`, its files' `FileEntry`), the
RL loop's state in a checkpoint (`LoopState`), and the manifest of a folder rlctl wrote whole (`FilesManifest`).
Each of those files is read (`read_record`, with a size bound) and written (`write_record`) through its record, at
the path `RunDir` gives. `from_json` reads what older rlctl wrote: keys it does not know are kept and written back
(`extra`), keys it lacks (or null) take their defaults, and a value of another kind than rlctl writes is refused
naming its key (`WrongKind`: the reader's DamagedFile names the file too); `to_json` writes the keys rlctl always
wrote.

Package `rlctl.rundir`: the paths (`paths`), the records of checkpoints and monitors (`records`), summary.json
(`summary`).
May import: base, vision.
"""

from rlctl.rundir.paths import COMPLETE, CONFIG_FILE, LOOP_STATE, METRICS_FILE, REPAIR, SUMMARY_FILE, RunDir, every_rank
from rlctl.rundir.records import (
    BestCheckpoint,
    CheckpointMark,
    FileEntry,
    FilesManifest,
    LayoutRecord,
    LoopState,
    MeasuredPhase,
    MemoryRecord,
    Record,
    StageMemory,
    WrongKind,
    WrongRecord,
    read_record,
    write_record,
)
from rlctl.rundir.summary import DataNote, Restart, StageSummary, Summary, read_summary, write_summary

__all__ = [
    "COMPLETE",
    "CONFIG_FILE",
    "LOOP_STATE",
    "METRICS_FILE",
    "REPAIR",
    "SUMMARY_FILE",
    "BestCheckpoint",
    "CheckpointMark",
    "DataNote",
    "FileEntry",
    "FilesManifest",
    "LayoutRecord",
    "LoopState",
    "MeasuredPhase",
    "MemoryRecord",
    "Record",
    "Restart",
    "RunDir",
    "StageMemory",
    "StageSummary",
    "Summary",
    "WrongKind",
    "WrongRecord",
    "every_rank",
    "read_record",
    "read_summary",
    "write_record",
    "write_summary",
]
