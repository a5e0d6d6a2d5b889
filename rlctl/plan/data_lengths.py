"""The data's counted lengths the memory model plans by: what the pre-flight counted (or the run directory's
data_lengths.json recorded, `DataLengths`), and the config the memory model sizes with them (sequences as long as
the data's, not as long as the limits allow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rlctl.config import RunConfig
from rlctl.data.images import ImageBudget, pixel_bounds, worst_case
from rlctl.plan.parts import Noted
from rlctl.rundir import RunDir, read_record, write_record
from rlctl.rundir.records import nested, pick, unknown

# data_lengths.json's key for each stage's count: RL its longest prompt; the offline stages their longest row as the
# trainer sees it (SFT: the whole sequence after the chat template, with EOS; rm, dpo: the prompt and the longer
# reply; kto: the prompt and its completion), of the rows kept (at most the stage's length limit)
LENGTH_KEYS = {
    "rl": "rl_longest_prompt",
    "sft": "sft_longest_row",
    "rm": "rm_longest_row",
    "dpo": "dpo_longest_row",
    "kto": "kto_longest_row",
}
OFFLINE_STAGES = ("sft", "rm", "dpo", "kto")
IMAGES_KEY = "images"  # data_lengths.json's {stage: ImageBudget} of a vision-language run's data


@dataclass
class DataLengths:
    """data_lengths.json (`RunDir.data_lengths`): the pre-flight's counts ({stage: longest}, each under its key of
    LENGTH_KEYS) and a vision-language run's image budgets ({stage: ImageBudget}), as the plan used them."""

    longest: dict[str, int] = field(default_factory=dict)
    images: dict[str, ImageBudget] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this rlctl does not know, written back as they were

    KINDS: ClassVar[dict[str, Any]] = {**dict.fromkeys(LENGTH_KEYS.values(), int), IMAGES_KEY: dict}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {LENGTH_KEYS[stage]: n for stage, n in self.longest.items() if stage in LENGTH_KEYS and n}
        if self.images:
            out[IMAGES_KEY] = {stage: b.to_json() for stage, b in self.images.items()}
        return out | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataLengths:
        """A WrongKind naming a count or image budget of another kind; a ValueError for a count under 1."""
        values = pick(data, cls.KINDS)
        longest = {stage: values[key] for stage, key in LENGTH_KEYS.items() if key in values}
        for stage, n in longest.items():
            if n < 1:
                raise ValueError(f"its `{LENGTH_KEYS[stage]}` is {n!r}, not a count of tokens")
        found = values.get(IMAGES_KEY, {}).items()
        images = {stage: nested(ImageBudget.from_json, b, f"{IMAGES_KEY}.{stage}") for stage, b in found}
        return cls(longest, images, unknown(data, cls.KINDS))


def record(run_dir: Path, lengths: dict[str, int], images: dict[str, ImageBudget]) -> None:
    """Write data_lengths.json into a new run directory (whole or not at all) when the pre-flight counted
    anything."""
    if lengths or images:
        write_record(RunDir(run_dir).data_lengths, DataLengths(dict(lengths), dict(images)), indent=None)


def recorded(run_dir: str | Path, works: str) -> DataLengths:
    """The run directory's data_lengths.json (empty when there is none); a DamagedFile naming it, followed by
    `works`, when it is not the record rlctl wrote."""
    path = RunDir(Path(run_dir)).data_lengths
    if not path.exists() and not path.is_symlink():
        return DataLengths()
    return read_record(path, DataLengths.from_json, works)


def image_budgets(cfg: RunConfig, run_dir: str | Path, given: dict[str, ImageBudget] | None) -> dict[str, ImageBudget]:
    """The image tokens per row the memory model plans for each stage of a vision-language run: `given` (the
    pre-flight read the data's image sizes), else what the run directory recorded, else the worst case (one image
    per row at data.max_pixels); none for a text model."""
    vision = cfg.model.arch.vision if cfg.model.arch is not None else None
    if vision is None:
        return {}
    if given is None:
        works = "Remove it, and the plan takes the worst case: one image per row at data.max_pixels."
        given = recorded(run_dir, works).images
    bounds = pixel_bounds(vision, cfg.data.min_pixels, cfg.data.max_pixels)
    out: dict[str, ImageBudget] = {}
    for stage in cfg.stages:
        out[stage] = given.get(stage) or worst_case(vision, *bounds)
    return out


def data_lengths_of(run_dir: str | Path, given: dict[str, int] | None) -> dict[str, int]:
    """The data's counted lengths the memory model plans, {stage: tokens} (see LENGTH_KEYS): `given` (the pre-flight
    counted them), else what the run directory recorded when it was prepared (so every rank and every resume plans
    the same), else none."""
    if given is not None:
        return given
    works = "Remove it, and the plan uses data.max_prompt_length and each stage's max_length instead."
    return recorded(run_dir, works).longest


def prompt_tokens_of(run_dir: str | Path, given: int | None) -> int | None:
    """The longest RL prompt in tokens the memory model plans: `given`, else the run directory's record, else None."""
    return given if given is not None else data_lengths_of(run_dir, None).get("rl")


def sequence_tokens(stage: str, longest: int, limit: int) -> tuple[int, str]:
    """(tokens per sequence the memory model plans for an offline stage whose longest kept row has `longest` tokens,
    why). TRL pads each micro-batch to its longest sequence, so no micro-batch is longer than the longest row; KTO's
    KL pass pairs a prompt with another row's completion, which twice the longest row bounds. Never past `limit`."""
    key = f"{stage}.max_length={limit} bounds it"
    if stage == "kto":
        why = f"twice the longest kto row: TRL's KL pass pairs a prompt with another row's completion ({key})"
        return min(2 * longest, limit), why
    row = "row (chat template and EOS included)" if stage == "sft" else "row (prompt + the longer reply)"
    return min(longest, limit), f"the longest {stage} {row} of the data ({key}); TRL pads a batch to its longest"


def as_long_as_the_data(cfg: RunConfig, lengths: dict[str, int]) -> Noted[RunConfig]:
    """`cfg` for the memory model, with a decision for each length it takes from the data: sequences as long as the
    data's where the pre-flight counted them and they are shorter than the limits. RL prompts: the longest (TRL and
    rlctl's loop pad a batch to its longest prompt, not to data.max_prompt_length); multi-turn runs, whose
    conversations grow past the prompt, keep data.max_prompt_length. sft, rm, dpo, kto: the longest row
    (`sequence_tokens`), not `<stage>.max_length`."""
    update: dict[str, Any] = {}
    decisions = []
    limit, longest = cfg.data.max_prompt_length, lengths.get("rl")
    if longest is not None and longest < limit and "rl" in cfg.stages and not cfg.rl.tools:
        why = f"the longest prompt of data.rl (data.max_prompt_length={limit} bounds it); a batch pads to its longest"
        decisions.append({"setting": "RL prompt tokens (memory)", "value": str(longest), "why": why})
        update["data"] = cfg.data.model_copy(update={"max_prompt_length": max(longest, 1)})
    for stage in OFFLINE_STAGES:
        if stage not in cfg.stages or not lengths.get(stage):
            continue
        sc = getattr(cfg, stage)
        tokens, why = sequence_tokens(stage, lengths[stage], sc.max_length)
        if tokens < sc.max_length:
            decisions.append({"setting": f"{stage} tokens per sequence (memory)", "value": str(tokens), "why": why})
            update[stage] = sc.model_copy(update={"max_length": tokens})
    return Noted(cfg.model_copy(update=update) if update else cfg, decisions=tuple(decisions))
