"""Vision-language families: what each family rlctl trains is, one module each (`qwen2_vl`: Qwen2-VL and
Qwen2.5-VL; `gemma3`: Gemma 3), each a `rlctl.vision.family.Family`, and the lookups every rule reads them through
(the config's tower kinds, the planner, the pre-flight, the engine choice, the stages and the runtime).

A model's family is found by its config.json model_type (`of_model_type`; an unknown one is refused by name, never
taken for another family) or, before the model is read, by its `model.arch.vision.kind` (`of_tower`). Torch-free:
the planner and the pre-flight import it. Adding a family: one module and its tests (docs/vlm.md, "Adding a
family").

May import: base.
"""

from __future__ import annotations

from typing import Any

from rlctl.errors import UserError
from rlctl.vision import gemma3, qwen2_vl
from rlctl.vision.family import Family, Kinded, Tower

FAMILIES: tuple[Family, ...] = (qwen2_vl.FAMILY, gemma3.FAMILY)
KINDS: tuple[str, ...] = tuple(f.tower_kind for f in FAMILIES)  # model.arch.vision.kind's values
# the image resize bounds a fixed-size family's image budget records (where they do not apply): the first family's
DEFAULT_PIXEL_BOUNDS: tuple[int, int] = qwen2_vl.MIN_PIXELS, qwen2_vl.MAX_PIXELS


class UnknownFamily(UserError):
    """A vision-language model of a family rlctl does not train (exit 2)."""


def known() -> str:
    """The families rlctl trains, in words with their model types."""
    return "; ".join(f"{f.name} (model_type {', '.join(f.model_types)})" for f in FAMILIES)


def names() -> str:
    """The families rlctl trains, by name."""
    return ", ".join(f.name for f in FAMILIES)


def kinds_described() -> str:
    """The tower kinds, each in words (`model.arch.vision.kind`'s description)."""
    return " or ".join(f"{f.tower_kind} ({f.tower_summary})" for f in FAMILIES)


def find(model_type: str | None) -> Family | None:
    """The family whose models have this config.json model_type, or None."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def of_model_type(model_type: str | None, where: str) -> Family:
    """The family of a vision-language model (`where`: the model, for the message) by its model_type; an
    UnknownFamily naming it and the known ones otherwise."""
    found = find(model_type)
    if found is None:
        raise UnknownFamily(
            f"Invalid model: {where} is a vision-language model of model_type '{model_type}', a family rlctl does not "
            f"train; it trains {known()}. Train a model of one of those families, or add the family (docs/vlm.md, "
            "Adding a family)."
        )
    return found


def of_tower(tower: Kinded) -> Family:
    """The family of a `model.arch.vision` tower, by its kind (one of KINDS: the config admits no other)."""
    return next(f for f in FAMILIES if f.tower_kind == tower.kind)


def of_arch(arch: Any) -> Family | None:
    """The family of a ModelArch's vision tower (None: no arch, or a text model)."""
    tower = getattr(arch, "vision", None)
    return of_tower(tower) if tower is not None else None


def text_model_types() -> set[str]:
    """The model_types the families' language models are planned as."""
    return {f.text_model_type for f in FAMILIES}


def placeholder(arch: Any) -> str:
    """What a built-in chat template writes for an image part for the model of `arch` (its ModelArch, or None): its
    family's placeholder; a text model's template renders no image, and keeps the first family's."""
    family = of_arch(arch)
    return (family or FAMILIES[0]).placeholder


def image_problem(width: int, height: int, tower: Tower | None) -> str | None:
    """Why the image processor of `tower`'s family would refuse a width x height image (None: it takes it); for an
    unknown tower (None), the first refusal of any family's."""
    families = [of_tower(tower)] if tower is not None else FAMILIES
    return next((p for f in families if (p := f.image_problem(width, height)) is not None), None)
