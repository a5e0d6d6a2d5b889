"""The one config schema for a whole run, and how presets, files and flags are layered into it.

Override order: preset < --config FILE < --algorithm / --hardware < --set key=value.
Every key is documented by its `Field(description=...)`; unknown keys are rejected with a suggestion.

Package `rlctl.config`: the whole run's schema and the layering (this module), the sections it is made of
(`sections`: model, data, sft, rm, dpo, kto, hardware, checkpoint, logging; `rl`: the rl section) and the preset
YAML layers (`presets`).
May import: base, vision.
"""

from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from rlctl.config import aliases, presets
from rlctl.config.rl import (
    ADVANTAGE_NAMES,
    AGG_MODES,
    KL_NAMES,
    OFFLINE_ALGORITHMS,
    PF_PPO_MODES,
    POLICY_LOSS_NAMES,
    RL_ALGORITHMS,
    RewardSpec,
    RLConfig,
)
from rlctl.config.sections import (
    STAGE_ORDER,
    CheckpointConfig,
    DataConfig,
    DPOConfig,
    HardwareConfig,
    KTOConfig,
    LoggingConfig,
    ModelArch,
    ModelConfig,
    RMConfig,
    Section,
    SFTConfig,
    StageName,
    VisionArch,
)
from rlctl.errors import UserError, did_you_mean

__all__ = [
    "ADVANTAGE_NAMES",
    "AGG_MODES",
    "KL_NAMES",
    "OFFLINE_ALGORITHMS",
    "PF_PPO_MODES",
    "POLICY_LOSS_NAMES",
    "RESUMABLE",
    "RL_ALGORITHMS",
    "STAGE_ORDER",
    "CheckpointConfig",
    "DPOConfig",
    "DataConfig",
    "HardwareConfig",
    "KTOConfig",
    "LoggingConfig",
    "ModelArch",
    "ModelConfig",
    "RLConfig",
    "RMConfig",
    "RewardSpec",
    "RunConfig",
    "SFTConfig",
    "Section",
    "StageName",
    "VisionArch",
    "dump",
    "layered",
    "load_run_config",
    "read_run_config",
    "resolve",
    "validate",
    "with_resume_overrides",
]


DEFAULT_STAGES: tuple[StageName, ...] = ("sft", "rm", "rl")  # a run without `stages`


class RunConfig(Section):
    name: str = Field("run", description="Run name, used for the default run directory.")
    description: str = Field("", description="What this run or preset is for.")
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Seed for data order, sampling and initialisation.")
    stages: list[StageName] = Field(
        default_factory=lambda: list(DEFAULT_STAGES),
        description="Stages to run; they always run in the order sft, dpo, kto, rm, rl.",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model to train and how (full, LoRA, QLoRA)."
    )
    data: DataConfig = Field(
        default_factory=DataConfig, description="Datasets for each stage, or a generated built-in task."
    )
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Supervised fine-tuning stage.")
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="Offline preference optimisation stage (DPO).")
    kto: KTOConfig = Field(default_factory=KTOConfig, description="Offline unpaired preference stage (KTO).")
    rm: RMConfig = Field(default_factory=RMConfig, description="Reward-model stage (pairwise).")
    rl: RLConfig = Field(default_factory=RLConfig, description="Online RL stage: algorithm, sampling, rewards.")
    hardware: HardwareConfig = Field(default_factory=HardwareConfig, description="What to plan and launch for.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint retention.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics logging and trackers.")

    @field_validator("data")
    @classmethod
    def _codec(cls, data: DataConfig) -> DataConfig:
        """data.encoding names a codec Python knows."""
        import codecs

        try:
            codecs.lookup(data.encoding)
        except LookupError:
            raise ValueError(
                f"data.encoding: unknown encoding '{data.encoding}' (use a Python codec name: utf-8, cp1252, "
                "latin-1, utf-16)"
            ) from None
        return data

    @field_validator("stages")
    @classmethod
    def _pipeline_order(cls, stages: list[str]) -> list[str]:
        """Stages always run in pipeline order (sft, dpo, kto, rm, rl), each once."""
        if not stages:
            raise ValueError("stages: at least one stage is needed")
        if len(set(stages)) != len(stages):
            raise ValueError(f"stages: {stages} lists a stage twice")
        return [s for s in STAGE_ORDER if s in stages]

    @model_validator(mode="after")
    def _cross_field(self) -> "RunConfig":
        """Rules that span several keys."""
        files = [role for role in presets.DATA_FILES if getattr(self.data, role)]
        if self.data.generate and files:
            raise ValueError(
                f"data.generate={self.data.generate} and data.{files[0]}={getattr(self.data, files[0])} are set in "
                "one layer: generated data replaces every data file, so yours would not be read. To read your "
                "files set data.generate: null (--set data.generate=null); to generate, drop "
                + ", ".join(f"data.{role}" for role in files)
            )
        uses_rm = any(r.name == "reward_model" for r in self.rl.rewards)
        if "rl" in self.stages and uses_rm and "rm" not in self.stages:
            raise ValueError(
                "rl.rewards: `reward_model` needs the rm stage in stages (e.g. sft,rm,rl), "
                "or drop it with --set 'rl.rewards=[{name: exact_match}]'"
            )
        if "rl" in self.stages:
            self.rl.check(self.stages)
        return self


