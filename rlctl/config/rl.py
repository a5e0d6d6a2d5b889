"""The rl section of the config: the algorithm, its knobs and the rewards, which rlctl's own RL loop trains for
every algorithm (rlctl/trainer/loop.py), with the rules that span several keys checked. The keys set daily sit
under rl itself; those set rarely in its sections (loss, kl, critic, returns, filters, mismatch, agent,
async_rollout; their old flat names are read through `rlctl.config.aliases.MOVED`)."""

from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from rlctl.config.sections import MIN_LEARNING_RATE, Section, TrainConfig
from rlctl.errors import did_you_mean

REWARD_SCALE = 1000.0  # the largest |weight| of a reward (and overlong penalty): rewards are O(1), variances finite
MAX_STALENESS = 16  # rl.async_rollout.max_staleness: each round ahead holds a whole rollout batch


class RewardSpec(Section):
    name: str = Field(
        description="Built-in reward (see `rlctl rewards list`), `reward_model`, a plugin `path.py:function`, or an "
        "entry point of group `rlctl.rewards`; arguments in call form: `length_penalty(max_length=512)`."
    )
    weight: float = Field(
        1.0,
        ge=-REWARD_SCALE,
        le=REWARD_SCALE,
        description="Weight of this reward in the sum (-1000 to 1000; negative for a penalty).",
    )
    correctness: bool | None = Field(
        None,
        description="This reward says whether an answer is right (its score above 0.5), so held-out eval_accuracy, "
        "keep-best and `rlctl eval` use it; null: true for exact_match, gsm8k, boxed, verl and code_tests.",
    )
    on_error: Literal["raise", "zero"] = Field(
        "raise",
        description="When the reward function raises, returns NaN/inf or overruns `timeout_s` during training: "
        "stop the stage with a message naming the reward and the sample (raise), or score those completions 0 and "
        "count them as `reward_errors` (zero). A batch where every reward is NaN stops the stage either way.",
    )
    timeout_s: float = Field(
        120.0,
        ge=0,
        le=86400,
        description="Seconds one batch call of this reward may take (at most a day). The reward runs in a worker "
        "process that is stopped at the deadline (then `on_error` decides); halfway there the console warns that "
        "it is slow. 0 runs "
        "it inside the training process without a deadline (for a reward that cannot be sent to another process).",
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

# The RL algorithms (`rl.algorithm`, each an algorithm preset): rlctl's own loop (rlctl/trainer/loop.py) trains every
# one of them. dpo and kto are offline stages, not rl.
RL_ALGORITHMS: tuple[str, ...] = (
    "grpo", "dr-grpo", "gspo", "cispo", "rloo",
    "ppo", "dapo", "reinforce-pp", "reinforce-pp-baseline", "remax", "pf-ppo", "vapo",
)  # fmt: skip
# Advantage estimators that centre a sample's reward on its group's: they need at least two samples per prompt.
GROUP_ADVANTAGES: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
OFFLINE_ALGORITHMS: tuple[str, ...] = ("dpo", "kto")


class AsyncRollout(Section):
    """rl.async_rollout: generation overlapped with training (one-step-off and bounded staleness)."""

    enabled: bool = Field(
        False,
        description="Generate the next batches in a separate generator process (its own devices, or its own CPU "
        "threads; a vLLM engine of its own with rl.use_vllm) while the trainer updates on the current one; weights "
        "are pushed to it after every update. "
        "Runs in rlctl's loop for every algorithm; the plan shows the split (docs/algorithms.md, async RL).",
    )
    max_staleness: int = Field(
        1,
        ge=1,
        le=MAX_STALENESS,
        description="Most policy versions a batch may lag the trainer (K; TRL's max_staleness, NeMo-RL's N-step "
        "off-policy): the generator works at most K rounds ahead, so no sample is ever older (none is dropped). "
        "1 to 16, and at most rl.max_steps: each round ahead holds a whole rollout batch, and samples further "
        "off-policy than that are more than the importance weights can correct.",
    )
    generators: int | None = Field(
        None,
        ge=1,
        description="Generator engines over all nodes, each a process of its own with its share of every round's "
        "prompts and every weight push (default: on GPUs the plan's count, one per generator GPU or tensor-parallel "
        "group; on CPU one). On CPU each takes its share of the cores; on GPUs the generator gets this many engines' "
        "GPUs per node and the trainers the rest. A multiple of the node count.",
    )


def _registry_name(key: str, value: Any, known: tuple[str, ...]) -> Any:
    """`value` when it is a registry name in `known` (or null); else a ValueError for rl.`key` with a did-you-mean."""
    if value is not None and value not in known:
        raise ValueError(
            f"rl.{key}: unknown name '{value}'.{did_you_mean(str(value), known)} Valid: {', '.join(known)}"
        )
    return value


class Loss(Section):
    """rl.loss: the policy loss, how it is aggregated over tokens, and its ratio clipping."""

    policy: PolicyLoss = Field(
        "ppo",
        description="Policy loss: ppo (clipped token ratio), gspo (clipped sequence ratio), cispo (clipped IS weight).",
    )
    agg: LossAgg = Field(
        "seq-mean-token-mean",
        description="Loss aggregation: token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum (RLOO), "
        "seq-mean-token-sum-norm (Dr. GRPO: / batch x max_new_tokens).",
    )
    clip_low: float = Field(
        0.2, ge=1e-5, lt=1, description="Ratio clipped below at 1 - clip_low (PPO epsilon; GSPO's 3e-4 and up)."
    )
    clip_high: float = Field(
        0.2,
        ge=1e-5,
        lt=10,
        description="Ratio clipped above at 1 + clip_high (DAPO clip-higher: 0.28; ppo and gspo; at most 1).",
    )
    cispo_cap: float = Field(
        5.0,
        gt=1,
        le=100,
        description="policy=cispo: the absolute cap of the importance weight, min(ratio, cispo_cap) (MiniMax-M1's "
        "eps_max; TRL's epsilon_high under loss_type=cispo; 5.0 recommended).",
    )
    dual_clip: float | None = Field(
        None,
        gt=1,
        le=100,
        description="Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (verl: 3.0).",
    )
    lm_coef: float = Field(
        0.0,
        ge=0,
        le=100,
        description="VAPO's positive-example LM loss: weight mu of a next-token loss (token mean) on the completions "
        "the correctness reward of rl.rewards scored correct, added to the policy loss (VAPO: 0.1); 0 = off.",
    )

    @field_validator("policy", "agg", mode="before")
    @classmethod
    def _known_name(cls, value: Any, info) -> Any:
        """Registry names, with a did-you-mean for typos."""
        known = {"policy": POLICY_LOSS_NAMES, "agg": AGG_MODES}[info.field_name]
        return _registry_name(f"loss.{info.field_name}", value, known)


class KL(Section):
    """rl.kl: how the KL to the reference (starting) policy is estimated and applied; its coefficient is rl.beta."""

    estimator: KLEstimator = Field(
        "k3", description="Per-token KL estimator: k1 (log-ratio), k2 (squared), k3 (low-variance), abs."
    )
    in_reward: bool = Field(
        False,
        description="Subtract beta x KL from the token rewards (PPO-RLHF) instead of adding it to the loss (GRPO).",
    )
    target: float | None = Field(
        None,
        ge=1e-6,
        le=100,
        description="Adapt beta towards this KL per token (Ziegler et al. 2019); null = fixed beta.",
    )
    horizon: int = Field(10000, ge=1, description="Horizon of the adaptive KL controller (in sequences).")

    @field_validator("estimator", mode="before")
    @classmethod
    def _known_name(cls, value: Any) -> Any:
        """Registry names, with a did-you-mean for typos."""
        return _registry_name("kl.estimator", value, KL_NAMES)


class Critic(Section):
    """rl.critic: the value model of advantage=gae."""

    init: Literal["policy", "reward_model"] | None = Field(
        None,
        description="Value model start for advantage=gae: the starting policy, or the reward model of the rm stage "
        "(with a fresh value head); null = no critic.",
    )
    lr: float | None = Field(
        None,
        ge=MIN_LEARNING_RATE,
        lt=1,
        description="Critic learning rate; null = lr_ratio x learning_rate (verl: 10x the actor's).",
    )
    lr_ratio: float = Field(
        1.0,
        gt=0,
        le=100,
        description="With lr null: the critic's learning rate as this multiple of learning_rate (VAPO: 2, its 2e-6 "
        "for an actor's 1e-6; verl's PPO examples: 10); a critic.lr that is set wins.",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="The first steps of rl.max_steps train only the critic, on the returns of rl.returns (verl's "
        "critic_warmup); see pretrain_steps for VAPO's value pretraining.",
    )
    pretrain_steps: int = Field(
        0,
        ge=0,
        description="VAPO's value pretraining: steps before rl.max_steps (the stage runs both) that sample from the "
        "frozen starting policy and fit the critic to the Monte-Carlo returns; the policy, its optimizer and schedule "
        "do not move (VAPO: 50).",
    )
    value_clip: float = Field(
        0.2, ge=1e-3, description="Value clipping range around the old values (PPO value loss; at least 0.001)."
    )


class Returns(Section):
    """rl.returns: how per-token rewards become returns (advantage gae, reinforce_pp, reinforce_pp_baseline)."""

    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (gae, reinforce_pp).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda of the policy's advantages (gae).")
    critic_lam: float | None = Field(
        None,
        ge=0,
        le=1,
        description="VAPO's decoupled GAE: the lambda of the critic's targets (1.0: Monte-Carlo returns, unbiased); "
        "null = the policy's lambda (coupled, PPO).",
    )
    lam_alpha: float | None = Field(
        None,
        gt=0,
        le=100,
        description="VAPO's length-adaptive GAE: the policy's lambda per sample, 1 - 1/(alpha x its length in "
        "tokens), instead of lam (VAPO: 0.05); null = off.",
    )
    short_lam: float | None = Field(
        None,
        ge=0,
        le=1,
        description="With lam_alpha: the lambda of responses of at most 1/lam_alpha tokens, where the formula gives "
        "lambda <= 0 (docs/algorithms.md, VAPO); null = lam; 0 = TD(0), AReaL's and NeMo-RL's clamp.",
    )


class Filters(Section):
    """rl.filters: sample filters and reward shaping - DAPO dynamic sampling and overlong handling, PF-PPO."""

    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal and sample more prompts to refill the batch."
    )
    dynamic_sampling_rounds: int = Field(
        10, ge=1, le=1000, description="Most generation rounds per step when refilling (DAPO/verl max_num_gen_batches)."
    )
    overlong_buffer: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="DAPO soft overlong punishment: the last fraction of max_new_tokens where the reward ramps "
        "down to -overlong_penalty (paper: 4096 of 20480 = 0.2); 0 = off.",
    )
    overlong_penalty: float = Field(
        1.0, ge=0, le=REWARD_SCALE, description="Penalty at max_new_tokens of the overlong punishment."
    )
    mask_truncated: bool = Field(
        False, description="Leave completions that hit max_new_tokens out of the loss (DAPO overlong filtering)."
    )
    pf_ppo_mode: PFPPOMode | None = Field(
        None,
        description="PF-PPO policy filtration, resampling the batch by reward: pow, max_min, max_random; null = off.",
    )
    pf_ppo_weight_pow: float = Field(
        2.0, gt=0, le=10, description="Exponent of the pf_ppo_mode=pow weights |reward|^p (at most 10)."
    )

    @field_validator("pf_ppo_mode", mode="before")
    @classmethod
    def _known_name(cls, value: Any) -> Any:
        """Registry names, with a did-you-mean for typos."""
        return _registry_name("filters.pf_ppo_mode", value, PF_PPO_MODES)


