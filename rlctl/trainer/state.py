"""The state of rlctl's RL loop: what the rl stage hands it (`Parts`, ready-built: models, optimizers, scorer,
generation engine; `Settings`, the rl section and the plan fields the loop reads; `Hooks`, the stage around it),
what every step works with (`Loop`), built once by `setup`, written at each checkpoint (`save_checkpoint`) and
brought back from the last complete one by `restore`; and the clock of a step's phases (`PhaseClock`).

A checkpoint holds the models, optimizers, schedulers and every process's RNG through accelerate, models sharded by
rlctl (`rlctl.trainer.sharding`) and their optimizers through torch distributed checkpoint (DCP: one file per
process, `sharded/__R_0.distcp`, plus `.metadata`; a load reshards when the process count changed), and the loop's
own state (step, prompt cursor, KL coefficient, world size) in `rlctl_loop.json`. Each is published by the
checkpoint protocol of `rlctl.checkpoint` once every process wrote it, scored on held-out data first when
checkpoint.keep_best."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from rlctl import checkpoint, rundir
from rlctl.algorithms import AdaptiveKLController, AdvantageConfig, FixedKLController, PolicyLossConfig
from rlctl.config.rl import RLConfig
from rlctl.data.tokens import prompt_text
from rlctl.monitors.hooks import Monitors
from rlctl.rollout import multiturn
from rlctl.rollout.async_engine import AsyncGenerators
from rlctl.rollout.generate import Generator
from rlctl.rollout.samples import Batch, PromptStream, Sample, pad_to
from rlctl.rollout.vision import VisionInputs, encode, row_images
from rlctl.rundir import LOOP_STATE, LoopState, read_record, write_record
from rlctl.runtime.context import MetricsLog, StopFlag, Stops, resume_point
from rlctl.runtime.rewarding import Scorer
from rlctl.trainer.offload import Offloaded, offload_optimizer_state

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.nn import Module
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import PreTrainedTokenizerBase

Rows = TypeVar("Rows", list[Sample], Tensor)
SHARDS = "sharded"  # a checkpoint's DCP folder: one __R_0.distcp per process and .metadata
PRETRAIN_STREAM_SEED = 1_000_003  # added to the run's seed: value pretraining's prompt order, apart from the policy's


@dataclass
class Parts:
    """What the rl stage builds and hands the loop, ready to train (`rlctl.stages.rl.parts`): the accelerator
    (seeded), the tokenizer, the training rows, the policy with its optimizer and schedule, the frozen reference
    (None: none, or the LoRA policy's adapters switched off), the PPO critic with its own (None without one), the
    scorer, the generation engine, the multi-turn agent (None: single-turn), the (model, optimizer) pairs DCP
    checkpoints when rlctl shards (else empty), and, with rl.async_rollout, what this node's generator engines
    build themselves from (else None); a vision-language policy's processor (None: a text model), which turns each
    prompt's images into model inputs."""

    acc: Accelerator
    tok: PreTrainedTokenizerBase
    rows: list[dict[str, Any]]
    policy: Module
    opt: Optimizer
    sched: LRScheduler
    ref: Module | None
    critic: Module | None
    c_opt: Optimizer | None
    c_sched: LRScheduler | None
    scorer: Scorer
    generator: Generator
    agent: multiturn.Agent | None
    shards: dict[str, tuple[Module, Optimizer]]
    async_generator: AsyncGenerators | None
    processor: Any = None


@dataclass
class Settings:
    """What the loop reads of the run: its rl section and the few plan fields beside it."""

    rl: RLConfig
    seed: int
    micro_batch_size: int  # rollouts per forward/backward (the plan's, for the rl stage)
    phase_offload: bool  # the policy's AdamW moments in host RAM except around its optimizer step
    trainer_threads: int | None  # rl.async_rollout on CPU: the trainer process's torch threads, else None


@dataclass
class Hooks:
    """The stage around the loop, as the loop reaches it: its metrics log, stop flag and the errors that end it
    (with its checkpoints folder), whether this is the main process, and the stage's monitors, whose methods the
    loop calls at each phase boundary (`lap`: the memory probe), after each step's record (`flush`), with each
    checkpoint written (`publish`: held-out scoring, then the checkpoint protocol), at the first step
    (`check_layout`: against the plan) and at the end (`finish_layout`: the offload's switches over the stage)."""

    log: MetricsLog
    stop: StopFlag
    stops: Stops
    is_main: bool
    monitors: Monitors


@dataclass
class Loop:
    """What every step works with, built once by `setup` from the stage's parts: the accelerator, models,
    optimizers, prompt streams (the policy's, and VAPO's value pretraining's own), scorer and generation engine, and
    how each process splits the batch (`shard` rollouts per process, `mini` per optimizer update, `micro` per
    forward/backward)."""

    settings: Settings
    hooks: Hooks
    acc: Accelerator
    tok: PreTrainedTokenizerBase
    policy: Module
    ref: Module | None
    critic: Module | None
    opt: Optimizer
    sched: LRScheduler
    c_opt: Optimizer | None
    c_sched: LRScheduler | None
    kl_ctl: FixedKLController | AdaptiveKLController
    stream: PromptStream  # the policy's steps' prompts
    pretrain_stream: PromptStream  # value pretraining's (rl.critic.pretrain_steps): the same rows in another order
    scorer: Scorer
    generator: Generator
    loss_cfg: PolicyLossConfig
    adv_cfg: AdvantageConfig
    shard: int
    mini: int
    micro: int
    clock: PhaseClock
    agent: multiturn.Agent | None  # multi-turn rollouts with rl.tools, else None (single-turn)
    shards: dict[str, tuple[Module, Optimizer]]  # sharded (model, optimizer) pairs DCP checkpoints, by name
    offloaded: Offloaded = field(default_factory=Offloaded)  # the policy's AdamW state between phases
    # rl.async_rollout: the rounds the generator process samples (set by `loop.train`), else None
    pipeline: Any = None  # rlctl.trainer.async_rollout.Pipeline when rollouts are async (it reads Loop: not imported)
    processor: Any = None  # a vision-language policy's processor (prompts with images), else None

    @property
    def rl(self) -> RLConfig:
        return self.settings.rl

    @property
    def rank(self) -> int:
        return self.acc.process_index

    def pretraining(self, step: int) -> bool:
        """Whether `step` is one of VAPO's value-pretraining steps (rl.critic.pretrain_steps, before rl.max_steps):
        the critic fits Monte-Carlo returns of the starting policy's samples, the policy does not move."""
        return step <= self.rl.critic.pretrain_steps

    def stream_at(self, step: int) -> PromptStream:
        """The prompts of step `step`: value pretraining draws from a stream of its own, so the policy's first step
        starts the policy's stream, and its steps see the prompts, in the order, they would without value
        pretraining (and that another algorithm sees at the same step)."""
        return self.pretrain_stream if self.pretraining(step) else self.stream

    def mine(self, rows: Rows) -> Rows:
        """This process's share of a batch identical on every process (samples, or row indices): `shard` rows
        from rank x shard."""
        return rows[self.rank * self.shard : (self.rank + 1) * self.shard]

    def prompt_inputs(self, row: dict) -> tuple[list[int], VisionInputs | None]:
        """The row's prompt ids (a vision-language model's with its image tokens expanded) and its images' model
        inputs (None without images)."""
        if self.agent is not None:  # image paths absolute: training_rows
            return self.agent.prompt_inputs(row, self.processor)
        text = prompt_text(row["prompt"], self.tok)
        if self.processor is not None:
            return encode(self.processor, text, row_images(row, None))  # image paths absolute: training_rows
        return self.tok(text, add_special_tokens=False)["input_ids"], None  # fits: training_rows

    def take_round(self, step: int) -> list[Sample]:
        """The next prompts_per_step prompts of step `step`'s stream, group_size unsampled samples each (every
        process takes the same ones)."""
        taken = self.stream_at(step).take(self.rl.prompts_per_step)
        prompts = [(g, row, *self.prompt_inputs(row)) for g, row in taken]
        return [Sample(g, row, list(ids), vision=v) for g, row, ids, v in prompts for _ in range(self.rl.group_size)]

    def forward_all(self, fn, model, batch: Batch) -> Tensor:
        """`fn(model, micro-batch)` over the whole batch without gradients, concatenated."""
        with torch.no_grad():
            return torch.cat([fn(model, batch[i : i + self.micro]) for i in range(0, len(batch.input_ids), self.micro)])

    def gather_rows(self, x: Tensor) -> Tensor:
        """This process's [shard, t] rows padded to max_new_tokens and gathered into [batch, max_new_tokens]."""
        return self.acc.gather(pad_to(x, self.rl.max_new_tokens).contiguous())


def setup(parts: Parts, settings: Settings, hooks: Hooks) -> Loop:
    """The loop over the stage's parts: the KL controller, the prompt streams, the loss and advantage settings,
    how each process splits the batch and the phase clock."""
    rl, acc = settings.rl, parts.acc
    shard = rl.prompts_per_step * rl.group_size // acc.num_processes
    mini = shard // rl.ppo_mini_batches
    micro = max(d for d in range(1, min(settings.micro_batch_size, mini) + 1) if mini % d == 0)
    kl_ctl = AdaptiveKLController(rl.beta, rl.kl.target, rl.kl.horizon) if rl.kl.target else FixedKLController(rl.beta)
    loss_cfg = PolicyLossConfig(
        clip_low=rl.loss.clip_low,
        clip_high=rl.loss.clip_high,
        dual_clip_c=rl.loss.dual_clip,
        cispo_max=rl.loss.cispo_cap,
        loss_agg_mode=rl.loss.agg,
        norm_len=rl.max_new_tokens,
    )
    ret = rl.returns
    adv_cfg = AdvantageConfig(
        gamma=ret.gamma, lam=ret.lam, lam_alpha=ret.lam_alpha, short_lam=ret.short_lam, critic_lam=ret.critic_lam
    )
    return Loop(
        settings=settings,
        hooks=hooks,
        acc=acc,
        tok=parts.tok,
        policy=parts.policy,
        ref=parts.ref,
        critic=parts.critic,
        opt=parts.opt,
        sched=parts.sched,
        c_opt=parts.c_opt,
        c_sched=parts.c_sched,
        kl_ctl=kl_ctl,
        stream=PromptStream(parts.rows, settings.seed),
        pretrain_stream=PromptStream(parts.rows, settings.seed + PRETRAIN_STREAM_SEED),
        scorer=parts.scorer,
        generator=parts.generator,
        loss_cfg=loss_cfg,
        adv_cfg=adv_cfg,
        shard=shard,
        mini=mini,
        micro=micro,
        clock=PhaseClock(acc.device.type == "cuda", on_lap=hooks.monitors.lap),
        agent=parts.agent,
        shards=parts.shards,
        processor=parts.processor,
    )


def restore(loop: Loop) -> int:
    """Resume from the last complete checkpoint (models, optimizers, RNG, loop state); returns the step it ended."""
    from accelerate.utils import set_seed

    start = 0
    hooks, seed = loop.hooks, loop.settings.seed
    state = load_checkpoint(resume_point(hooks.stops.checkpoints, hooks.is_main), loop.acc, loop.shards)
    if state:
        start, loop.stream_at(state.step + 1).cursor, loop.kl_ctl.value = state.step, state.cursor, state.kl_coef
        if state.world not in (None, loop.acc.num_processes):  # each process samples anew
            set_seed(seed + loop.rank + start)
    else:
        set_seed(seed + loop.rank)  # each process samples different completions
    if loop.settings.phase_offload:  # AdamW moments live in host RAM except around the policy's optimizer step
        offload_optimizer_state(loop.opt, loop.offloaded)
    return start


# ----------------------------------------------------------------------------------------------- checkpoints
def load_checkpoint(last: str | None, acc: Accelerator, shards: dict) -> LoopState | None:
    """Restore the last complete checkpoint (`last`) into the prepared objects; its loop state, or None to start
    anew."""
    if not last:
        return None
    acc.load_state(last)
    if shards:
        load_shards(Path(last), shards)  # resharded when the process count changed
    works = "Resume from an earlier checkpoint: move this one aside (rename it), then `rlctl resume`."
    return read_record(Path(last) / LOOP_STATE, LoopState.from_json, works)


def save_checkpoint(loop: Loop, step: int, state: LoopState) -> None:
    """Models, optimizers, schedulers and every process's RNG (accelerate; sharded models and their optimizers
    through DCP, one file per process), plus the loop state, written under `.incoming` and published (scored for
    keep-best, marked complete, renamed into place) once all is written."""
    acc = loop.acc
    folder = rundir.checkpoint(checkpoint.incoming(loop.hooks.stops.checkpoints), step)
    acc.wait_for_everyone()
    acc.save_state(str(folder))
    if loop.shards:
        save_shards(folder, loop.shards)
    if acc.is_main_process:
        write_record(folder / LOOP_STATE, state)
    loop.hooks.monitors.publish(step, acc.unwrap_model(loop.policy), loop.tok)


def _states(parts: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """The sharded state dicts of each (model, optimizer) pair, keyed `NAME` and `NAME_optim`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state: dict[str, Any] = {}
    for name, (model, optimizer) in parts.items():
        state[name], state[f"{name}_optim"] = get_state_dict(model, optimizer)
    return state


def save_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Write each (model, optimizer) of `parts` into `folder/sharded` with DCP; every process writes its shard."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(parts), checkpoint_id=str(folder / SHARDS))


def load_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Read `folder/sharded` into each (model, optimizer) of `parts`, resharded for this process count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _states(parts)
    dcp.load(state, checkpoint_id=str(folder / SHARDS))
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])


class PhaseClock:
    """Seconds each phase of a step took (sync, generate, score, prepare, update), logged as `time_<phase>`.
    On a GPU it waits for the queued kernels at each boundary, so work is charged to the phase that launched it.
    `on_lap(phase)` is told of every boundary (the memory probe's phases)."""

    def __init__(self, cuda: bool, on_lap: Callable[[str], None] | None = None):
        self.cuda, self.on_lap = cuda, on_lap
        self.start()

    def start(self) -> None:
        self.spent, self.mark = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.mark
        self.mark = now
        if self.on_lap is not None:
            self.on_lap(phase)

    def times(self) -> dict[str, float]:
        return {f"time_{phase}": round(seconds, 4) for phase, seconds in self.spent.items()}
