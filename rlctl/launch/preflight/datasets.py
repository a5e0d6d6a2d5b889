"""The pre-flight's checks of the data: every dataset is read and its format recognised (with the stage's column
mapping), the chat template exists when any stage's data holds message lists, and rows over the stage's length limit
are counted with the model's tokenizer files (`tokenizers` + jinja2), refused when more than
`data.max_drop_fraction` would be dropped."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from rlctl import data
from rlctl import vision as families
from rlctl.config import RunConfig
from rlctl.data import tokens
from rlctl.errors import RowFailure, UserError
from rlctl.launch.preflight.report import Preflight, Report
from rlctl.plan import arch as model_arch
from rlctl.plan import gguf
from rlctl.plan import planner as plan_mod

ROLE_OF_STAGE = {"sft": "sft", "dpo": "preference", "kto": "kto", "rm": "preference", "rl": "rl"}


def _sources(cfg: RunConfig, paths: dict[str, Path] | None) -> dict[str, str]:
    if paths is not None:
        return {role: str(p) for role, p in paths.items()}
    return {role: getattr(cfg.data, role) for role in ("sft", "preference", "rl", "eval") if getattr(cfg.data, role)}


def _stage_roles(cfg: RunConfig) -> list[tuple[str, str]]:
    """(stage or eval, the role it reads its data as) for the run's datasets."""
    pairs: list[tuple[str, str]] = [(stage, ROLE_OF_STAGE[stage]) for stage in cfg.stages]
    return [*pairs, ("eval", "eval")] if cfg.data.eval or cfg.data.generate else pairs


def _source_role(role: str) -> str:
    return "preference" if role == "kto" else role


def read_data(cfg: RunConfig, report: Report, full: bool, paths: dict[str, Path] | None) -> dict[str, list[dict]]:
    """Rows of each stage's dataset as that stage reads them ({stage: rows}); problems go to `report.errors`."""
    sources = _sources(cfg, paths)
    out: dict[str, list[dict]] = {}
    for stage, role in _stage_roles(cfg):
        key = _source_role(role)
        spec = sources.get(key)
        if spec is None:
            continue
        answer = cfg.data.answer_field if role in ("rl", "eval") else None
        columns, encoding = data.stage_columns(cfg, stage), cfg.data.encoding
        try:
            if full:
                rows, info = data.load(spec, role, answer, columns, encoding)
            else:
                rows, info = data.sample(spec, role, answer, columns, encoding)
        except UserError as e:
            report.data[key] = {"source": spec, "error": str(e), "stages": readers(cfg).get(key, [])}
            report.errors.append(str(e))
            continue
        out[stage], report.infos[stage] = rows, info
        entry = {"source": info.source, "format": info.format, "rows": info.rows, "notes": [], "stages": []}
        report.data.setdefault(key, entry)
        report.data[key]["notes"] = sorted({*report.data[key]["notes"], *info.notes})
        report.data[key]["stages"].append(stage)
    return out


def readers(cfg: RunConfig) -> dict[str, list[str]]:
    """{data role: the stages that read it (eval: held-out scoring)}, in pipeline order."""
    out: dict[str, list[str]] = {}
    for stage, role in _stage_roles(cfg):
        out.setdefault(_source_role(role), []).append(stage)
    return out


def chat_template(cfg: RunConfig, folder: Path | None, rows: dict[str, list[dict]], report: Report) -> str | None:
    """The chat template the run will use, checked to exist when any stage's data is conversational."""
    needs = [stage for stage, r in rows.items() if data.conversational(r) or (stage == "rl" and cfg.rl.tools)]
    if cfg.data.chat_template:
        try:
            template = tokens.template_text(cfg.data.chat_template, families.placeholder(cfg.model.arch))
        except UserError as e:
            report.errors.append(str(e))
            return None
        report.checks["chat template"] = f"data.chat_template={cfg.data.chat_template}"
        return template
    template = tokens.folder_template(folder) if folder is not None else None
    if template is None and gguf.is_gguf(cfg.model):  # not converted yet: the template the header carries
        try:
            template = gguf.header(gguf.locate(cfg.model)).chat_template
        except UserError:  # reported by the model check
            template = None
        folder = folder or Path(cfg.model.name_or_path)
    if needs and folder is not None and template is None:
        report.errors.append(
            f"The {', '.join(needs)} data holds chat messages (or rl.tools makes RL prompts conversations), but the "
            f"tokenizer in {folder} has no chat template to render them. Set data.chat_template: chatml (--set "
            "data.chat_template=chatml), or a Jinja file with the model's own template."
        )
    report.checks["chat template"] = (
        "the tokenizer's own" if template else "none needed (no conversational data)" if not needs else "unknown yet"
    )
    return template


def count_lengths(cfg: RunConfig, tok: Any, rows: dict[str, list[dict]], full: bool, report: Report) -> None:
    """Rows over each training stage's limit, counted; refused as the stage would refuse them (data.over_length
    =refuse: any; drop: more than data.max_drop_fraction, or every row)."""
    from rlctl.rollout import tools

    per_token = tokens.max_token_bytes(tok)
    for stage, stage_rows in rows.items():
        if not stage_rows:
            continue
        if stage == "eval":  # no length limit: rendered only, as held-out scoring will
            _each_row(stage_rows, lambda r: tokens.prompt_text(r["prompt"], tok), report.infos[stage], report)
            continue
        limit = cfg.data.max_prompt_length if stage == "rl" else getattr(cfg, stage).max_length
        try:
            schemas = [t.schema for t in tools.resolve_all(cfg.rl.tools).values()] if stage == "rl" else None
        except UserError as e:
            report.errors.append(str(e))
            continue
        count = functools.partial(
            tokens.bounded_length, tok=tok, stage=stage, limit=limit, per_token=per_token, tools=schemas
        )  # RL prompts list the tools, as rolled out
        sizes = _each_row(stage_rows, count, report.infos[stage], report)
        if sizes is None:
            continue
        over = [i for i, n in enumerate(sizes) if n > limit]
        entry: dict[str, Any] = {"rows": len(sizes), "over_limit": len(over), "share": round(len(over) / len(sizes), 4)}
        entry.update(limit=limit, limit_key=tokens.limit_key(stage), keeps_95=tokens.keeps_95(sizes), sampled=not full)
        entry["longest"] = max((n for n in sizes if n <= limit), default=0)  # of the rows kept
        report.lengths[stage] = entry
        if over:
            bound = tokens.far_over(stage_rows[over[0]], stage, limit, per_token) is not None
            refused = too_long(cfg, stage, sizes, over, limit, report.infos[stage], bound)
            if refused:
                report.errors.append(refused)


