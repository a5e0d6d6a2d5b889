"""The RL stage: the policy starts from the SFT output (or the base model) and is scored by rule-based rewards,
user plugins and, optionally, the reward model trained in the rm stage. The stage builds, from the narrow values
of its context (`rlctl.stages.context`: the model source, the stage's data, the rewards, the monitors), what
rlctl's own loop (`rlctl.trainer.loop`) trains every RL algorithm with: its parts, ready to train (`parts`: seeded
accelerator, tokenizer, rows, policy / reference / critic with their optimizers, scorer, generation engine, agent,
the async generator engines' setup, a vision-language policy's processor), its settings (the rl section and the
plan fields it reads) and its hooks (`hooks`: the metrics log, the stop flag and the errors that end the stage,
and its monitors: memory probe, held-out scoring and publication of each checkpoint, layout check); it saves the
policy the loop hands back to the stage's final folder.

A vision-language policy (a family of `rlctl.vision`) trains with every algorithm; its critic (PPO) is its own
backbone, vision tower included, with a value head (`rlctl.trainer.models.VisionValueModel`); its prompts keep their
images on every turn of a tool rollout and in the async generator process. What its family cannot do (vLLM
generation, a critic from the rm stage) is refused before anything loads (`refuse_for_images`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlctl.errors import UserError
from rlctl.rollout import generate, multiturn
from rlctl.rollout.async_engine import AsyncGenerators, GeneratorSetup
from rlctl.rundir import RunDir
from rlctl.runtime import models
from rlctl.runtime.rewarding import Scorer
from rlctl.stages.common import kept_rows, save_final
from rlctl.stages.context import StageContext
from rlctl.trainer import sharding
from rlctl.trainer.models import VisionValueModel, no_dropout, optimizer_and_schedule
from rlctl.trainer.state import Hooks, Parts, Settings
from rlctl.vision.family import Family

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from rlctl.config.rl import RLConfig
    from rlctl.plan import Plan


def run(ctx: StageContext) -> None:
    from rlctl.trainer import loop

    built, read, around = parts(ctx), settings(ctx), hooks(ctx)
    save_final(ctx, loop.train(built, read, around))


def settings(ctx: StageContext) -> Settings:
    """The rl section and the plan fields the loop reads."""
    plan, split = ctx.plan, ctx.plan.async_split
    threads = split.trainer_threads if split is not None and plan.hardware.is_cpu else None
    return Settings(ctx.cfg.rl, ctx.cfg.seed, ctx.stage.micro_batch_size, plan.phase_offload, threads)


def hooks(ctx: StageContext) -> Hooks:
    """The stage as the loop reaches it."""
    return Hooks(log=ctx.log, stop=ctx.stop, stops=ctx.stops, is_main=ctx.is_main, monitors=ctx.monitors())


def parts(ctx: StageContext) -> Parts:
    """Models, optimizers and the engine for the stage, prepared by accelerate (seeded first)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    rl, plan, source = ctx.cfg.rl, ctx.plan, ctx.source()
    # DDP: a vision-language model's tower goes unused on a process whose batch has no image
    unused = [DistributedDataParallelKwargs(find_unused_parameters=True)] if models.is_vision(source) else []
    acc = Accelerator(cpu=plan.hardware.is_cpu, mixed_precision=plan.mixed_precision, kwargs_handlers=unused)
    set_seed(ctx.cfg.seed)
    tok = models.tokenizer(source)
    processor = models.processor(source)
    if processor is not None:
        refuse_for_images(rl, models.family(source), plan.generation_engine, _async_engine(plan), source.name)
    rows = kept_rows(ctx, tok)
    sharded = sharding.owns(ctx.stage)
    with sharding.full_loading():
        policy, ref, critic = load_models(ctx)
    if sharded:  # FSDP2 by rlctl: each decoder layer, then the root, over every process
        models_ = (policy, ref, critic)
        policy, ref, critic = (m and sharding.shard(m, acc.device.type, plan.mixed_precision) for m in models_)
    updates = rl.ppo_epochs * rl.ppo_mini_batches
    opt, sched = optimizer_and_schedule(
        rl, policy, rl.learning_rate, (rl.max_steps - min(rl.critic.warmup_steps, rl.max_steps)) * updates
    )
    if not sharded:
        policy, opt = acc.prepare(policy, opt)
    acc.register_for_checkpointing(sched)
    shards = {"policy": (policy, opt)} if sharded else {}  # what DCP checkpoints (accelerate: schedulers, RNG)
    c_opt = c_sched = None
    if critic is not None:
        c_updates = rl.total_steps * updates  # value pretraining included
        c_opt, c_sched = optimizer_and_schedule(rl, critic, rl.critic_learning_rate, c_updates)
        if not sharded:
            critic, c_opt = acc.prepare(critic, c_opt)
        acc.register_for_checkpointing(c_sched)
        shards |= {"critic": (critic, c_opt)} if sharded else {}
    if ref is not None and not sharded:
        ref.to(acc.device)
    with sharding.full_loading():
        scorer = Scorer(rl, ctx.rewards(), tok, acc.device)
    weights = sharding.full_weights if sharded else None
    agent = multiturn.agent_for(rl, tok)
    stops = agent.stop_ids if agent else ()
    generator = generate.for_plan(plan, tok, acc.unwrap_model(policy), acc, weights, stops)
    async_generator = None
    if plan.async_split is not None:  # this node: the rank's place among the nodes (node ranks share one plan)
        node = acc.process_index // max(1, acc.num_processes // plan.hardware.nodes)
        async_generator = async_setup(plan, acc.unwrap_model(policy), tok, node)
    return Parts(
        acc=acc,
        tok=tok,
        rows=rows,
        policy=policy,
        opt=opt,
        sched=sched,
        ref=ref,
        critic=critic,
        c_opt=c_opt,
        c_sched=c_sched,
        scorer=scorer,
        generator=generator,
        agent=agent,
        shards=shards,
        async_generator=async_generator,
        processor=processor,
    )


