"""A run's checkpoints checked against their completion markers (`integrity`), without loading them.

`rlctl resume` verifies the newest checkpoint of each unfinished stage and falls back to the newest intact one
(`resume_check`); `rlctl verify RUN` checks every checkpoint, final folder and export of a run (`verify_run`), and
`rlctl verify EXPORT` an export folder anywhere against the manifest rlctl wrote there (`verify_export`).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlctl import checkpoint, strictjson
from rlctl.checkpoint.integrity import folder_problems
from rlctl.checkpoint.safewrite import MANIFEST, listed, recorded
from rlctl.config import RunConfig, aliases, dump, read_run_config, validate
from rlctl.errors import UserError
from rlctl.plan import resolved
from rlctl.rundir import (
    CONFIG_FILE,
    DAMAGED,
    METRICS_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
    FilesManifest,
    RunDir,
    read_record,
    read_summary,
    set_aside,
)

# the files a model load from a folder may read (transformers, peft, tokenizers, remote code, llama.cpp), by name
LOADED: tuple[str, ...] = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.h5",
    "*.msgpack",
    "*.npz",
    "*.gguf",
    "*.index.json",
)
LOADED += ("config.json", "generation_config.json", "adapter_config.json", "*processor_config.json", "*.py")
LOADED += ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.model")
LOADED += ("*.tiktoken", "chat_template.*")


def restore_hint(run_dir: Path) -> str:
    """What to do about a damaged config.yaml."""
    return (
        f"Restore it from a copy; the config the run started with (before any `rlctl resume --set`) is under "
        f'"config" in {run_dir}/plan.json.'
    )


def run_config(run_dir: Path, works: str = "", notes: list[str] | None = None) -> RunConfig:
    """The config.yaml a run was started with, keys that moved since it was written read at their new places (a
    line in `notes` names them). Raises DamagedFile when it does not parse or is not complete: rlctl writes every
    section and key there, so a file that lacks some was cut short (it would otherwise be read with defaults in
    their place); `works` says what still works without it."""
    path = RunDir(run_dir).config
    works = works or restore_hint(run_dir)
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml). Start one with `rlctl train`.")
    try:
        raw = read_run_config(path, notes)
        cfg = validate(raw, source=str(path))
    except UserError as e:
        raise strictjson.DamagedFile(path, str(e).rstrip("."), works) from None
    expected = yaml.safe_load(dump(cfg))
    missing = [s for s in expected if s not in raw]
    missing += [
        f"{s}.{k}"
        for s, keys in expected.items()
        if isinstance(keys, dict) and isinstance(raw.get(s), dict)
        for k in keys
        if k not in raw[s]
    ]
    missing = [key for key in missing if key not in aliases.ADDED]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise strictjson.DamagedFile(path, f"{shown} missing: it was cut short or edited", works)
    return cfg


def checkpoint_problems(ckpt: Path) -> list[str]:
    """Problems of a complete checkpoint against the manifest in its completion marker."""
    try:
        marker = checkpoint.mark(ckpt)
    except strictjson.DamagedFile as e:
        return [f"its completion marker {checkpoint.COMPLETE} is damaged ({e.damage})"]
    return folder_problems(ckpt, marker.files)


@dataclass
class ResumeChoice:
    """Where a stage resumes: `intact` (None: from its start) and the newer checkpoints found `damaged`."""

    stage: str
    intact: Path | None
    damaged: list[tuple[Path, list[str]]] = field(default_factory=list)


def choose(stage: str, folder: Path) -> ResumeChoice:
    """The newest intact complete checkpoint of `folder` and the damaged ones newer than it."""
    choice = ResumeChoice(stage, None)
    for ckpt in reversed(checkpoint.complete_checkpoints(folder)):
        problems = checkpoint_problems(ckpt)
        if not problems:
            choice.intact = ckpt
            break
        choice.damaged.append((ckpt, problems))
    return choice


def _listed(damaged: list[tuple[Path, list[str]]]) -> str:
    return "; ".join(f"{c.name}: {', '.join(p)}" for c, p in damaged)


def resume_check(run_dir: Path, stages: Sequence[str]) -> list[str]:
    """Before a resume: verify each unfinished stage's checkpoints, newest first. Damaged ones newer than the
    newest intact checkpoint are set aside (renamed CHECKPOINT.damaged, so the trainer resumes from the intact
    one and retention never counts them); returns one line per stage saying which and why. A stage whose
    checkpoints are all damaged raises a UserError naming the files (nothing is renamed then). Stages that
    summary.json lists as completed are not looked at."""
    completed = read_summary(run_dir, f"`rlctl resume {run_dir}` rebuilds it from metrics.jsonl.").completed
    notes = []
    for stage in (s for s in stages if s not in completed):
        choice = choose(stage, RunDir(run_dir).checkpoints(stage))
        if not choice.damaged:
            continue
        if choice.intact is None:
            raise UserError(
                f"Every checkpoint of stage {stage} in {RunDir(run_dir).checkpoints(stage)} is damaged "
                f"({_listed(choice.damaged)}). Restore them from a copy, or delete that folder to restart the stage "
                f"from its start, then `rlctl resume {run_dir}`."
            )
        for ckpt, _ in choice.damaged:
            aside = set_aside(ckpt)
            if aside.exists():
                shutil.rmtree(aside)
            ckpt.rename(aside)
        names = ", ".join(c.name for c, _ in choice.damaged)
        notes.append(
            f"stage {stage}: {names} is damaged ({_listed(choice.damaged)}); resuming from {choice.intact.name}, the "
            f"newest intact checkpoint. The damaged copy is kept as {names.split(', ')[0]}{DAMAGED} for inspection."
        )
    return notes


def run_file_problems(run_dir: Path) -> list[tuple[str, list[str]]]:
    """(file, its problems) for the run's own records: config.yaml complete, plan.json and summary.json their
    records (`Plan`, `Summary`), every metrics.jsonl line a JSON record (a half-written last line of a running run
    aside)."""
    try:
        run_config(run_dir)
        out = [(CONFIG_FILE, [])]
    except UserError as e:
        out = [(CONFIG_FILE, [str(e).split(" is damaged: ", 1)[-1]])]
    for name in (PLAN_FILE, SUMMARY_FILE):
        if (run_dir / name).exists():
            works = "`rlctl resume` rebuilds it from metrics.jsonl" if name == SUMMARY_FILE else ""
            try:
                read_summary(run_dir) if name == SUMMARY_FILE else resolved.read(run_dir)
                out.append((name, []))
            except strictjson.DamagedFile as e:
                out.append((name, [f"{e.damage}{'; ' + works if works else ''}"]))
            except UserError as e:  # plan.json's config that today's schema refuses
                out.append((name, [str(e)]))
    if RunDir(run_dir).metrics.exists():
        try:
            lines = strictjson.lines(RunDir(run_dir).metrics)
        except strictjson.DamagedFile as e:
            return [*out, (METRICS_FILE, [e.damage])]
        bad = [n for n, line in enumerate(lines[:-1], 1) if line.strip() and not _is_record(line)]
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        said = f"line(s) {shown} are not JSON records; `rlctl report` leaves them out"
        out.append((METRICS_FILE, [said] if bad else []))
    return out


def _is_record(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)  # NaN of older runs accepted, as `rlctl report` reads them
    except json.JSONDecodeError:
        return False


def verify_run(run_dir: Path) -> list[tuple[str, list[str]]]:
    """(file or folder relative to the run, its problems) for the run's own records (`run_file_problems`), then
    every complete checkpoint, final folder and export of a run, in run order; an empty problem list means
    intact."""
    out = run_file_problems(run_dir) + _missing_finals(run_dir)
    run = RunDir(run_dir)
    stages = sorted(p.name for p in run_dir.iterdir() if run.checkpoints(p.name).is_dir() or run.final(p.name).is_dir())
    for stage in stages:
        for ckpt in checkpoint.complete_checkpoints(run.checkpoints(stage)):
            out.append((str(ckpt.relative_to(run_dir)), checkpoint_problems(ckpt)))
        if run.final(stage).is_dir():
            out.append((str(run.final(stage).relative_to(run_dir)), folder_problems(run.final(stage), None)))
    exports = {p.parent for pattern in ("export*/config.json", f"export*/{MANIFEST}") for p in run_dir.glob(pattern)}
    for export in sorted(exports):
        recorded_files = (export / MANIFEST).is_file()  # exports from before the manifest: by their formats alone
        problems = verify_export(export) if recorded_files else folder_problems(export, None)
        out.append((str(export.relative_to(run_dir)), problems))
    return out


def _missing_finals(run_dir: Path) -> list[tuple[str, list[str]]]:
    """(STAGE/final, its problem) for each stage summary.json lists as finished whose final folder is gone."""
    try:
        completed = read_summary(run_dir).completed
    except strictjson.DamagedFile:
        return []  # run_file_problems names it
    gone = [s for s in completed if not RunDir(run_dir).final(s).is_dir()]
    why = f"gone, though the stage finished; `rlctl resume {run_dir}` re-creates it from its last checkpoint"
    return [(f"{stage}/final", [why]) for stage in gone]


def is_export(folder: Path) -> bool:
    """Whether `folder` is a model folder rlctl exported (it holds the manifest of an export)."""
    kind, _ = recorded(folder)
    return kind is not None and kind.endswith("export")


def verify_export(folder: Path) -> list[str]:
    """Problems of an export folder: files missing, resized or changed against the manifest rlctl wrote with it
    (every file's size and checksum), and files broken by their own format; a damaged or missing manifest is a
    problem too."""
    path = folder / MANIFEST
    if not path.is_file():
        return [
            f"{MANIFEST} is missing: no record of the exported files to check against",
            *folder_problems(folder, None),
        ]
    try:
        files = read_record(path, FilesManifest.from_json).files
    except strictjson.DamagedFile as e:
        return [f"{MANIFEST} is damaged ({e.damage})", *folder_problems(folder, None)]
    loaded, _ = unrecorded(folder)
    planted = [
        f"files not written by rlctl (not in {MANIFEST}) that transformers or peft would load: {listed(loaded)}; "
        "remove them, or export again into a new folder"
    ]
    return folder_problems(folder, files) + (planted if loaded else [])


def unrecorded(folder: Path) -> tuple[list[str], list[str]]:
    """The files of an export folder its manifest does not list: (those a model load may read: weights, configs,
    adapters, tokenizer or code files, in any subfolder too; the others: READMEs, notes, images...)."""
    _, files = recorded(folder)
    extra = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
    extra = [rel for rel in extra if rel not in files and rel != MANIFEST]
    loaded = [rel for rel in extra if any(fnmatch.fnmatch(Path(rel).name, pattern) for pattern in LOADED)]
    return loaded, [rel for rel in extra if rel not in loaded]
