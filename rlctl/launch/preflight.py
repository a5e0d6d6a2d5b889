"""The pre-flight: everything a run needs that can be checked before `accelerate launch`, in seconds and without
loading weights or importing torch/transformers. `rlctl plan` shows it (exit 2 when a check fails) and `rlctl
train` / `rlctl resume` run it again before they launch.

- the model: a folder with config.json, a Hub id in the local cache, or a readable GGUF file (converted at launch);
  offline (HF_HUB_OFFLINE) and uncached is refused naming the download command;
- the chat template, when any stage's data holds message lists: the tokenizer's own, or `data.chat_template`;
- the run directory can be created and written;
- the tools of rl.tools load and can be described to the model;
- model-written code (the code_tests reward, the python tool) can be run in the kernel sandbox, unless
  rl.allow_unconfined_code opts out;
- every dataset is read and its format recognised (with the stage's column mapping), and rows over the stage's
  length limit are counted with the model's tokenizer files (`tokenizers` + jinja2), refused when more than
  `data.max_drop_fraction` would be dropped;
- every image opens (Pillow), its size giving the image tokens the planner adds (`rlctl.data.images.ImageBudget`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import data, tables
from rlctl import vision as families
from rlctl.config import ModelConfig, RunConfig
from rlctl.data import images, tokens
from rlctl.data.images import ImageBudget
from rlctl.errors import RowFailure, UserError, did_you_mean
from rlctl.plan import arch as model_arch
from rlctl.plan import gguf
from rlctl.plan import planner as plan_mod

ROLE_OF_STAGE = {"sft": "sft", "dpo": "preference", "kto": "kto", "rm": "preference", "rl": "rl"}


@dataclass
class Report:
    """What the pre-flight found: one line per check, the datasets by role, the length counts by stage."""

    checks: dict[str, str] = field(default_factory=dict)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    lengths: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # {stage: rows}, not reported
    infos: dict[str, data.DataInfo] = field(default_factory=dict)  # {stage: what was read}, not reported
    images: dict[str, ImageBudget] = field(default_factory=dict)  # {stage: its rows' image tokens}

    def to_json(self) -> dict[str, Any]:
        images_read = {"images": {s: b.to_json() for s, b in self.images.items()}} if self.images else {}
        return {"checks": self.checks, "lengths": self.lengths, "errors": self.errors, **images_read}

    def recognised(self) -> dict[str, data.DataInfo]:
        """What was recognised in each dataset, by data role (a role read by two stages once)."""
        return {info.role: info for info in self.infos.values()}


# --------------------------------------------------------------------------------------------------- model
def _looks_local(name: str) -> bool:
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") != 1


def model_folder(model: ModelConfig, bf16: bool = False) -> tuple[Path | None, str]:
    """(the folder holding the model's config and tokenizer files, where it is); (None, why) when it is not here
    yet (a Hub id downloaded at launch, a GGUF file converted at launch). A UserError when it cannot be had."""
    name = model.name_or_path
    if gguf.is_gguf(model):
        spec, _ = gguf.plan_import(model, bf16)
        return (Path(spec.folder) if spec.cached else None), spec.describe()
    if name in model_arch.BUILTIN_MODELS:
        return None, f"{name}, built into the run directory at launch"
    folder = Path(name).expanduser()
    if _looks_local(name):
        if not folder.is_dir():
            raise UserError(
                f"model.name_or_path={name}: no such folder (a Hub model id is written owner/name). Point it at a "
                "folder holding the model's config.json and weights."
            )
        if not (folder / "config.json").is_file():
            raise UserError(f"model.name_or_path={name}: {folder} has no config.json, so it is not a model folder.")
        return folder, f"folder {folder}"
    cached = model_arch.cached_config(name)
    if cached is not None:
        return cached.parent, f"Hugging Face cache ({cached.parent})"
    if model_arch.offline():
        raise UserError(
            f"model.name_or_path={name} is not in the local Hugging Face cache ({model_arch.hub_cache()}) and "
            f"HF_HUB_OFFLINE is set, so it cannot be downloaded. Download it on a machine with network access "
            f"into the same cache: `hf download {name}` (HF_HOME / HF_HUB_CACHE as here), or point "
            "model.name_or_path at a local folder."
        )
    return None, f"Hub id {name}, not in the local cache: downloaded when training starts"


# ---------------------------------------------------------------------------------------------- run dir
def run_dir_problem(run_dir: Path) -> str | None:
    """Why the run directory cannot be created and written, or None."""
    probe = Path(run_dir).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"--run-dir {run_dir}: {probe} is a file, so no run directory can be made there; pick another --run-dir."
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"--run-dir {run_dir}: {probe} is not writable by this user; pick a folder you can write."
    return None


# ------------------------------------------------------------------------------------------------- data
def _sources(cfg: RunConfig, paths: dict[str, Path] | None) -> dict[str, str]:
    if paths is not None:
        return {role: str(p) for role, p in paths.items()}
    return {role: getattr(cfg.data, role) for role in ("sft", "preference", "rl", "eval") if getattr(cfg.data, role)}


def _stage_roles(cfg: RunConfig) -> list[tuple[str, str]]:
    """(stage or eval, the role it reads its data as) for the run's datasets."""
    pairs = [(stage, ROLE_OF_STAGE[stage]) for stage in cfg.stages]
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
        entry = {"rows": len(sizes), "over_limit": len(over), "share": round(len(over) / len(sizes), 4)}
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


# ----------------------------------------------------------------------------------------------- images
def check_images(cfg: RunConfig, rows: dict[str, list[dict]], full: bool, report: Report) -> None:
    """Every image of each stage's rows opens (`full`: decoded, as training will; else the first images.PLAN_READS
    read from their headers), else an error naming the file, the row and the image; image data for a model whose
    architecture has no vision tower is refused; with one, each training stage's image budget (`report.images`)."""
    vision = cfg.model.arch.vision if cfg.model.arch is not None else None
    family = families.of_arch(cfg.model.arch)
    bounds = images.pixel_bounds(vision, cfg.data.min_pixels, cfg.data.max_pixels)
    resized = family is not None and family.pixel_bounds is not None  # within the bounds, not to a fixed size
    if resized and bounds[0] > bounds[1] and any(rows.values()):
        report.errors.append(
            f"The image resize bounds are empty: min_pixels {bounds[0]:,} is above max_pixels {bounds[1]:,} (data."
            "min_pixels / data.max_pixels, or the model's preprocessor_config.json where unset). Set data.min_pixels "
            "at most data.max_pixels."
        )
        return
    for stage, stage_rows in rows.items():
        info, cap = report.infos[stage], None if full else images.PLAN_READS
        try:
            sizes = images.read_sizes(stage_rows, info.base, info.row, decode=full, cap=cap, vision=vision)
        except UserError as e:
            report.errors.append(str(e))
            return
        if any(sizes) and cfg.model.arch is not None and vision is None:
            report.errors.append(
                f"The {stage} data ({info.source}) holds images, but {cfg.model.name_or_path} has no vision tower "
                f"(model.arch.vision) rlctl trains ({families.names()}): train such a "
                "model, or drop the images."
            )
            return
        if vision is not None and stage != "eval" and stage_rows:
            seen = sum(len(images.entries(r)) for r in stage_rows)
            report.images[stage] = images.budget(sizes, vision, *bounds, seen)


def check_resume_images(cfg: RunConfig, run_dir: Path, stages: list[str]) -> None:
    """Before a vision-language run resumes: every image of the local datasets its unfinished `stages` (and their
    held-out scoring) read opens, decoded, as `rlctl train` checked it; a UserError (exit 2) naming the file, the
    row and the image otherwise (moved or deleted since the run started). A text model's run: nothing to check."""
    if cfg.model.arch is None or cfg.model.arch.vision is None or not stages:
        return
    paths = {}
    for role, path in plan_mod.data_paths(cfg, run_dir).items():
        try:
            local = data.parse_source(str(path), role).kind != "hub"
        except UserError:  # a file gone: read_data names it
            local = True
        if local:
            paths[role] = path
    left = cfg.model_copy(update={"stages": stages})
    report = Report()
    check_images(left, read_data(left, report, full=True, paths=paths), True, report)
    require(report)


# ------------------------------------------------------------------------------------------------ tools
def check_tools(cfg: RunConfig, report: Report) -> None:
    """rl.tools resolved as the RL stage will: plugin files imported, entry points loaded, schemas built."""
    from rlctl.rollout import tools

    try:
        found = tools.resolve_all(cfg.rl.tools)
    except UserError as e:
        report.errors.append(str(e))
        return
    report.checks["tools"] = f"{', '.join(found)} (up to {cfg.rl.agent.max_turns} turns per rollout)"


def check_row_tools(cfg: RunConfig, rows: list[dict[str, Any]], report: Report) -> None:
    """RL rows' own `tools` (or verl's `extra_info.tools_kwargs`) must name tools of rl.tools (those are the ones
    rlctl can run), and the arguments a row binds must be parameters of its tool."""
    import inspect

    from rlctl.rollout import tools

    try:
        known = tools.resolve_all(cfg.rl.tools)
    except UserError:  # reported by check_tools already
        return
    for i, row in enumerate(rows):
        try:
            names = tools.tool_names(tokens.row_tools(row) or [])
            bound = tokens.row_tool_kwargs(row) or {}
        except (ValueError, AttributeError, TypeError) as e:
            report.errors.append(
                f"data.rl row {i + 1}: its tools column is not a list of OpenAI tool schemas, or its "
                f"extra_info.tools_kwargs not verl's {{tool: {{create_kwargs: {{...}}}}}} ({e})."
            )
            return
        names += [n for n in bound if n not in names]
        for name, kwargs in bound.items():
            params = inspect.signature(known[name].fn).parameters if name in known else {}
            extra = [k for k in kwargs if k not in params]
            if params and extra and all(p.kind != p.VAR_KEYWORD for p in params.values()):
                hint = did_you_mean(extra[0], list(params))
                report.errors.append(
                    f"data.rl row {i + 1}: extra_info.tools_kwargs gives the tool '{name}' the argument '{extra[0]}', "
                    f"which it does not take (its parameters: {', '.join(params)}).{hint}"
                )
                return
        unknown = [n for n in names if n not in known]
        if unknown:
            report.errors.append(
                f"data.rl row {i + 1} offers the tool '{unknown[0]}', which rl.tools does not provide "
                f"(rl.tools: {', '.join(known) or 'none'}).{did_you_mean(str(unknown[0]), known)} A row's tools "
                "choose among rl.tools; add the tool there (a plugin path.py:function or an entry point)."
            )
            return


def runs_model_code(cfg: RunConfig) -> bool:
    """The RL stage executes code the policy writes: the code_tests reward or the python tool."""
    rewards = [r.name.split("(")[0].strip() for r in cfg.rl.rewards]
    return "rl" in cfg.stages and ("code_tests" in rewards or "python" in cfg.rl.tools)


def check_code_tests(cfg: RunConfig, rows: list[dict[str, Any]], report: Report) -> None:
    """With the code_tests reward, every RL row's `tests` must be Python that asserts something: tests that assert
    nothing would pay every completion 1.0."""
    from rlctl.rewards.builtin import code_tests_problem

    if not any(r.name.split("(")[0].strip() == "code_tests" for r in cfg.rl.rewards):
        return
    for i, row in enumerate(rows):
        problem = code_tests_problem(row["tests"]) if "tests" in row else None  # a missing column: the dry run
        if problem:
            report.errors.append(f"data.rl row {i + 1}: its tests (for the code_tests reward) {problem}.")
            return


def check_code_sandbox(cfg: RunConfig, report: Report) -> None:
    """Model-written code runs only in the bubblewrap sandbox: refused here when that cannot start, unless the
    user opted out with rl.allow_unconfined_code."""
    from rlctl import sandbox

    why = sandbox.problem()
    if why is None:
        report.checks["code sandbox"] = "bubblewrap: model-written code runs confined"
    elif cfg.rl.allow_unconfined_code:
        report.checks["code sandbox"] = "UNCONFINED (rl.allow_unconfined_code=true): no kernel sandbox here"
    else:
        report.errors.append(why)


# -------------------------------------------------------------------------------------------------- run
def run(
    cfg: RunConfig, run_dir: Path, full: bool = False, paths: dict[str, Path] | None = None, bf16: bool = False
) -> Report:
    """Every check, collected (nothing raised): `full` reads every row (train), else large files are sampled
    (plan); `paths` are the datasets when they are not the config's own (generated data); `bf16` the plan's
    precision (the dtype a GGUF file is converted in)."""
    report = Report()
    folder = None
    try:
        folder, where = model_folder(cfg.model, bf16)
        report.checks["model"] = where
    except UserError as e:
        report.errors.append(str(e))
    problem = run_dir_problem(run_dir)
    report.checks["run directory"] = problem or f"{run_dir} can be written"
    if problem:
        report.errors.append(problem)
    if (problem := model_arch.vision_stages_problem(cfg)) is not None:
        report.errors.append(problem)
    if "rl" in cfg.stages and cfg.rl.tools:
        check_tools(cfg, report)
    if runs_model_code(cfg):
        check_code_sandbox(cfg, report)
    missing = plan_mod.missing_data(cfg) if paths is None else []
    if missing:  # shown, not refused: a preset is planned before its data exists; `rlctl train` refuses it
        report.checks["missing data"] = "; ".join(missing) + " (rlctl train refuses the run until then)"
    if cfg.data.generate and paths is None:
        source = f"generated ({cfg.data.generate}, data.generate)"
        report.data = {role: {"source": source, "stages": stages} for role, stages in readers(cfg).items()}
        return report
    rows = report.rows = read_data(cfg, report, full, paths)
    check_images(cfg, rows, full, report)
    if "rl" in cfg.stages:
        check_row_tools(cfg, rows.get("rl") or [], report)
        check_code_tests(cfg, rows.get("rl") or [], report)
    template = chat_template(cfg, folder, rows, report)
    tok = tokenizer(cfg, folder, template, paths or plan_mod.data_paths(cfg, run_dir), full, report)
    if tok is not None:
        count_lengths(cfg, tok, rows, full, report)
    return report


def longest(report: Report) -> dict[str, int]:
    """The lengths the memory model plans, {stage: tokens} (rlctl.plan.data_lengths.LENGTH_KEYS): each training stage's
    longest kept row as counted (RL: its longest prompt); a stage whose rows were not counted is left out."""
    return {stage: n["longest"] for stage, n in report.lengths.items() if stage != "eval" and n.get("longest")}


def require(report: Report) -> None:
    """Raise the report's problems as one UserError (exit 2)."""
    if report.errors:
        head = "Pre-flight failed: " if len(report.errors) > 1 else ""
        raise UserError(head + " ".join(report.errors))


def show(console: Any, report: Report) -> None:
    """The pre-flight as `rlctl plan` prints it: the checks, the datasets, the over-long rows per stage."""
    from rich.markup import escape
    from rich.table import Table

    for name, text in report.checks.items():
        console.print(f"[bold]{name.capitalize()}[/] {escape(text)}")
    if report.data:
        table = Table(title="Data", title_justify="left")
        for col in ("role", "read by", "source", "format", "rows"):
            table.add_column(col, overflow="fold")
        for role, info in report.data.items():
            stages = ", ".join("held-out eval" if s == "eval" else s for s in info.get("stages", []))
            if "error" in info:
                table.add_row(role, stages, escape(info["source"]), f"[red]{escape(info['error'])}[/]", "")
                continue
            fmt = info.get("format", "")
            text = f"{fmt}: {data.FORMATS[fmt][0]}" if fmt in data.FORMATS else fmt
            text += "".join(f"; {n}" for n in info.get("notes", []))
            table.add_row(role, stages, escape(info["source"]), escape(text), str(info.get("rows", "")))
        tables.show(console, table)  # a block per dataset where a path is too long for its column
    show_lengths(console, report)


def show_lengths(console: Any, report: Report) -> None:
    """One line per stage with rows over its length limit."""
    for stage, n in report.lengths.items():
        sampled = " (of the rows sampled)" if n["sampled"] else ""
        console.print(
            f"[bold]Lengths[/] {stage}: {n['over_limit']} of {n['rows']} rows ({n['share']:.1%}) over "
            f"{n['limit_key']}={n['limit']} tokens{sampled}, dropped at launch; {n['keeps_95']} keeps 95%"
        )
