"""The one config schema for a whole run, and how presets, files and flags are layered into it.

Override order: preset < --config FILE < --algorithm / --hardware < --set key=value.
Every key is documented by its `Field(description=...)`; unknown keys are rejected with a suggestion.

Package `rlctl.config`: the schema (this module) and the preset YAML layers (`presets`).
May import: base.
"""


from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlctl.config import presets
from rlctl.errors import UserError, did_you_mean

StageName = Literal["sft", "dpo", "kto", "rm", "rl"]
STAGE_ORDER: tuple[str, ...] = ("sft", "dpo", "kto", "rm", "rl")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


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
    max_prompt_length: int = Field(512, ge=1, description="Longest RL prompt in tokens.")
    over_length: Literal["drop", "refuse"] = Field(
        "drop",
        description="Rows longer than their limit (RL prompts: data.max_prompt_length; training sequences: the "
        "stage's max_length): drop them and count them (metrics.jsonl, summary.json), or refuse the run naming "
        "the first one. Never truncated.",
    )


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


class KTOConfig(TrainConfig):
    max_length: int = Field(1024, ge=8, description="Longest prompt+completion sequence in tokens.")
    beta: float = Field(0.1, gt=0, description="KTO temperature: how far the policy may move from the reference.")
    loss_type: Literal["kto", "apo_zero_unpaired"] = Field(
        "kto", description="Unpaired preference loss: kto (Ethayarajh et al. 2024) or apo_zero_unpaired."
    )
    desirable_weight: float = Field(1.0, gt=0, description="Weight of the losses on desirable (good) completions.")
    undesirable_weight: float = Field(1.0, gt=0, description="Weight of the losses on undesirable completions.")


