"""Asynchronous rollouts in rlctl's loop (rl.async_rollout): rounds of prompts sampled by the generator process
(`rlctl.rollout.async_engine`) while the trainer updates.

The pipeline keeps `max_staleness` + 1 rounds submitted ahead of what the loop has consumed: while step n trains,
the generator samples the rounds of steps n+1 .. n+K with the newest weights pushed. A round sampled with policy
version v and trained at step n (whose policy is version n-1) is n-1-v versions stale; since a round is
submitted at most K rounds before it is consumed and the generator always loads the newest version first, that is
never more than K (NeMo-RL's N-step off-policy GRPO, verl's one-step-off at K=1). The generator's log-probs of
what it sampled are the behaviour policy: the ppo loss takes the round's ratio against them, so its clip is a trust
region around the policy that sampled (`rlctl.algorithms.mismatch.behaviour_ratio`). With a vLLM
engine in the generator, every push also carries the policy's log-probs of a probe text (`PROBE`), which the
generator compares with vLLM's after loading: the weight-sync check, on every version.

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
from rlctl.rollout.samples import Sample, collate, token_logprobs
from rlctl.trainer import sharding

# the vLLM generator's sync check scores this text (its first PROBE_TOKENS tokens) on every push
PROBE = "The quick brown fox jumps over the lazy dog. 12 + 7 = 19, and 3 x 4 = 12."
PROBE_TOKENS = 16

if TYPE_CHECKING:
    from rlctl.trainer.state import Loop


class Pipeline:
    """The rounds in flight and the generator they go to (the engine on the main process only)."""

    def __init__(self, loop: Loop, setup: GeneratorSetup, version: int):
        self.depth = loop.rl.async_rollout.max_staleness + 1
        self.version = version  # the policy version the trainer holds: the number of steps trained
        self.inflight: deque[int] = deque()  # the key (first prompt) of each submitted round, oldest first
        self.staleness: list[int] = []  # of the rounds the current step consumed
        self.gaps: list[tuple[float, float]] = []  # vLLM: the probe's log-prob gap of the rounds consumed
        self.sampled_with = ""  # the generator's engine, as it reports (transformers or vllm)
        self.engine: AsyncEngine | None = None
        self.probe = setup.probe  # vLLM: the probe text's token ids, else None
        if loop.settings.trainer_threads is not None:
            torch.set_num_threads(loop.settings.trainer_threads)
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if loop.acc.is_main_process:
            self.engine = AsyncEngine(setup, weights, version, self._probe_logprobs(loop))
        else:
            self._gather(loop, weights)

    def _probe_logprobs(self, loop: Loop) -> torch.Tensor | None:
        """The policy's log-probs of the probe text (temperature 1), on every process (a sharded forward)."""
        if self.probe is None:
            return None
        model = loop.acc.unwrap_model(loop.policy)
        batch = collate([Sample(0, {}, self.probe[:1], self.probe[1:])], loop.tok.pad_token_id, loop.acc.device)
        with torch.no_grad():
            return token_logprobs(model, batch, 1.0)[0].double().cpu()

    def _gather(self, loop: Loop, weights) -> None:
        """A process other than the main one takes part in what a sharded policy's push gathers."""
        if loop.shards:  # sharded by rlctl
            for _ in weights:
                pass
            self._probe_logprobs(loop)

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
            raise loop.hooks.stops.push_stopped(step, done.version)
        if done.probe_gap is not None:
            on = f"a probe text, policy version {done.version}"
            loop.hooks.stops.check_sync(step, *done.probe_gap, on=on)
            self.gaps.append(done.probe_gap)
        self.staleness.append(self.version - done.version)
        self.sampled_with = done.engine
        return loop.mine(done.samples)

    def push(self, loop: Loop, step: int) -> None:
        """The weights after step `step` (policy version `step`) to the generator."""
        self.version = step
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if self.engine is not None:
            self.engine.push(weights, step, self._probe_logprobs(loop))
        else:
            self._gather(loop, weights)

    def metrics(self) -> dict[str, float]:
        """The step's staleness (versions behind the trainer, mean and max over its rounds) and, with vLLM, the
        sync check's log-prob gap on the probe; then reset."""
        out = {"staleness_mean": sum(self.staleness) / len(self.staleness), "staleness_max": max(self.staleness)}
        if self.gaps:
            out["sync_logp_diff_mean"] = sum(g[0] for g in self.gaps) / len(self.gaps)
            out["sync_logp_diff_max"] = max(g[1] for g in self.gaps)
        self.staleness, self.gaps = [], []
        return out

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