class Mismatch(Section):
    """rl.mismatch: where the rollout engine (vLLM, the async generator) and the trainer disagree - the weight-sync
    check and the importance weights that correct the rest."""

    correction: Literal["token_truncate", "sequence_mask", "off"] = Field(
        "token_truncate",
        description="vLLM or async_rollout: importance weights for the rollout-training mismatch: token_truncate (TIS, "
        "min(ratio, cap) per token, verl), sequence_mask (drop sequences whose ratio leaves [1/cap, cap], TRL), off. "
        "Async rounds with loss.policy=ppo take the PPO ratio against the generator's log-probs instead (its clip "
        "bounds the weight; sequence_mask still masks; off: the ratio against the trainer's, as if on-policy).",
    )
    correction_cap: float = Field(
        2.0, gt=1, le=100, description="Cap C of correction (verl's TIS: 2; TRL's sequence_mask: 3)."
    )
    sync_tolerance: float = Field(
        0.1,
        ge=0,
        description="vLLM only: the largest mean |log-prob difference| between the trainer and vLLM on the tokens "
        "vLLM just sampled before the run stops as a broken weight sync (checked every step; with "
        "rl.async_rollout on a probe text after every push); 0 = no check.",
    )


class Agent(Section):
    """rl.agent: multi-turn rollouts with rl.tools (see docs/agents.md)."""

    max_turns: int = Field(
        4, ge=1, description="With rl.tools: most model turns per rollout (a tool call and its result between two)."
    )
    max_tool_output_tokens: int = Field(
        256, ge=1, description="With rl.tools: a tool's output is cut to this many tokens before the model reads it."
    )