class RewardSpec(Section):
    name: str = Field(
        description="Built-in reward (see `rlctl rewards list`), `reward_model`, a plugin `path.py:function`, or an "
        "entry point of group `rlctl.rewards`; arguments in call form: `length_penalty(max_length=512)`."
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    on_error: Literal["raise", "zero"] = Field(
        "raise",
        description="When the reward function raises during training: stop the stage with a message naming the "
        "reward and the sample (raise), or score that completion 0 and count it as `reward_errors` (zero).",
    )


# RL algorithm vocabulary, kept torch-free here; tests assert these equal the registries in rlctl.algorithms.
Advantage = Literal["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"]
PolicyLoss = Literal["ppo", "gspo", "cispo"]
KLEstimator = Literal["k1", "k2", "k3", "abs"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
PFPPOMode = Literal["pow", "max_min", "max_random"]
ADVANTAGE_NAMES: tuple[str, ...] = get_args(Advantage)
POLICY_LOSS_NAMES: tuple[str, ...] = get_args(PolicyLoss)
KL_NAMES: tuple[str, ...] = get_args(KLEstimator)
AGG_MODES: tuple[str, ...] = get_args(LossAgg)
PF_PPO_MODES: tuple[str, ...] = get_args(PFPPOMode)

# The one code path that runs each RL algorithm (`rl.algorithm`): TRL where it implements the algorithm
# faithfully, else rlctl's own loop (rlctl/stages/rl_loop.py). dpo and kto are offline stages, not rl.
RL_ALGORITHM_PATHS: dict[str, str] = {
    "grpo": "trl-grpo",
    "dr-grpo": "trl-grpo",
    "gspo": "trl-grpo",
    "cispo": "trl-grpo",
    "rloo": "trl-rloo",
    "ppo": "rlctl",
    "dapo": "rlctl",
    "reinforce-pp": "rlctl",
    "reinforce-pp-baseline": "rlctl",
    "remax": "rlctl",
    "pf-ppo": "rlctl",
}
OFFLINE_ALGORITHMS: tuple[str, ...] = ("dpo", "kto")
PATH_NAMES = {"trl-grpo": "TRL GRPOTrainer", "trl-rloo": "TRL RLOOTrainer", "rlctl": "the rlctl loop"}
# What each TRL trainer runs faithfully: key -> allowed values, the first being the nearest valid default.
_TRL_LIMITS: dict[str, dict[str, tuple[Any, ...]]] = {
    "trl-grpo": {
        "advantage": ("grpo", "dr_grpo"),
        "policy_loss": ("ppo", "gspo", "cispo"),
        "loss_agg": ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"),
        "kl_estimator": ("k3",),
        "kl_in_reward": (False,),
        "kl_target": (None,),
        "dual_clip": (None,),
        "critic_init": (None,),
        "dynamic_sampling": (False,),
        "pf_ppo_mode": (None,),
    },
    "trl-rloo": {
        "advantage": ("rloo",),
        "policy_loss": ("ppo",),
        "loss_agg": ("seq-mean-token-sum",),
        "kl_estimator": ("k1",),
        "kl_in_reward": (True,),
        "kl_target": (None,),
        "dual_clip": (None,),
        "critic_init": (None,),
        "dynamic_sampling": (False,),
        "pf_ppo_mode": (None,),
    },
}


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


class RLConfig(TrainConfig):
    """The RL stage. `algorithm` picks the code path; the keys below it are the algorithm's knobs, which every
    algorithm preset sets in full (see presets/algorithms/ and docs/algorithms.md). `max_steps` counts rollout
    batches: each makes ppo_epochs x ppo_mini_batches optimizer updates."""

    algorithm: str = Field("grpo", description="RL algorithm (an algorithm preset name; see `rlctl presets list`).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per step (rollout batch).")
    group_size: int = Field(8, ge=2, description="Completions sampled per prompt (the group).")
    max_new_tokens: int = Field(256, ge=1, description="Longest completion in tokens.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature during rollouts.")
    advantage: Advantage = Field(
        "grpo",
        description="Advantage estimator: gae (critic), grpo (group mean/std), dr_grpo (group mean), rloo "
        "(leave-one-out), reinforce_pp (returns, batch-whitened), reinforce_pp_baseline, remax (greedy baseline).",
    )
    policy_loss: PolicyLoss = Field(
        "ppo",
        description="Policy loss: ppo (clipped token ratio), gspo (clipped sequence ratio), cispo (clipped IS weight).",
    )
    loss_agg: LossAgg = Field(
        "seq-mean-token-mean",
        description="Loss aggregation: token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum (RLOO), "
        "seq-mean-token-sum-norm (Dr. GRPO: / batch x max_new_tokens).",
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="Ratio clipped below at 1 - clip_low (PPO epsilon).")
    clip_high: float = Field(
        0.2,
        gt=0,
        lt=10,
        description="Ratio clipped above at 1 + clip_high (DAPO clip-higher: 0.28); with policy_loss=cispo the "
        "absolute cap of the IS weight (5.0).",
    )
    dual_clip: float | None = Field(
        None, gt=1, description="Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (verl: 3.0)."
    )
    beta: float = Field(0.0, ge=0, description="KL coefficient against the reference (starting) policy; 0 = no KL.")
    kl_estimator: KLEstimator = Field(
        "k3", description="Per-token KL estimator: k1 (log-ratio), k2 (squared), k3 (low-variance), abs."
    )
    kl_in_reward: bool = Field(
        False,
        description="Subtract beta x KL from the token rewards (PPO-RLHF) instead of adding it to the loss (GRPO).",
    )
    kl_target: float | None = Field(
        None, gt=0, description="Adapt beta towards this KL per token (Ziegler et al. 2019); null = fixed beta."
    )
    kl_horizon: int = Field(10000, ge=1, description="Horizon of the adaptive KL controller (in sequences).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (gae, reinforce_pp).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda (gae).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch (GRPO's mu, TRL num_iterations).")
    ppo_mini_batches: int = Field(
        1, ge=1, description="Optimizer updates per pass: the rollout batch is split into this many mini-batches."
    )
    critic_init: Literal["policy", "reward_model"] | None = Field(
        None,
        description="Value model start for advantage=gae: the starting policy, or the reward model of the rm stage "
        "(with a fresh value head); null = no critic.",
    )
    critic_lr: float | None = Field(
        None, gt=0, lt=1, description="Critic learning rate; null = the same as learning_rate (verl: 10x the actor's)."
    )
    critic_warmup_steps: int = Field(0, ge=0, description="Steps that train only the critic before the policy moves.")
    value_clip: float = Field(0.2, gt=0, description="Value clipping range around the old values (PPO value loss).")
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal and sample more prompts to refill the batch."
    )
    dynamic_sampling_rounds: int = Field(
        10, ge=1, description="Most generation rounds per step when refilling (DAPO/verl max_num_gen_batches)."
    )
    overlong_buffer: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="DAPO soft overlong punishment: the last fraction of max_new_tokens where the reward ramps "
        "down to -overlong_penalty (paper: 4096 of 20480 = 0.2); 0 = off.",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at max_new_tokens of the overlong punishment.")
    mask_truncated: bool = Field(
        False, description="Leave completions that hit max_new_tokens out of the loss (DAPO overlong filtering)."
    )
    pf_ppo_mode: PFPPOMode | None = Field(
        None,
        description="PF-PPO policy filtration, resampling the batch by reward: pow, max_min, max_random; null = off.",
    )
    pf_ppo_weight_pow: float = Field(2.0, gt=0, description="Exponent of the pf_ppo_mode=pow weights |reward|^p.")
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="exact_match")], description="Reward functions and weights."
    )
    use_vllm: Literal["auto"] | bool = Field(
        "auto",
        description="Generate with vLLM colocated in sleep mode (auto: on GPUs; true: also with vLLM's CPU build), "
        "or never (false).",
    )
    sync_tolerance: float = Field(
        0.1,
        ge=0,
        description="vLLM only: the largest mean |log-prob difference| between the trainer and vLLM on the tokens "
        "vLLM just sampled before the run stops as a broken weight sync (checked every step); 0 = no check.",
    )
    rollout_correction: Literal["token_truncate", "sequence_mask", "off"] = Field(
        "token_truncate",
        description="vLLM only: importance weights for the rollout-training mismatch: token_truncate (TIS, "
        "min(ratio, cap) per token, verl), sequence_mask (drop sequences whose ratio leaves [1/cap, cap], TRL), off.",
    )
    rollout_correction_cap: float = Field(
        2.0, gt=1, description="Cap C of rollout_correction (verl's TIS: 2; TRL's sequence_mask: 3)."
    )

    @field_validator("advantage", "policy_loss", "loss_agg", "kl_estimator", "pf_ppo_mode", mode="before")
    @classmethod
    def _known_name(cls, value: Any, info) -> Any:
        """Registry names, with a did-you-mean for typos."""
        known = {
            "advantage": ADVANTAGE_NAMES,
            "policy_loss": POLICY_LOSS_NAMES,
            "loss_agg": AGG_MODES,
            "kl_estimator": KL_NAMES,
            "pf_ppo_mode": PF_PPO_MODES,
        }[info.field_name]
        if value is not None and value not in known:
            raise ValueError(
                f"rl.{info.field_name}: unknown name '{value}'.{did_you_mean(str(value), known)} "
                f"Valid: {', '.join(known)}"
            )
        return value

    @model_validator(mode="after")
    def _batch(self) -> "RLConfig":
        """rl.batch_size, when given, fixes the completions per step: prompts_per_step = batch_size / group_size."""
        g = self.group_size
        if "batch_size" in self.model_fields_set:
            if self.batch_size % g:
                low, high = self.batch_size - self.batch_size % g, self.batch_size - self.batch_size % g + g
                near = f"rl.batch_size={low} or {high}" if low else f"rl.batch_size={high}"
                raise ValueError(
                    f"rl.batch_size={self.batch_size} does not divide into groups of rl.group_size={g} completions "
                    f"per prompt; nearest valid: {near}"
                )
            if self.prompts_per_step != self.batch_size // g:
                object.__setattr__(self, "prompts_per_step", self.batch_size // g)
        elif self.batch_size != self.prompts_per_step * g:
            object.__setattr__(self, "batch_size", self.prompts_per_step * g)
        if self.batch_size % self.ppo_mini_batches:
            ok = [d for d in range(1, self.batch_size + 1) if self.batch_size % d == 0]
            gap = min(abs(d - self.ppo_mini_batches) for d in ok)
            near = " or ".join(str(d) for d in ok if abs(d - self.ppo_mini_batches) == gap)
            raise ValueError(
                f"rl.ppo_mini_batches={self.ppo_mini_batches} does not divide the {self.batch_size} completions "
                f"of a step; nearest valid: rl.ppo_mini_batches={near}"
            )
        return self

    @property
    def path(self) -> str | None:
        """The code path of `algorithm`: trl-grpo, trl-rloo or rlctl (None for an offline algorithm)."""
        return RL_ALGORITHM_PATHS.get(self.algorithm)

    def check(self, stages: list[str]) -> None:
        """Rules of the RL stage that span several keys; a ValueError naming the rule and the nearest valid setting."""
        if self.algorithm in OFFLINE_ALGORITHMS:
            raise ValueError(
                f"rl.algorithm={self.algorithm} is an offline preference algorithm that runs as the "
                f"{self.algorithm} stage, not in rl; use --algorithm {self.algorithm} (stages sft,{self.algorithm})"
            )
        if self.path is None:
            known = [*RL_ALGORITHM_PATHS, *OFFLINE_ALGORITHMS]
            raise ValueError(
                f"rl.algorithm '{self.algorithm}' is not a known algorithm.{did_you_mean(self.algorithm, known)} "
                f"Known: {', '.join(sorted(known))}"
            )
        limits = _TRL_LIMITS.get(self.path, {})
        for key, allowed in limits.items():
            value = getattr(self, key)
            if value not in allowed:
                loop = ", ".join(a for a, p in RL_ALGORITHM_PATHS.items() if p == "rlctl")
                raise ValueError(
                    f"rl.{key}={_yaml(value)}: algorithm {self.algorithm} runs through {PATH_NAMES[self.path]}, "
                    f"which supports rl.{key} in {{{', '.join(_yaml(a) for a in allowed)}}}; nearest valid: "
                    f"rl.{key}={_yaml(allowed[0])} (other combinations run in the rlctl loop: {loop})"
                )
        if self.path == "trl-grpo" and self.policy_loss == "cispo" and self.loss_agg != "token-mean":
            raise ValueError(
                f"rl.loss_agg={self.loss_agg}: TRL's cispo loss normalises over all tokens; nearest valid: "
                "rl.loss_agg=token-mean"
            )
        if self.policy_loss == "cispo" and self.clip_high <= 1:
            raise ValueError(
                f"rl.clip_high={self.clip_high}: with policy_loss=cispo it caps the importance weight itself, "
                "so it must be above 1; nearest valid: rl.clip_high=5.0 (MiniMax-M1 / TRL recommendation)"
            )
        if self.policy_loss != "cispo" and self.clip_high > 1:
            raise ValueError(
                f"rl.clip_high={self.clip_high}: the ratio is clipped to 1 + clip_high, which must stay within "
                f"(0, 1] for policy_loss={self.policy_loss}; nearest valid: rl.clip_high=1.0 (DAPO uses 0.28)"
            )
        if self.advantage == "gae" and self.critic_init is None:
            raise ValueError(
                "rl.advantage=gae needs a critic to estimate values, but rl.critic_init is null; nearest valid: "
                "rl.critic_init=policy (or reward_model with the rm stage)"
            )
        if self.advantage != "gae" and self.critic_init is not None:
            raise ValueError(
                f"rl.critic_init={self.critic_init}: only advantage=gae uses a critic (advantage is "
                f"{self.advantage}); nearest valid: rl.critic_init=null"
            )
        if self.critic_init == "reward_model" and "rm" not in stages:
            raise ValueError(
                "rl.critic_init=reward_model starts the critic from the rm stage's model, but rm is not in stages; "
                "nearest valid: rl.critic_init=policy, or add rm to stages (e.g. sft,rm,rl)"
            )
        if self.kl_target is not None and self.beta == 0:
            raise ValueError(
                f"rl.kl_target={self.kl_target} adapts beta, which is 0 (no KL); nearest valid: rl.kl_target=null, "
                "or set rl.beta > 0 as the starting coefficient"
            )
        if self.overlong_buffer and round(self.overlong_buffer * self.max_new_tokens) < 1:
            raise ValueError(
                f"rl.overlong_buffer={self.overlong_buffer} of rl.max_new_tokens={self.max_new_tokens} is under one "
                f"token; nearest valid: rl.overlong_buffer={min(0.99, 1 / self.max_new_tokens):.2g}, or 0 (off)"
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
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, description="Experiment trackers to report to, besides metrics.jsonl."
    )


class RunConfig(Section):
    name: str = Field("run", description="Run name, used for the default run directory.")
    description: str = Field("", description="What this run or preset is for.")
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    stages: list[StageName] = Field(
        default_factory=lambda: ["sft", "rm", "rl"],
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
        uses_rm = any(r.name == "reward_model" for r in self.rl.rewards)
        if "rl" in self.stages and uses_rm and "rm" not in self.stages:
            raise ValueError(
                "rl.rewards: `reward_model` needs the rm stage in stages (e.g. sft,rm,rl), "
                "or drop it with --set 'rl.rewards=[{name: exact_match}]'"
            )
        if "rl" in self.stages:
            self.rl.check(self.stages)
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
        value = yaml.load(raw, Loader=presets.YAML_LOADER) if raw else ""
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


# Keys `rlctl resume --set` may change: how a step is computed or kept, never what is computed (the checkpoints,
# the data order and the schedule stay valid).
RESUMABLE = (
    *(f"{stage}.micro_batch_size" for stage in STAGE_ORDER),
    "model.gradient_checkpointing",
    "checkpoint.keep_last",
    "checkpoint.keep_best",
    "logging.every",
    "logging.report_to",
    "rl.use_vllm",  # the generation engine holds no training state
    "rl.sync_tolerance",
)


def with_resume_overrides(cfg: RunConfig, sets: list[str] | tuple[str, ...]) -> RunConfig:
    """The run's config with `--set` overrides given to `rlctl resume`; only RESUMABLE keys may change."""
    for item in sets:
        key = item.split("=", 1)[0]
        if key not in RESUMABLE:
            raise UserError(
                f"--set {key} cannot change on resume: the run's checkpoints were made with it. Keys a resume may "
                f"change: {', '.join(RESUMABLE)}. Start a new run (rlctl train ... --set {item}) to change it."
            )
    data = cfg.model_dump(mode="json")
    for item in sets:
        data = presets.deep_merge(data, parse_set(item))
    return validate(data, source="rlctl resume --set")


def load_run_config(path: Path) -> RunConfig:
    """The resolved config a run directory was started with."""
    return validate(presets.read_yaml(path), source=str(path))
