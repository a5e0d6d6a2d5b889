"""The config sections every run has: model, data, the offline stages (sft, rm, dpo, kto), hardware,
checkpoint and logging. The rl section lives in `rlctl.config.rl`; the whole run (`RunConfig`) and the layering in
`rlctl.config`."""

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlctl import vision

StageName = Literal["sft", "dpo", "kto", "rm", "rl"]
STAGE_ORDER: tuple[str, ...] = ("sft", "dpo", "kto", "rm", "rl")
MAX_WHOLE_NUMBER = 2**31 - 1  # the largest count any key takes (steps, tokens, sizes): what torch and C ints hold
MIN_LEARNING_RATE = 1e-9  # a smaller step moves no float32 weight (its relative precision is 1e-7)


def _numbers_only(annotation: Any) -> bool:
    """Whether a field of this type takes numbers but not booleans (`int`, `float | None`, `Literal["auto"] | int`)."""
    kinds = get_args(annotation) or (annotation,)
    return bool(set(kinds) & {int, float}) and bool not in kinds


def _capped(field: Any) -> bool:
    """Whether a key takes whole numbers (not floats) and has no upper bound of its own: MAX_WHOLE_NUMBER bounds it."""
    kinds = get_args(field.annotation) or (field.annotation,)
    own = any(hasattr(m, "le") or hasattr(m, "lt") for m in field.metadata)
    return int in kinds and float not in kinds and not own


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are re-validated on assignment, float keys
    refuse NaN and inf, number keys refuse booleans (YAML's `true` is not the number 1), and whole numbers stay at
    most MAX_WHOLE_NUMBER (a larger count overflows the libraries' integers long after launch)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _numbers_only(field.annotation):
            return value
        if isinstance(value, bool):
            raise PydanticCustomError("bool_not_number", "a number is needed, not a boolean")
        if _capped(field) and isinstance(value, int | float) and value > MAX_WHOLE_NUMBER:
            raise PydanticCustomError(
                "too_large", f"a count this large is meaningless here (at most {MAX_WHOLE_NUMBER:,})"
            )
        return value


# the random-init models rlctl builds into the run directory at launch (rlctl.stages.tiny): text, and vision-language
BUILTIN_MODELS = ("builtin:tiny", "builtin:tiny-vlm", "builtin:tiny-gemma3")


class VisionArch(Section):
    """The vision tower of a vision-language model, of the kind its family has (`rlctl.vision`). Each kind reads the
    numbers it needs: a tower of merged patches (`merge`, `temporal_patch`) cuts images at their own resolution into
    `patch` x `patch` pixel patches encoded by `layers` transformer blocks, each `merge` x `merge` square of patches
    one image token of the language model; a fixed-size tower (`image_size`, `tokens_per_image`) resizes every image
    to `image_size` x `image_size` pixels, encodes its patches and pools them into `tokens_per_image` image tokens."""

    kind: Literal[vision.KINDS] = Field(  # type: ignore[valid-type]  # the families' kinds
        vision.KINDS[0],
        description="The tower's design: " + vision.kinds_described() + ".",
    )
    layers: int = Field(ge=1, description="Vision transformer blocks (vision_config.depth / num_hidden_layers).")
    hidden: int = Field(ge=1, description="Vision hidden size (vision_config.embed_dim / hidden_size).")
    heads: int = Field(ge=1, description="Vision attention heads.")
    intermediate: int = Field(ge=1, description="Vision MLP intermediate size.")
    patch: int = Field(14, ge=1, description="Patch side in pixels (vision_config.patch_size).")
    merge: int = Field(
        2,
        ge=1,
        description="A tower of merged patches: patches merged per image token along each side (spatial_merge_size).",
    )
    temporal_patch: int = Field(
        2, ge=1, description="A tower of merged patches: frames per patch (temporal_patch_size; an image is repeated)."
    )
    image_size: int | None = Field(
        None,
        ge=1,
        description="A fixed-size tower: the side in pixels every image is resized to (vision_config.image_size).",
    )
    tokens_per_image: int | None = Field(
        None, ge=1, description="A fixed-size tower: image tokens per image after pooling (mm_tokens_per_image)."
    )

    @model_validator(mode="after")
    def _family_tower(self) -> "VisionArch":
        """The tower as its family needs it (a fixed-size tower: its image size and tokens per image, the patches
        pooling evenly into the tokens)."""
        problem = vision.of_tower(self).tower_problem(self)
        if problem is not None:
            raise PydanticCustomError(self.kind, problem)
        return self


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
    head_dim: int | None = Field(None, ge=1, description="Attention head size when not hidden / heads (Qwen3, Gemma).")
    vision: VisionArch | None = Field(
        None, description="The vision tower of a vision-language model (None: a text-only model)."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelArch":
        """Grouped-query attention shares key/value heads evenly (else the first forward pass fails, after launch)."""
        if self.heads % self.kv_heads:
            raise PydanticCustomError(
                "heads",
                "heads ({heads}) must be a multiple of kv_heads ({kv})",
                {"heads": self.heads, "kv": self.kv_heads},
            )
        return self


class ModelConfig(Section):
    name_or_path: str = Field(
        "builtin:tiny",
        description="Hugging Face model id, local folder, a `.gguf` file (converted once to a cached Hugging Face "
        "folder before launch), `pkg:PACKAGE/FILE.gguf` (a GGUF file inside an installed Python package), or "
        "`builtin:tiny` (a random-init model built offline).",
    )
    gguf_file: str | None = Field(
        None,
        description="With model.name_or_path a folder: the GGUF file in it to train (as transformers' gguf_file).",
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
    train_embeddings: Literal["auto"] | bool = Field(
        "auto",
        description="With LoRA/QLoRA, also train the token embeddings (and the output head, tied or not); auto = on "
        "for builtin:tiny, whose random embeddings would cap what adapters learn, off for pretrained models (turn it "
        "on when the data brings new tokens).",
    )
    lora_vision: bool = Field(
        False,
        description="Vision-language models with LoRA/QLoRA: put adapters on the vision tower too (off: LoRA targets "
        "the language model and the vision tower stays frozen).",
    )
    freeze_vision: bool = Field(
        False,
        description="Vision-language models in full fine-tuning: keep the vision tower frozen, as verl's "
        "freeze_vision_tower (its weights get no gradients or optimizer states, 12 bytes per tower parameter saved, "
        "and its activations are one block's at a time); the language model trains. LoRA/QLoRA keep it frozen "
        "anyway unless model.lora_vision.",
    )
    trust_remote_code: bool = Field(False, description="Run model code from the Hub. Off unless you set it.")
    gradient_checkpointing: Literal["auto"] | bool = Field(
        "auto", description="Recompute activations in the backward pass; auto lets the planner pick."
    )

    @model_validator(mode="after")
    def _vision_frozen_or_adapted(self) -> "ModelConfig":
        """The vision tower cannot be both kept frozen and given adapters."""
        if self.freeze_vision and self.lora_vision:
            raise PydanticCustomError(
                "freeze_vision",
                "model.freeze_vision and model.lora_vision contradict each other (the first keeps the vision tower "
                "frozen, the second trains adapters on it); set one of them",
            )
        return self


class DataConfig(Section):
    """Datasets: a local file (jsonl, json, parquet, csv), a folder written by datasets' `save_to_disk`
    (`folder@split` for a DatasetDict), or a Hub dataset (`owner/name[:config][@split]`, or `hf://...`).
    Formats are recognised from the columns; see docs/datasets.md."""

    generate: Literal["arithmetic", "products", "chat-sums", "shapes"] | None = Field(
        None,
        description="Generate a built-in synthetic task into the run directory instead of reading files: "
        "arithmetic (tiny-demo), products (tiny-agent-demo, solved with the calculator tool) or chat-sums "
        "(chat prompts 'What is A + B? Reply with only the number.' for an instruct model; smollm2-grpo-cpu) or "
        "shapes (tiny-vlm-demo: 'What colour is the shape?' about small drawn PNG images, for a vision-language "
        "model). Data "
        "files set in a layer above (your config, --set) replace it; both in one layer are refused.",
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
    max_prompt_length: int = Field(512, ge=1, description="Longest RL prompt in tokens.")
    max_drop_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="With over_length=drop: the largest share of a stage's rows that may be dropped as too long; "
        "more refuses the run before it starts, naming the length that would keep 95% of them.",
    )
    encoding: str = Field(
        "utf-8",
        description="Text encoding of local jsonl/json/csv/tsv files (a Python codec name: utf-8, cp1252, latin-1, "
        "utf-16, ...). UTF-8 files with a byte-order mark and UTF-16/32 files with one are read under utf-8.",
    )
    chat_template: str | None = Field(
        None,
        description="Chat template for conversational data (message lists): `chatml` (Qwen2.5's tool format), "
        "`chatml-compact` (tools listed by name) or a Jinja file; replaces the tokenizer's own (and a vision-language "
        "processor's). Needed when the tokenizer has none (GPT-2 and other base models), or for rl.tools when its "
        "template lists no tools (some vision-language models' own); the built-ins render image parts as the "
        "model's family does (its image placeholder, rlctl.vision).",
    )
    min_pixels: int | None = Field(
        None,
        ge=1,
        description="Vision-language models: images smaller than this many pixels are scaled up to it (the "
        "processor's min_pixels); None keeps the processor's own, which the plan reads from the model's "
        "preprocessor_config.json.",
    )
    max_pixels: int | None = Field(
        None,
        ge=1,
        description="Vision-language models: images larger than this many pixels are scaled down to it (the "
        "processor's max_pixels, which bounds the image tokens per image); None keeps the processor's own, which the "
        "plan reads from the model's preprocessor_config.json.",
    )
    over_length: Literal["drop", "refuse"] = Field(
        "drop",
        description="Rows longer than their limit (RL prompts: data.max_prompt_length; training sequences: the "
        "stage's max_length): drop them and count them (metrics.jsonl, summary.json), or refuse the run naming "
        "the first one. Never truncated.",
    )

    @model_validator(mode="after")
    def _pixel_bounds(self) -> "DataConfig":
        """An image is resized into [min_pixels, max_pixels]: the range cannot be empty."""
        low, high = self.min_pixels, self.max_pixels
        if low is not None and high is not None and low > high:
            raise PydanticCustomError(
                "pixel_bounds",
                "data.min_pixels={low} is above data.max_pixels={high}: the processor resizes every image into "
                "[min_pixels, max_pixels], which is then empty; lower data.min_pixels or raise data.max_pixels",
                {"low": low, "high": high},
            )
        return self


class TrainConfig(Section):
    """Optimisation settings shared by every stage."""

    columns: dict[str, str] = Field(
        default_factory=dict,
        description="This stage's column mapping, on top of data.columns (same form; its keys win): one file "
        "can feed several stages, e.g. sft.columns: {completion: answer} next to data.columns: {prompt: question}. "
        "rl.columns also applies to data.eval.",
    )
    max_steps: int = Field(100, ge=1, description="Optimizer steps in this stage.")
    epochs: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Passes over the stage's training rows instead of max_steps: a layer (a config file, the --set "
        "items together) sets one or the other, a later layer's replaces an earlier one's. The plan counts the rows "
        "and sets max_steps = ceil(epochs x rows / batch_size); rm, dpo, kto: the preference rows less the held-out "
        "tenth; rl: the prompts, prompts_per_step per step. Needs data the plan can count (a local file or "
        "data.generate). TRL's num_train_epochs.",
    )
    learning_rate: float = Field(
        1e-5,
        ge=MIN_LEARNING_RATE,
        lt=1,
        description="Peak learning rate (at least 1e-9: a smaller step moves no float32 weight).",
    )
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "cosine", description="Learning-rate schedule."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = Field(
        0.0, ge=0, le=1, description="AdamW weight decay (at most 1: each step shrinks weights by lr x decay)."
    )
    batch_size: int = Field(32, ge=1, description="Global batch (sequences per optimizer step, all processes).")
    micro_batch_size: Literal["auto"] | int = Field(
        "auto", description="Sequences per process per forward pass (at least 1); auto lets the planner pick."
    )
    max_grad_norm: float = Field(
        1.0,
        ge=1e-3,
        description="Gradient clipping norm (at least 0.001: a smaller one scales the gradients to nothing).",
    )
    save_every: int = Field(50, ge=1, description="Checkpoint every N optimizer steps (and at the end).")
    eval_samples: int = Field(200, ge=1, description="Held-out samples scored after the stage.")

    @field_validator("micro_batch_size")
    @classmethod
    def _a_micro_batch_holds_a_sequence(cls, value: Any) -> Any:
        """A number of sequences per forward pass is at least one."""
        if isinstance(value, int) and value < 1:
            raise PydanticCustomError("greater_than_equal", "Input should be at least 1 (or auto)")
        return value


class SFTConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest training sequence in tokens (longer rows are dropped).")


class RMConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest chosen/rejected sequence in tokens.")
    init_from: Literal["sft", "base"] = Field(
        "sft", description="Start the reward model from the SFT policy (when run) or the base model."
    )


class DPOConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest prompt+response sequence in tokens.")
    beta: float = Field(
        0.1,
        ge=1e-3,
        le=100,
        description="DPO temperature: how far the policy may move from the reference (0.001 to 100; TRL's "
        "default 0.1).",
    )
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust"] = Field(
        "sigmoid", description="Preference loss: sigmoid (DPO), ipo, hinge (SLiC), robust (noisy labels)."
    )


class KTOConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest prompt+completion sequence in tokens.")
    beta: float = Field(
        0.1,
        ge=1e-3,
        le=100,
        description="KTO temperature: how far the policy may move from the reference (0.001 to 100; TRL's "
        "default 0.1).",
    )
    loss_type: Literal["kto", "apo_zero_unpaired"] = Field(
        "kto", description="Unpaired preference loss: kto (Ethayarajh et al. 2024) or apo_zero_unpaired."
    )
    desirable_weight: float = Field(
        1.0, ge=0.01, le=100, description="Weight of the losses on desirable (good) completions (0.01 to 100)."
    )
    undesirable_weight: float = Field(
        1.0, ge=0.01, le=100, description="Weight of the losses on undesirable completions (0.01 to 100)."
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
    optimizer_offload: Literal["auto"] | bool = Field(
        "auto",
        description="RL: keep the policy's AdamW state in host RAM outside its optimizer step (moved to the GPU and "
        "back around each step); auto lets the planner decide. On CPU it is a no-op (the state lives there).",
    )
    nodes: int | None = Field(
        None, ge=1, description="Machines the run spans (default: the M of an MxNxGPU spec, else 1); see --nodes."
    )
    node_rank: int = Field(
        0, ge=0, description="This machine's rank among the nodes, 0 to nodes-1; given per node (--node-rank)."
    )
    main_address: str | None = Field(
        None, description="Host name or IP of the rank-0 node, which every node reaches (needed when nodes > 1)."
    )
    main_port: int = Field(29500, ge=1, le=65535, description="TCP port of the rendezvous on the rank-0 node.")
    max_restarts: int = Field(
        0,
        ge=0,
        description="Elastic restarts (several processes or nodes): how many times torchrun's elastic agent on each "
        "node restarts its training processes after one failed or a node was lost, every process resuming from the "
        "stage's last complete checkpoint (summary.json `restarts` records each). Above 0 the nodes meet through "
        "torch's c10d rendezvous instead of the static one, and a lost node must come back (a scheduler restarts it) "
        "within hardware.rendezvous_timeout_s; 0: a failure ends the run (`rlctl resume` continues it).",
    )
    rendezvous_timeout_s: int = Field(
        600,
        ge=10,
        description="With hardware.max_restarts > 0: how long the nodes wait for each other at a start or restart "
        "(c10d join timeout); fewer nodes than the plan's by then ends the run, exit 1, resumable with rlctl resume.",
    )


class CheckpointConfig(Section):
    """Checkpoints are written under `checkpoints/.incoming` and renamed into `checkpoints/` once complete."""

    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept per stage (the most recent ones).")
    keep_best: bool = Field(
        True,
        description="Also keep the checkpoint with the best held-out eval_accuracy, scored at every save (policies "
        "on data.eval, reward models on their held-out pairs); recorded in summary.json.",
    )


class LoggingConfig(Section):
    every: int = Field(1, ge=1, description="Log metrics every N optimizer steps.")
    console_every_s: float = Field(
        30.0,
        gt=0,
        description="When the console is not a terminal (a log file, SLURM, CI), `rlctl train` prints one line per "
        "logged step (step/total, main metrics, ETA; see logging.every); this key only spaces the lines of a "
        "held-out scoring under way (rows scored, ETA): at most one per stage every this many seconds.",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "trackio"]] = Field(
        default_factory=list,
        description="Experiment trackers that get every metrics.jsonl record (each stage's steps, held-out "
        "evaluations, memory, alarms) from the main process; `rlctl train` writes TensorBoard files in "
        "RUN_DIR/tensorboard whatever this says (no package needed). mlflow uses MLFLOW_TRACKING_URI, else "
        "sqlite:///RUN_DIR/mlflow.db; wandb writes under RUN_DIR (WANDB_MODE=offline works); trackio uses its local "
        "store. A tracker that fails at runtime is warned about once and dropped. See docs/trackers.md.",
    )
    alarms: Literal["warn", "stop"] = Field(
        "warn",
        description="Alarms for a run that learns nothing (zero gradients, identical rewards in every group, every "
        "completion truncated, every token clipped, reward flat at its minimum, a resume that trains 0 steps): "
        "printed and logged with the likely cause and fix (warn), or also stop the stage (stop, for unattended runs).",
    )
    alarm_steps: int = Field(
        10, ge=1, description="Consecutive logged steps a no-learning condition must last before its alarm fires."
    )
