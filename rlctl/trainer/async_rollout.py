"""Asynchronous rollouts in rlctl's loop (rl.async_rollout): rounds of prompts sampled by the generator process
(`rlctl.rollout.async_engine`) while the trainer updates.

The pipeline keeps `max_staleness` + 1 rounds submitted ahead of what the loop has consumed: while step n trains,
the generator samples the rounds of steps n+1 .. n+K with the newest weights pushed. A round sampled with policy
version v and trained at step n (whose policy is version n-1) is n-1-v versions stale; since a round is
submitted at most K rounds before it is consumed and the generator always loads the newest version first, that is
never more than K (NeMo-RL's N-step off-policy GRPO, verl's one-step-off at K=1). The generator's log-probs of
what it sampled are the behaviour policy of the loop's rollout correction (rl.rollout_correction).

Resume loses no prompt: a checkpoint's prompt cursor is the first prompt not yet trained (that of the oldest
round in flight), so a resumed run submits the rounds that were in flight again, with the same sampling seeds.
Only the main process talks to the generator; every process takes the same prompts from its stream and receives
each round's samples from the main process.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import torch

from rlctl.rollout.async_engine import AsyncEngine, Done, GeneratorSetup, Round
from rlctl.rollout.samples import Sample
from rlctl.trainer import sharding

if TYPE_CHECKING:
    from rlctl.trainer.state import Loop


class Pipeline:
    """The rounds in flight and the generator they go to (the engine on the main process only)."""

    def __init__(self, loop: Loop, version: int):
        split, rl = loop.ctx.plan.async_split, loop.rl
        self.depth = rl.async_rollout.max_staleness + 1
        self.version = version  # the policy version the trainer holds: the number of steps trained
        self.inflight: deque[int] = deque()  # the key (first prompt) of each submitted round, oldest first
        self.staleness: list[int] = []  # of the rounds the current step consumed
        self.engine: AsyncEngine | None = None
        if loop.ctx.plan.hardware.is_cpu:
            torch.set_num_threads(split.trainer_threads)
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if loop.acc.is_main_process:
            base = sharding.base_of(loop.acc.unwrap_model(loop.policy))
            gpus = str(split.generator_gpu_ids[0]) if split.generator_gpu_ids else None  # transformers: one GPU
            device = "cuda:0" if gpus else "cpu"
            threads, seed = split.generator_threads, loop.ctx.cfg.seed
            chunk = loop.ctx.plan.rollouts_per_generate
            setup = GeneratorSetup(base.config, loop.tok, rl, device, gpus, threads, seed, chunk)
            self.engine = AsyncEngine(setup, weights, version)
        elif sharding.owns(loop.ctx):  # a sharded policy gathers on every process
            for _ in weights:
                pass

    def resume_cursor(self, loop: Loop) -> int:
        """The first prompt not yet trained (that of the oldest round in flight): a checkpoint's resume point."""
        return self.inflight[0] if self.inflight else loop.stream.cursor

    def fill(self, loop: Loop) -> None:
        """Submit rounds until `depth` are in flight (every process takes the same prompts from its stream)."""
        while len(self.inflight) < self.depth:
            key = loop.stream.cursor
            samples = loop.take_round()
            self.inflight.append(key)
            if self.engine is not None:
                self.engine.submit(Round(key, samples))

    def next_round(self, loop: Loop, step: int) -> list[Sample]:
        """This process's share of the oldest round in flight, once sampled (its staleness recorded); a broken
        push stops the stage."""
        from accelerate.utils import broadcast_object_list

        self.fill(loop)
        key = self.inflight.popleft()
        sent: list[tuple[bool, Done] | None] = [None]
        if self.engine is not None:
            done = self.engine.receive()
            assert done.key == key, (done.key, key)  # rounds come back in the order submitted
            sent = [(self.engine.intact(done), done)]
        if loop.acc.num_processes > 1:
            broadcast_object_list(sent, from_process=0)
        intact, done = sent[0]
        if not intact:
            raise loop.ctx.push_stopped(step, done.version)
        self.staleness.append(self.version - done.version)
        return done.samples[loop.rank * loop.shard : (loop.rank + 1) * loop.shard]

    def push(self, loop: Loop, step: int) -> None:
        """The weights after step `step` (policy version `step`) to the generator."""
        self.version = step
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if self.engine is not None:
            self.engine.push(weights, step)
        elif sharding.owns(loop.ctx):  # a sharded policy gathers on every process
            for _ in weights:
                pass

    def metrics(self) -> dict[str, float]:
        """The step's staleness (versions behind the trainer, mean and max over its rounds), then reset."""
        out = {"staleness_mean": sum(self.staleness) / len(self.staleness), "staleness_max": max(self.staleness)}
        self.staleness = []
        return out

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