class RLConfig(TrainConfig):
    """The RL stage, trained by rlctl's loop. `algorithm` names the algorithm preset; `advantage`, `beta` and the
    sections below them (loss, kl, critic, returns, filters) are its knobs, which every algorithm preset sets in
    full (see presets/algorithms/ and docs/algorithms.md). `max_steps` counts rollout batches: each makes
    ppo_epochs x ppo_mini_batches optimizer updates."""

    algorithm: str = Field("grpo", description="RL algorithm (an algorithm preset name; see `rlctl presets list`).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per step (rollout batch).")
    group_size: int = Field(
        8,
        ge=1,
        description="Completions sampled per prompt (the group; VAPO's group sampling). 1 only with a critic "
        "(advantage gae): group-relative advantages need at least 2.",
    )
    max_new_tokens: int = Field(256, ge=1, description="Longest completion in tokens.")
    temperature: float = Field(
        1.0,
        ge=0.01,
        le=10,
        description="Sampling temperature during rollouts (0.01 to 10: colder divides the logits past what "
        "sampling can take, hotter samples noise).",
    )
    advantage: Advantage = Field(
        "grpo",
        description="Advantage estimator: gae (critic), grpo (group mean/std), dr_grpo (group mean), rloo "
        "(leave-one-out), reinforce_pp (returns, batch-whitened), reinforce_pp_baseline, remax (greedy baseline).",
    )
    beta: float = Field(
        0.0, ge=0, le=10, description="KL coefficient against the reference (starting) policy; 0 = no KL (at most 10)."
    )
    ppo_epochs: int = Field(
        1, ge=1, le=100, description="Passes over each rollout batch (GRPO's mu, TRL num_iterations)."
    )
    ppo_mini_batches: int = Field(
        1, ge=1, description="Optimizer updates per pass: the rollout batch is split into this many mini-batches."
    )
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="exact_match")], description="Reward functions and weights."
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Tools the policy may call in multi-turn rollouts (see docs/agents.md and "
        "rl.agent): built-in `calculator` (exact arithmetic) and `python` (sandboxed), a plugin "
        "`path/to/file.py:function` (its signature and docstring describe it to the model), or an entry point of "
        "group `rlctl.tools`; empty = single-turn.",
    )
    allow_unconfined_code: bool = Field(
        False,
        description="Run model-written code (the code_tests reward, the python tool) even where no kernel sandbox "
        "(bubblewrap) works, with rlimits and a wall time only: no filesystem, network, process or environment "
        "isolation. Off: such runs are refused before launch (docs/rewards.md, code_tests).",
    )
    use_vllm: Literal["auto"] | bool = Field(
        "auto",
        description="Generate with vLLM colocated in sleep mode (auto: on GPUs; true: also with vLLM's CPU build), "
        "or never (false).",
    )
    loss: Loss = Field(default_factory=Loss, description="The policy loss: its kind, aggregation and clipping.")
    kl: KL = Field(default_factory=KL, description="The KL estimator and controller (the coefficient is rl.beta).")
    critic: Critic = Field(default_factory=Critic, description="The value model (advantage=gae).")
    returns: Returns = Field(default_factory=Returns, description="Discount and GAE lambda of the returns.")
    filters: Filters = Field(default_factory=Filters, description="Sample filters and reward shaping (DAPO, PF-PPO).")
    mismatch: Mismatch = Field(
        default_factory=Mismatch, description="The weight-sync check and rollout-training mismatch correction."
    )
    agent: Agent = Field(default_factory=Agent, description="Multi-turn rollouts with rl.tools.")
    async_rollout: AsyncRollout = Field(
        default_factory=AsyncRollout, description="Asynchronous RL: generation overlapped with training."
    )

    @field_validator("advantage", mode="before")
    @classmethod
    def _known_name(cls, value: Any) -> Any:
        """Registry names, with a did-you-mean for typos."""
        return _registry_name("advantage", value, ADVANTAGE_NAMES)

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
    def critic_learning_rate(self) -> float:
        """The critic's peak learning rate: critic.lr, or critic.lr_ratio x learning_rate."""
        return self.critic.lr or self.learning_rate * self.critic.lr_ratio

    @property
    def total_steps(self) -> int:
        """Rollout batches the stage runs: the critic's value pretraining (critic.pretrain_steps), then max_steps."""
        return self.critic.pretrain_steps + self.max_steps

    def check(self, stages: Sequence[str]) -> None:
        """Rules of the RL stage that span several keys; a ValueError naming the rule and the nearest valid setting."""
        if self.algorithm in OFFLINE_ALGORITHMS:
            raise ValueError(
                f"rl.algorithm={self.algorithm} is an offline preference algorithm that runs as the "
                f"{self.algorithm} stage, not in rl; use --algorithm {self.algorithm} (stages sft,{self.algorithm})"
            )
        if self.algorithm not in RL_ALGORITHMS:
            known = [*RL_ALGORITHMS, *OFFLINE_ALGORITHMS]
            raise ValueError(
                f"rl.algorithm '{self.algorithm}' is not a known algorithm.{did_you_mean(self.algorithm, known)} "
                f"Known: {', '.join(sorted(known))}"
            )
        loss, critic, kl = self.loss, self.critic, self.kl
        if loss.clip_high > 1 and loss.policy == "cispo":
            raise ValueError(
                f"rl.loss.clip_high={loss.clip_high}: clip_high is the ratio clip of ppo and gspo (within (0, 1]); "
                f"cispo's importance-weight cap moved from it to rl.loss.cispo_cap; nearest valid: "
                f"rl.loss.cispo_cap={loss.clip_high} with rl.loss.clip_high=0.2"
            )
        if loss.clip_high > 1:
            raise ValueError(
                f"rl.loss.clip_high={loss.clip_high}: the ratio is clipped to 1 + clip_high, which must stay within "
                f"(0, 1] for rl.loss.policy={loss.policy}; nearest valid: rl.loss.clip_high=1.0 (DAPO uses 0.28)"
            )
        if self.advantage == "gae" and critic.init is None:
            raise ValueError(
                "rl.advantage=gae needs a critic to estimate values, but rl.critic.init is null; nearest valid: "
                "rl.critic.init=policy (or reward_model with the rm stage)"
            )
        if self.advantage != "gae" and critic.init is not None:
            raise ValueError(
                f"rl.critic.init={critic.init}: only advantage=gae uses a critic (advantage is "
                f"{self.advantage}); nearest valid: rl.critic.init=null"
            )
        if self.group_size == 1 and (self.advantage in GROUP_ADVANTAGES or self.filters.dynamic_sampling):
            why = f"advantage={self.advantage}" if self.advantage in GROUP_ADVANTAGES else "filters.dynamic_sampling"
            raise ValueError(
                f"rl.group_size=1: {why} compares each completion with the others of its prompt, and a group of one "
                "has none; nearest valid: rl.group_size=2 (one sample per prompt works with advantage=gae only)"
            )
        if critic.pretrain_steps and critic.init is None:
            raise ValueError(
                f"rl.critic.pretrain_steps={critic.pretrain_steps} fits a critic before the policy moves, but there is "
                "none (rl.critic.init is null); nearest valid: rl.critic.pretrain_steps=0, or advantage=gae with "
                "rl.critic.init=policy"
            )
        shaping = {k: getattr(self.returns, k) for k in ("critic_lam", "lam_alpha", "short_lam")}
        if self.advantage != "gae" and any(v is not None for v in shaping.values()):
            key = next(k for k, v in shaping.items() if v is not None)
            raise ValueError(
                f"rl.returns.{key} shapes GAE, but advantage is {self.advantage}; nearest valid: "
                f"rl.returns.{key}=null, or advantage=gae with a critic"
            )
        if self.returns.short_lam is not None and self.returns.lam_alpha is None:
            raise ValueError(
                f"rl.returns.short_lam={self.returns.short_lam} is the lambda of responses too short for "
                "length-adaptive GAE, which is off (rl.returns.lam_alpha is null); nearest valid: "
                "rl.returns.short_lam=null, or rl.returns.lam_alpha=0.05"
            )
        if critic.init is not None and self.critic_learning_rate >= 1:
            raise ValueError(
                f"rl.critic.lr_ratio={critic.lr_ratio} x rl.learning_rate={self.learning_rate} gives the critic a "
                "learning rate of 1 or more; nearest valid: rl.critic.lr_ratio="
                f"{0.99 / self.learning_rate:.3g}, or set rl.critic.lr"
            )
        if critic.init == "reward_model" and "rm" not in stages:
            raise ValueError(
                "rl.critic.init=reward_model starts the critic from the rm stage's model, but rm is not in stages; "
                "nearest valid: rl.critic.init=policy, or add rm to stages (e.g. sft,rm,rl)"
            )
        if kl.target is not None and self.beta == 0:
            raise ValueError(
                f"rl.kl.target={kl.target} adapts beta, which is 0 (no KL); nearest valid: rl.kl.target=null, "
                "or set rl.beta > 0 as the starting coefficient"
            )
        staleness = self.async_rollout.max_staleness
        if self.async_rollout.enabled and self.epochs is None and staleness > self.max_steps:
            raise ValueError(
                f"rl.async_rollout.max_staleness={staleness} is above rl.max_steps={self.max_steps}: the generator "
                "can never be more rounds ahead than the run has steps; nearest valid: "
                f"rl.async_rollout.max_staleness={self.max_steps}"
            )
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"rl.tools lists a tool twice: {', '.join(self.tools)}")
        buffer = self.filters.overlong_buffer
        if buffer and round(buffer * self.max_new_tokens) < 1:
            raise ValueError(
                f"rl.filters.overlong_buffer={buffer} of rl.max_new_tokens={self.max_new_tokens} is under one token; "
                f"nearest valid: rl.filters.overlong_buffer={min(0.99, 1 / self.max_new_tokens):.2g}, or 0 (off)"
            )