def too_long(
    cfg: RunConfig, stage: str, sizes: list[int], over: list[int], limit: int, info: data.DataInfo, bound: bool
) -> str:
    """The refusal the stage would make at launch for these over-long rows, or "" when they are dropped (`bound`:
    the first one's size is a lower bound)."""
    key, first = tokens.limit_key(stage), over[0]
    if cfg.data.over_length == "refuse":
        return (
            f"{len(over)} of {len(sizes)} {stage} rows are longer than {key}={limit} tokens (first: "
            f"{info.row(first)}, {'more than ' if bound else ''}{sizes[first]} tokens). "
            f"data.over_length=refuse: raise {key}, shorten or remove those rows, or set data.over_length=drop to "
            "leave them out (counted)."
        )
    if len(over) == len(sizes):
        return (
            f"Every one of the {len(sizes)} {stage} rows is longer than {key}={limit} tokens (the first has "
            f"{sizes[0]}): nothing would be left to train on. Raise {key} or shorten the data."
        )
    return tokens.too_many_dropped(stage, len(over), len(sizes), limit, cfg.data.max_drop_fraction, sizes) or ""


def _each_row(rows: list[dict], fn: Any, info: data.DataInfo, report: Report) -> list[Any] | None:
    """fn of every row; the first row it fails on goes to `report.errors` by file and line (None returned)."""
    try:
        return data.each_row(fn, rows)
    except RowFailure as e:  # a chat template refusing the row, or failing on it
        cause = e.cause
        what = (
            str(cause)
            if isinstance(cause, UserError)
            else f"the chat template failed on it ({type(cause).__name__}: {cause})"
        )
        report.errors.append(f"{info.row(e.index)}: {what}")
        return None


def tokenizer(
    cfg: RunConfig, folder: Path | None, template: str | None, paths: dict[str, Path], full: bool, report: Report
) -> tokens.FileTokenizer | None:
    """The run's tokenizer, light (`tokenizers` + jinja2): the model folder's, or builtin:tiny's trained here on
    the run's texts as the launch will train it (when every dataset is local and read whole); else None."""
    if folder is not None and (folder / "tokenizer.json").is_file():
        report.checks["tokenizer"] = f"{folder / 'tokenizer.json'} (over-long rows counted)"
        return tokens.FileTokenizer.from_folder(folder, template)
    name = cfg.model.name_or_path
    builtin = name in model_arch.BUILTIN_MODELS and cfg.model.arch is not None and not report.errors
    if builtin and all(_read_whole(str(p), full) for p in paths.values()):
        from rlctl.data import tasks

        try:
            texts = tasks.corpus(paths)
        except UserError as e:
            report.errors.append(str(e))
            return None
        report.checks["tokenizer"] = f"{name}'s, trained here on the run's texts (over-long rows counted)"
        return tokens.FileTokenizer.builtin(texts, cfg.model.arch.vocab, template, cfg.model.arch)
    report.checks["tokenizer"] = "not here yet: over-long rows are counted when training starts"
    return None


def _read_whole(spec: str, full: bool) -> bool:
    """Whether the pre-flight reads every row of `spec` (a local dataset, and not too large to sample)."""
    try:
        source = data.parse_source(spec, "rl")
    except UserError:  # a file no stage reads, missing: the corpus reports it
        return True
    if source.kind == "hub":
        return False
    small = source.path is not None and source.path.stat().st_size < data.PEEK_ABOVE_BYTES
    return full or source.kind not in ("jsonl", "csv", "parquet") or small


def note_missing_data(p: Preflight) -> None:
    """Datasets not there yet are shown, not refused: a preset is planned before its data exists (`rlctl train`
    refuses it)."""
    missing = plan_mod.missing_data(p.cfg) if p.paths is None else []
    if missing:
        p.report.checks["missing data"] = "; ".join(missing) + " (rlctl train refuses the run until then)"


def check_datasets(p: Preflight) -> None:
    """Every dataset is read and recognised (`read_data`)."""
    p.rows = p.report.rows = read_data(p.cfg, p.report, p.full, p.paths)


def check_chat_template(p: Preflight) -> None:
    """The chat template the run will use, there when the data needs one (`chat_template`)."""
    p.template = chat_template(p.cfg, p.folder, p.rows, p.report)


def check_tokenizer(p: Preflight) -> None:
    """The run's tokenizer, light, when it can be had before launch (`tokenizer`)."""
    paths = p.paths or plan_mod.data_paths(p.cfg, p.run_dir)
    p.tokenizer = tokenizer(p.cfg, p.folder, p.template, paths, p.full, p.report)


def check_lengths(p: Preflight) -> None:
    """Rows over each training stage's length limit, counted with the tokenizer (`count_lengths`)."""
    if p.tokenizer is not None:
        count_lengths(p.cfg, p.tokenizer, p.rows, p.full, p.report)
