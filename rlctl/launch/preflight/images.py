"""The pre-flight's check of the images: every image opens (Pillow), its size giving the image tokens the planner adds
(`rlctl.data.images.ImageBudget`), and image data goes only to a model with a vision tower rlctl trains."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlctl import data
from rlctl import vision as families
from rlctl.config import RunConfig
from rlctl.data import images
from rlctl.errors import UserError
from rlctl.launch.preflight.datasets import read_data
from rlctl.launch.preflight.report import Preflight, Report, require
from rlctl.plan import planner as plan_mod


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


def check_resume_images(cfg: RunConfig, run_dir: Path, stages: Sequence[str]) -> None:
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


def check_data_images(p: Preflight) -> None:
    """Every image of the rows read opens (`check_images`)."""
    check_images(p.cfg, p.rows, p.full, p.report)
