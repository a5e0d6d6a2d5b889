"""The run directory: where each of its files lies, and the typed record of every file rlctl writes there.

`RunDir` gives the paths (and `incoming`, `checkpoint`, `checkpoint_step` the names of a stage's checkpoint
folders); no other package builds a run-directory path from a file's name (tests/test_rundir_only.py). Each record
has `to_json`/`from_json`: summary.json (`Summary`, with its stages' metrics, data notes, memory, best checkpoints
and layouts), a stage's per-process layout and memory records (`LayoutRecord`, `MemoryRecord`), a checkpoint's
completion marker (`CheckpointMark`, its files' `FileEntry`), the RL loop's state in a checkpoint (`LoopState`),
and the manifest of a folder rlctl wrote whole (`FilesManifest`). Each of those files is read (`read_record`, with
a size bound) and written (`write_record`, whole or not at all) through its record, at the path `RunDir` gives.
The records a higher package owns are read and written the same way: plan.json (`rlctl.plan.resolved.Plan`, its
parts read by their fields' types: `typed`), data_lengths.json (`rlctl.plan.data_lengths.DataLengths`) and
model_import.json (`rlctl.plan.gguf.ImportRecord`). `from_json` reads what older rlctl wrote: keys it does not
know are kept and written back (`extra`), keys it lacks (or null) take their defaults, and a value of another kind
than rlctl writes is refused naming its key (`WrongKind`: the reader's DamagedFile names the file too); `to_json`
writes the keys rlctl always wrote.

Package `rlctl.rundir`: the paths (`paths`), the records of checkpoints and monitors (`records`), summary.json
(`summary`).
May import: base, vision.
"""

from rlctl.rundir.paths import (
    COMPLETE,
    CONFIG_FILE,
    DAMAGED,
    INCOMING,
    LOOP_STATE,
    METRICS_FILE,
    PLAN_FILE,
    REPAIR,
    SUMMARY_FILE,
    RunDir,
    checkpoint,
    checkpoint_step,
    data_file,
    eval_samples,
    every_rank,
    final_staging,
    incoming,
    set_aside,
)
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
    typed,
    write_record,
)
from rlctl.rundir.summary import DataNote, Restart, StageSummary, Summary, read_summary, write_summary

__all__ = [
    "COMPLETE",
    "CONFIG_FILE",
    "DAMAGED",
    "INCOMING",
    "LOOP_STATE",
    "METRICS_FILE",
    "PLAN_FILE",
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
    "checkpoint",
    "checkpoint_step",
    "data_file",
    "eval_samples",
    "every_rank",
    "final_staging",
    "incoming",
    "read_record",
    "read_summary",
    "set_aside",
    "typed",
    "write_record",
    "write_summary",
]