def _section_model(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section that `loc` (a pydantic error location) points into, or None when it is not a section."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = _sections_of(field.annotation)
        if not inner:
            return None
        model = inner[0]
    return model


def _sections_of(ann: Any) -> list[type[BaseModel]]:
    """The config sections a field's annotation holds (`Loss`, `ModelArch | None`, `list[RewardSpec]`)."""
    return [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]


def _key_choices(loc: tuple[Any, ...]) -> dict[str, str]:
    """What an unknown key at `loc` is compared with -> the key suggested, relative to its section: the section's
    keys, below the top level the keys of the sections inside it (`loss.clip_high`, compared as clip_high,
    loss.clip_high and loss_clip_high), the names the aliases table accepts there (moved keys: `clip_high`), and
    the keys of the sections above it, suggested whole (`rl.kl.beta` -> rl.beta)."""
    model = _section_model(RunConfig, loc)
    if model is None:
        return {}
    choices = {name: name for name in model.model_fields}
    for name, field in model.model_fields.items() if len(loc) > 1 else ():
        inner = _sections_of(field.annotation)
        if inner and get_origin(field.annotation) is not list:
            for key in inner[0].model_fields:
                choices.update(dict.fromkeys((key, f"{name}.{key}", f"{name}_{key}"), f"{name}.{key}"))
    if len(loc) <= 2:
        section = str(loc[0]) if len(loc) == 2 else ""
        prefix = f"{section}." if section else ""
        for alias in aliases.ALIASES:
            found = aliases.lookup(section, alias.name)
            if found and found[0] is alias and alias.accepted and found[1].startswith(prefix):
                choices.setdefault(alias.name, found[1].removeprefix(prefix))
    for depth in range(len(loc) - 2, 0, -1):  # the sections above it, nearest first
        above = _section_model(RunConfig, (*loc[:depth], ""))
        path = ".".join(str(p) for p in loc[:depth] if not isinstance(p, int))
        for name in above.model_fields if above is not None else ():
            choices.setdefault(name, f"{path}.{name}")
    return choices


def explain(error: ValidationError, source: str = "config") -> str:
    """One paragraph describing every problem in `error`, with did-you-mean hints for unknown keys."""
    parts = []
    for err in error.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden" and loc[0] == "data" and loc[-1] in ("rm", "dpo", "kto"):
            parts.append(f"unknown key '{key}': the rm, dpo and kto stages read data.preference")
        elif err["type"] == "extra_forbidden" and (refused := aliases.refusal(tuple(map(str, loc)))):
            parts.append(refused)
        elif err["type"] == "extra_forbidden":
            choices = _key_choices(loc)
            parts.append(f"unknown key '{key}'.{did_you_mean(str(loc[-1]), choices, say=choices)}")
        elif err["type"] == "value_error":
            parts.append(err["msg"].removeprefix("Value error, "))
        else:
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            parts.append(f"{key}: {err['msg']}{shown}")
    text = f"Invalid {source}: " + "; ".join(parts)
    return text if text.endswith(("?", ".")) else text + "."


def parse_set(item: str) -> dict[str, Any]:
    """`a.b.c=value` as a nested mapping; the value is read as YAML (numbers, booleans, lists)."""
    if "=" not in item:
        raise UserError(f"--set expects key=value, got '{item}'.")
    key, raw = item.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise UserError(f"--set has an empty key in '{item}'.")
    try:
        value: Any = yaml.load(raw, Loader=presets.YAML_LOADER) if raw else ""
    except yaml.YAMLError:
        value = raw
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def layered(
    preset: str | None = None,
    config_file: str | Path | None = None,
    algorithm: str | None = None,
    hardware: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The raw merged mapping, in override order, before validation; a line in `notes` for each layer that names
    moved keys."""
    data: dict[str, Any] = presets.load(preset, tuning=True) if preset else {}
    if config_file:
        own = aliases.canonical(presets.read_yaml(Path(config_file)), str(config_file), notes)
        data = _overlay(data, aliases.replaced(presets.resolve_layers(own, source=str(config_file)), own))
    data, tuning = presets.split_tuning(data, str(config_file or preset))
    if algorithm:
        name = presets.get(algorithm, kind="algorithms").name
        # the algorithm's preset, then what the recipe sets for it (`for_algorithm.NAME`: its rate for 16 updates)
        data = presets.merge_layer(data, presets.load(name, kind="algorithms"))
        data = presets.merge_layer(data, tuning.get(name, {}))
    if hardware:
        data = presets.merge_layer(data, hardware_layer(hardware))
    if sets:  # one layer: the command line contradicting itself (epochs and max_steps, a name and its alias) is refused
        data = _overlay(data, _set_layer(sets, notes))
    return data


def _set_layer(sets: list[str] | tuple[str, ...], notes: list[str] | None = None) -> dict[str, Any]:
    """The `--set` items as one layer, TRL names and moved keys rewritten to rlctl keys."""
    layer: dict[str, Any] = {}
    for item in sets:
        layer = presets.deep_merge(layer, parse_set(item))
    return aliases.canonical(layer, "--set", notes)


def _overlay(data: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """`layer` merged on top of `data` (`presets.merge_layer`: its data choice wins whole), its stage lengths
    (epochs or max_steps) replacing the earlier ones."""
    return presets.merge_layer(aliases.replaced(data, layer), layer)


def hardware_layer(spec: str) -> dict[str, Any]:
    """The config layer for `--hardware SPEC`: its hardware preset when one exists, else the spec itself."""
    if spec in presets.all_presets() and presets.get(spec).kind == "hardware":
        return presets.load(spec, kind="hardware")
    return {"hardware": {"spec": spec}}


def validate(data: dict[str, Any], source: str = "config") -> RunConfig:
    """A RunConfig from a merged mapping, or a UserError explaining every problem in one paragraph."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(explain(e, source)) from None


def resolve(
    preset: str | None = None,
    config_file: str | Path | None = None,
    algorithm: str | None = None,
    hardware: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    notes: list[str] | None = None,
) -> RunConfig:
    """Layer preset, file, flags and --set overrides into one validated RunConfig; a line in `notes` for each
    layer that names moved keys."""
    if not preset and not config_file:
        raise UserError("Nothing to run: pass --preset NAME or --config FILE (see `rlctl presets list`).")
    cfg = validate(layered(preset, config_file, algorithm, hardware, sets, notes))
    if cfg.rl.algorithm not in {n for n, p in presets.all_presets().items() if p.kind == "algorithms"}:
        algos = [n for n, p in presets.all_presets().items() if p.kind == "algorithms"]
        raise UserError(
            f"Invalid config: rl.algorithm '{cfg.rl.algorithm}' is not a known algorithm."
            f"{did_you_mean(cfg.rl.algorithm, algos)} Known: {', '.join(sorted(algos))}."
        )
    return cfg


def dump(cfg: RunConfig) -> str:
    """The resolved config as YAML, as written to the run directory."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# Keys `rlctl resume --set` may change: how a step is computed or kept, never what is computed (the checkpoints,
# the data order and the schedule stay valid). rlctl.launch.resume_check checks those whose safety depends on the
# run: max_steps not below the interrupted stage's last checkpoint, model.name_or_path the same weights (moved),
# rl.rewards the same rewards with other on_error / correctness settings.
RESUMABLE = (
    *(f"{stage}.micro_batch_size" for stage in STAGE_ORDER),
    *(f"{stage}.max_steps" for stage in STAGE_ORDER),
    *(f"{stage}.save_every" for stage in STAGE_ORDER),
    "model.name_or_path",
    "rl.rewards",
    "logging.console_every_s",
    "model.gradient_checkpointing",
    "hardware.optimizer_offload",  # where the optimizer state waits between steps, not what it holds
    "checkpoint.keep_last",
    "checkpoint.keep_best",
    "logging.every",
    "logging.report_to",
    "logging.alarms",
    "logging.alarm_steps",
    "rl.use_vllm",  # the generation engine holds no training state
    "rl.mismatch.sync_tolerance",
)


def with_resume_overrides(
    cfg: RunConfig, sets: list[str] | tuple[str, ...], notes: list[str] | None = None
) -> RunConfig:
    """The run's config with `--set` overrides given to `rlctl resume`; only RESUMABLE keys may change."""
    for item in sets:
        key = aliases.key_for(item.split("=", 1)[0])
        if key not in RESUMABLE:
            raise UserError(
                f"--set {key} cannot change on resume: the run's checkpoints were made with it. Keys a resume may "
                f"change: {', '.join(RESUMABLE)}. Start a new run (rlctl train ... --set {item}) to change it."
            )
    data = _overlay(cfg.model_dump(mode="json"), _set_layer(sets, notes))
    return validate(data, source="rlctl resume --set")


def read_run_config(path: Path, notes: list[str] | None = None) -> dict[str, Any]:
    """The mapping of a run directory's config.yaml, keys that moved since it was written at their new places."""
    return saved(presets.read_yaml(path), str(path), notes)


def saved(data: dict[str, Any], source: str, notes: list[str] | None = None) -> dict[str, Any]:
    """A config an older rlctl saved (config.yaml, plan.json's copy) as today's schema reads it: keys that moved
    at their new places, keys whose choice is gone dropped (a line in `notes` for each)."""
    return aliases.without_retired(aliases.renamed(data, source, notes), source, notes)


def load_run_config(path: Path) -> RunConfig:
    """The resolved config a run directory was started with (keys that moved since, at their new places)."""
    return validate(read_run_config(path), source=str(path))