def refuse_for_images(rl: RLConfig, family: Family, engine: str, async_engine: str | None, policy: str) -> None:
    """What a vision-language policy of `family` (the model at `policy`) cannot train with, refused before anything
    loads: a critic from the rm stage when the family does not train the rm stage (transformers has no sequence
    classifier for these models) and vLLM generation (the plan's `engine`), in the trainer or the async generator
    (`async_engine`, None when rollouts are not async), when rlctl's vLLM engines cannot generate for it (they get
    token ids only)."""
    found = [
        (
            "rl.critic.init=reward_model",
            rl.critic.init == "reward_model" and "rm" not in family.stages,
            "rl.critic.init=policy (a critic from the starting policy)",
        ),
        ("vLLM generation", (engine == "vllm" or async_engine == "vllm") and not family.vllm, "rl.use_vllm=false"),
    ]
    for what, used, fix in found:
        if used:
            raise UserError(
                f"{what} is not available for vision-language models yet ({policy} has a vision "
                f"tower); use {fix}. See docs/vlm.md."
            )


def _async_engine(plan: Plan) -> str | None:
    """The async generator's engine ("vllm" or "transformers"), None when rollouts are not async."""
    return plan.async_split.generator_engine if plan.async_split is not None else None


def load_models(ctx: StageContext) -> tuple[Module, Module | None, Module | None]:
    """(policy, reference or None, critic or None): the reference is the starting policy, frozen."""
    rl, source = ctx.cfg.rl, ctx.source()
    policy = no_dropout(models.causal_lm(source))
    if ctx.plan.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = models.lora_config(source)
    ref = None
    if rl.beta > 0 and lora is None:
        ref = no_dropout(models.causal_lm(source, trainable=False)).eval().requires_grad_(False)
    if lora is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, lora)
    critic = None
    if rl.critic.init is not None:
        start = source if rl.critic.init == "policy" else source.at(RunDir(ctx.run_dir).final("rm"))
        critic = load_critic(start, ctx.plan.gradient_checkpointing)
    return policy, ref, critic


def load_critic(source: models.ModelSource, checkpointing: bool) -> Module:
    """PPO's critic from the model `source`, one value per token: transformers' token classifier with one label
    for a text model; for a vision-language model, which has none, its backbone with a value head
    (`VisionValueModel`). Dropout off, gradient checkpointing as planned (`checkpointing`), LoRA when the plan
    trains adapters (the value head trains whole)."""
    from transformers import AutoModel, AutoModelForTokenClassification

    loading = {"dtype": models.torch_dtype(source), "trust_remote_code": source.model.trust_remote_code}
    vision = models.is_vision(source)
    if vision:
        backbone = models.in_step(source, AutoModel.from_pretrained(source.name, **loading))
        critic = models.frozen_vision(source, VisionValueModel(backbone))
    else:
        critic = AutoModelForTokenClassification.from_pretrained(source.name, num_labels=1, **loading)
    critic = no_dropout(critic)
    if checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = models.lora_config(source, task_type=None if vision else "TOKEN_CLS")
    if lora is None:
        return critic
    from peft import get_peft_model

    return get_peft_model(critic, lora)


def async_setup(plan: Plan, policy: Module, tok: PreTrainedTokenizerBase, node: int) -> AsyncGenerators:
    """What the async generator engines of node `node` build themselves from (rl.async_rollout): the plan's
    engines per node, each on its own tensor-parallel group of the node's generator GPUs (or its share of the
    cores), with its index over all nodes; with vLLM, the probe text the weight-sync check scores on every push."""
    from rlctl.rollout import vllm
    from rlctl.trainer.async_rollout import PROBE, PROBE_TOKENS

    cfg, split = plan.config, plan.async_split
    base = sharding.base_of(policy)
    nodes = plan.hardware.nodes
    here, tp = split.engines // nodes, split.tensor_parallel_size
    chunk = plan.rollouts_per_generate
    setups = []
    for j in range(here):
        gpus = split.generator_gpu_ids[j * tp : (j + 1) * tp]
        visible = ",".join(map(str, gpus)) if gpus else None
        setup = GeneratorSetup(
            base.config, tok, cfg.rl, "cuda:0" if gpus else "cpu", visible, split.generator_threads,
            cfg.seed, chunk, index=node * here + j, node=node,
        )  # fmt: skip
        if split.generator_engine == "vllm":
            setup.probe = tok(PROBE, add_special_tokens=False)["input_ids"][:PROBE_TOKENS]
            setup.llm_args = vllm.llm_kwargs(plan, dedicated=True)
            setup.env = vllm.dedicated_environment(plan, split.generator_threads)
        setups.append(setup)
    hw = cfg.hardware
    host = hw.main_address if nodes > 1 and hw.main_address else "127.0.0.1"
    return AsyncGenerators(setups, split.engines, host, nodes)
