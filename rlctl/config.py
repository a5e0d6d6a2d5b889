"""The one config schema for a whole run, and how presets, files and flags are layered into it.

Override order: preset < --config FILE < --algorithm / --hardware < --set key=value.
Every key is documented by its `Field(description=...)`; unknown keys are rejected with a suggestion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlctl import presets
from rlctl.errors import UserError, did_you_mean

StageName = Literal["sft", "dpo", "rm", "rl"]
STAGE_ORDER: tuple[str, ...] = ("sft", "dpo", "rm", "rl")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelArch(Section):
    """Architecture numbers of the model, used by the planner without downloading anything."""

    layers: int = Field(ge=1, description="Number of transformer layers.")
    hidden: int = Field(ge=1, description="Hidden size.")
    heads: int = Field(ge=1, description="Attention heads.")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention).")
    vocab: int = Field(ge=1, description="Vocabulary size.")
    intermediate: int = Field(ge=1, description="MLP intermediate size.")
    max_position: int = Field(32768, ge=1, description="Context length the model supports.")
    tie_embeddings: bool = Field(False, description="Input and output embeddings share weights.")


class ModelConfig(Section):
    name_or_path: str = Field(
        "builtin:tiny",
        description="Hugging Face model id, local folder, or `builtin:tiny` (a random-init model built offline).",
    )
    arch: ModelArch | None = Field(None, description="Architecture numbers (model presets carry them).")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weights dtype: auto = bfloat16 on GPUs that support it, float32 on CPU."
    )
    adapter: Literal["auto", "full", "lora", "qlora"] = Field(
        "auto", description="Train all weights, LoRA adapters, or LoRA on a 4-bit base; auto lets the planner pick."
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scaling = alpha / r).")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    trust_remote_code: bool = Field(False, description="Run model code from the Hub. Off unless you set it.")
    gradient_checkpointing: Literal["auto"] | bool = Field(
        "auto", description="Recompute activations in the backward pass; auto lets the planner pick."
    )


class DataConfig(Section):
    """Datasets: a local file (jsonl, json, parquet, csv), a folder written by datasets' `save_to_disk`
    (`folder@split` for a DatasetDict), or a Hub dataset (`owner/name[:config][@split]`, or `hf://...`).
    Formats are recognised from the columns; see docs/datasets.md."""

    generate: Literal["arithmetic"] | None = Field(
        None, description="Generate a built-in synthetic task into the run directory instead of reading files."
    )
    sft: str | None = Field(
        None, description="SFT data: `prompt`+`completion`, chat `messages`, `text`, or KTO rows (desirable kept)."
    )
    preference: str | None = Field(
        None, description="Preference data (rm, dpo, kto): `chosen`+`rejected` (optional `prompt`), or KTO rows."
    )
    rl: str | None = Field(
        None, description="RL prompts: `prompt` plus the ground-truth column, or verl's parquet layout as is."
    )
    eval: str | None = Field(None, description="Held-out prompts with ground truth (same formats as rl).")
    answer_field: str = Field("answer", description="Column that holds the ground-truth answer.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Rename columns to the names rlctl reads: {prompt: question, answer: solution}; a dotted source "
        "reaches into nested fields (answer: reward_model.ground_truth).",
    )
    max_prompt_length: int = Field(512, ge=1, description="Longest prompt in tokens.")


class TrainConfig(Section):
    """Optimisation settings shared by every stage."""

    max_steps: int = Field(100, ge=1, description="Optimizer steps in this stage.")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Peak learning rate.")
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "cosine", description="Learning-rate schedule."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    batch_size: int = Field(32, ge=1, description="Global batch (sequences per optimizer step, all processes).")
    micro_batch_size: Literal["auto"] | int = Field(
        "auto", description="Sequences per process per forward pass; auto lets the planner pick."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    save_every: int = Field(50, ge=1, description="Checkpoint every N optimizer steps (and at the end).")
    eval_samples: int = Field(200, ge=1, description="Held-out samples scored after the stage.")


class SFTConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest training sequence in tokens (longer rows are dropped).")


class RMConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest chosen/rejected sequence in tokens.")
    init_from: Literal["sft", "base"] = Field(
        "sft", description="Start the reward model from the SFT policy (when run) or the base model."
    )


class DPOConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest prompt+response sequence in tokens.")
    beta: float = Field(0.1, gt=0, description="DPO temperature: how far the policy may move from the reference.")
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust"] = Field(
        "sigmoid", description="Preference loss: sigmoid (DPO), ipo, hinge (SLiC), robust (noisy labels)."
    )


class RewardSpec(Section):
    name: str = Field(
        description="Built-in reward (see `rlctl rewards list`), `reward_model`, a plugin `path.py:function`, or an "
        "entry point of group `rlctl.rewards`; arguments in call form: `length_penalty(max_length=512)`."
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum.")


class RLConfig(TrainConfig):
    algorithm: str = Field("grpo", description="RL algorithm (an algorithm preset name; see `rlctl presets list`).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per optimizer step.")
    group_size: int = Field(8, ge=2, description="Completions sampled per prompt (the group).")
    max_new_tokens: int = Field(256, ge=1, description="Longest completion in tokens.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature during rollouts.")
    beta: float = Field(0.0, ge=0, description="KL coefficient against the reference (starting) policy.")
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip below 1 (epsilon).")
    clip_high: float = Field(0.2, gt=0, lt=10, description="PPO ratio clip above 1 (DAPO clip-higher: 0.28).")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field(
        "dapo", description="Loss aggregation: per-sequence mean (grpo), token-level (dapo, bnpo), constant (dr_grpo)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the reward std of the group, the batch, or not at all."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Importance ratio per token (PPO/GRPO) or per sequence (GSPO)."
    )
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="exact_match")], description="Reward functions and weights."
    )
    use_vllm: Literal["auto"] | bool = Field(
        "auto", description="Generate with vLLM colocated in sleep mode when installed (auto), or never/always."
    )


class HardwareConfig(Section):
    spec: str = Field(
        "auto", description="Hardware to plan for: auto (detect), cpu, or NxGPU-MEMGB / MxNxGPU-MEMGB presets."
    )
    num_processes: int | None = Field(
        None, ge=1, description="Training processes per node (default: one per GPU, one on CPU)."
    )
    strategy: Literal["auto", "single", "ddp", "fsdp2"] = Field(
        "auto", description="Distribution strategy; auto lets the planner pick."
    )


class CheckpointConfig(Section):
    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept per stage.")


class LoggingConfig(Section):
    every: int = Field(1, ge=1, description="Log metrics every N optimizer steps.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, description="Experiment trackers to report to, besides metrics.jsonl."
    )


class RunConfig(Section):
    name: str = Field("run", description="Run name, used for the default run directory.")
    description: str = Field("", description="What this run or preset is for.")
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    stages: list[StageName] = Field(
        default_factory=lambda: ["sft", "rm", "rl"],
        description="Stages to run; they always run in the order sft, dpo, rm, rl.",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model to train and how (full, LoRA, QLoRA)."
    )
    data: DataConfig = Field(
        default_factory=DataConfig, description="Datasets for each stage, or a generated built-in task."
    )
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Supervised fine-tuning stage.")
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="Offline preference optimisation stage (DPO).")
    rm: RMConfig = Field(default_factory=RMConfig, description="Reward-model stage (pairwise).")
    rl: RLConfig = Field(default_factory=RLConfig, description="Online RL stage: algorithm, sampling, rewards.")
    hardware: HardwareConfig = Field(default_factory=HardwareConfig, description="What to plan and launch for.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint retention.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics logging and trackers.")

    @field_validator("stages")
    @classmethod
    def _pipeline_order(cls, stages: list[str]) -> list[str]:
        """Stages always run in pipeline order (sft, dpo, rm, rl), each once."""
        if not stages:
            raise ValueError("stages: at least one stage is needed")
        if len(set(stages)) != len(stages):
            raise ValueError(f"stages: {stages} lists a stage twice")
        return [s for s in STAGE_ORDER if s in stages]

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        """Rules that span several keys."""
        uses_rm = any(r.name == "reward_model" for r in self.rl.rewards)
        if "rl" in self.stages and uses_rm and "rm" not in self.stages:
            raise ValueError(
                "rl.rewards: `reward_model` needs the rm stage in stages (e.g. sft,rm,rl), "
                "or drop it with --set 'rl.rewards=[{name: exact_match}]'"
            )
        return self


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the section that `loc` (a pydantic error location) points into."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner and getattr(ann, "__args__", None):  # list[Section]
            inner = [a for a in ann.__args__ if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return []
        model = inner[0]
    return list(model.model_fields)


def explain(error: ValidationError, source: str = "config") -> str:
    """One paragraph describing every problem in `error`, with did-you-mean hints for unknown keys."""
    parts = []
    for err in error.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'.{did_you_mean(str(loc[-1]), _field_names(RunConfig, loc))}")
        elif err["type"] == "value_error":
            parts.append(err["msg"].removeprefix("Value error, "))
        else:
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            parts.append(f"{key}: {err['msg']}{shown}")
    return f"Invalid {source}: " + "; ".join(parts) + "."


def parse_set(item: str) -> dict[str, Any]:
    """`a.b.c=value` as a nested mapping; the value is read as YAML (numbers, booleans, lists)."""
    if "=" not in item:
        raise UserError(f"--set expects key=value, got '{item}'.")
    key, raw = item.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise UserError(f"--set has an empty key in '{item}'.")
    try:
        value = yaml.safe_load(raw) if raw else ""
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
) -> dict[str, Any]:
    """The raw merged mapping, in override order, before validation."""
    data: dict[str, Any] = presets.load(preset) if preset else {}
    if config_file:
        data = presets.deep_merge(data, presets.resolve_layers(presets.read_yaml(Path(config_file))))
    if algorithm:
        data = presets.deep_merge(data, presets.load(algorithm, kind="algorithms"))
    if hardware:
        data = presets.deep_merge(data, hardware_layer(hardware))
    for item in sets:
        data = presets.deep_merge(data, parse_set(item))
    return data


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
) -> RunConfig:
    """Layer preset, file, flags and --set overrides into one validated RunConfig."""
    if not preset and not config_file:
        raise UserError("Nothing to run: pass --preset NAME or --config FILE (see `rlctl presets list`).")
    cfg = validate(layered(preset, config_file, algorithm, hardware, sets))
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


def load_run_config(path: Path) -> RunConfig:
    """The resolved config a run directory was started with; its data.columns become the column mapping that
    `rlctl.data.check` applies in this process (so every stage reads the run's data the same way)."""
    from rlctl import data

    cfg = validate(presets.read_yaml(path), source=str(path))
    data.set_default_columns(cfg.data.columns)
    return cfg
