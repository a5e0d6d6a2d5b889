"""Asynchronous rollouts in rlctl's loop (rl.async_rollout): rounds of prompts sampled by the generator engines
(`rlctl.rollout.async_engine`, one process each, on every node of the run) while the trainer updates.

The pipeline keeps up to `max_staleness` + 1 rounds submitted ahead of what the loop has consumed, and never more
than the steps left to train: while step n trains, the engines sample the rounds of steps n+1 .. n+K with the
newest weights pushed. Each round is cut into one share per engine; a round is trained once every engine sent its
share back. A share sampled with policy version v and trained at step n (whose policy is version n-1) is n-1-v
versions stale; a round submitted at step s is sampled with version s-1 or newer (each engine waits for that push)
and consumed at step s+K at the latest, so staleness is never more than K (NeMo-RL's N-step off-policy GRPO,
verl's one-step-off at K=1). The engines' log-probs of what they sampled are the behaviour policy: the ppo loss
takes the round's ratio against them, so its clip is a trust region around the policy that sampled
(`rlctl.algorithms.mismatch.behaviour_ratio`). With vLLM engines, every push also carries the policy's log-probs of
a probe text (`PROBE`), which each engine compares with vLLM's after loading: the weight-sync check, on every
version. Every step logs each engine's share (`generator<i>_rollouts`), the pushes it had received
(`generator<i>_pushes`) and the version it sampled with; the stage's end logs what each engine did (`generators`).

Resume loses no prompt: a checkpoint's prompt cursor is the first prompt not yet trained (that of the oldest
round in flight), so a resumed run submits the rounds that were in flight again, with the same sampling seeds.
Only the main process talks to the engines (every node's first process starts its node's engines); every process
takes the same prompts from its stream and receives each round's samples from the main process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from rlctl.rollout import async_engine, async_generator
from rlctl.rollout.async_engine import AsyncGenerators, Done, Generators
from rlctl.rollout.samples import Sample, collate, token_logprobs
from rlctl.trainer import sharding

# the vLLM generator's sync check scores this text (its first PROBE_TOKENS tokens) on every push
PROBE = "The quick brown fox jumps over the lazy dog. 12 + 7 = 19, and 3 x 4 = 12."
PROBE_TOKENS = 16

if TYPE_CHECKING:
    from rlctl.trainer.state import Loop


class Pipeline:
    """The rounds in flight and the engines they go to (their connections on the main process only)."""

    def __init__(self, loop: Loop, plan: AsyncGenerators, version: int):
        from accelerate.utils import broadcast_object_list

        self.depth = loop.rl.async_rollout.max_staleness + 1
        self.version = version  # the policy version the trainer holds: the number of steps trained
        self.inflight: deque[int] = deque()  # the key (first prompt) of each submitted round, oldest first
        self.submitted = 0  # rounds submitted by this pipeline
        self.staleness: list[int] = []  # of the shares the current step consumed
        self.gaps: list[tuple[float, float]] = []  # vLLM: the probe's log-prob gap of the shares consumed
        self.shares: dict[int, dict[str, float]] = {}  # the current step's metrics of each engine
        self.sampled_with = ""  # the engines' kind, as they report (transformers or vllm)
        self.running = 0  # engines whose shares made up the last round
        self.generators: Generators | None = None
        self.procs: list = []  # this node's engine processes (on its first process)
        self.probe = plan.setups[0].probe if plan.setups else None  # vLLM: the probe text's token ids
        if loop.settings.trainer_threads is not None:
            torch.set_num_threads(loop.settings.trainer_threads)
        opened = async_engine.open_link(plan.engines, plan.host, plan.nodes) if loop.acc.is_main_process else None
        sent = [opened[0] if opened else None]
        if loop.acc.num_processes > 1:
            broadcast_object_list(sent, from_process=0)
        link = sent[0]
        if loop.acc.is_local_main_process:
            self.procs = async_engine.start(plan.setups, link, async_generator.serve)
        probe = self._probe_logprobs(loop)
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if opened is not None:
            _, listener, store = opened
            local = {setup.index: proc for setup, proc in zip(plan.setups, self.procs, strict=True)}
            on_cpu = [(name, t.detach().to("cpu", copy=True)) for name, t in weights]
            self.generators = Generators(link, listener, store, local, on_cpu, version, probe)
        else:
            for _ in weights:  # a sharded policy gathers on every process
                pass

    def _probe_logprobs(self, loop: Loop) -> torch.Tensor | None:
        """The policy's log-probs of the probe text (temperature 1), on every process (a sharded forward)."""
        if self.probe is None:
            return None
        model = loop.acc.unwrap_model(loop.policy)
        batch = collate([Sample(0, {}, self.probe[:1], self.probe[1:])], loop.tok.pad_token_id, loop.acc.device)
        with torch.no_grad():
            return token_logprobs(model, batch, 1.0)[0].double().cpu()

    def resume_cursor(self, loop: Loop, step: int) -> int:
        """The first prompt not yet trained after step `step` (that of the oldest round in flight, in the stream of
        step `step` + 1): a checkpoint's resume point."""
        return self.inflight[0] if self.inflight else loop.stream_at(step + 1).cursor

    def fill(self, loop: Loop, step: int) -> None:
        """Submit rounds until `depth` are in flight, but never more than the steps from `step` on can train, value
        pretraining's included (every process takes the same prompts from the stream of the round's step)."""
        while len(self.inflight) < min(self.depth, loop.rl.total_steps - step + 1):
            for_step = step + len(self.inflight)  # the rounds in flight are those of steps step, step + 1, ...
            key = loop.stream_at(for_step).cursor
            samples = loop.take_round(for_step)
            self.inflight.append(key)
            self.submitted += 1
            if self.generators is not None:
                self.generators.submit(key, samples, self.version)

    def next_round(self, loop: Loop, step: int) -> list[Sample]:
        """This process's share of the oldest round in flight, once every engine sampled its part (staleness and
        each engine's share recorded); a broken push stops the stage."""
        from accelerate.utils import broadcast_object_list

        self.fill(loop, step)
        key = self.inflight.popleft()
        sent: list[tuple[list[bool], list[Done]] | None] = [None]
        if self.generators is not None:
            dones = self.generators.receive()
            assert all(done.key == key for done in dones), (key, [d.key for d in dones])  # in the order submitted
            sent = [([self.generators.intact(done) for done in dones], dones)]
        if loop.acc.num_processes > 1:
            broadcast_object_list(sent, from_process=0)
        intact, dones = sent[0]
        for ok, done in zip(intact, dones, strict=True):
            if not ok:
                raise loop.hooks.stops.push_stopped(step, done.version)
        for i, done in enumerate(dones):
            if done.probe_gap is not None:
                on = f"a probe text, policy version {done.version} (engine {i})"
                loop.hooks.stops.check_sync(step, *done.probe_gap, on=on)
                self.gaps.append(done.probe_gap)
            self.staleness.append(self.version - done.version)
            mine = self.shares.setdefault(i, {"rollouts": 0, "version": done.version})
            mine["rollouts"] += len(done.samples)
            mine["version"] = min(mine["version"], done.version)
            mine["pushes"] = done.pushes
        self.sampled_with, self.running = dones[0].engine, len(dones)
        return loop.mine([s for done in dones for s in done.samples])

    def push(self, loop: Loop, step: int) -> None:
        """The weights after step `step` (policy version `step`) to every engine; none after the last step (no
        round is left to sample with them)."""
        self.version = step
        if step >= loop.rl.total_steps:
            return
        probe = self._probe_logprobs(loop)
        weights = sharding.full_weights(loop.acc.unwrap_model(loop.policy))
        if self.generators is not None:
            self.generators.push(weights, step, probe)
        else:
            for _ in weights:  # a sharded policy gathers on every process
                pass

    def metrics(self) -> dict[str, float]:
        """The step's staleness (versions behind the trainer, mean and max over its shares), each engine's share,
        the version it sampled with and the pushes it had received, and, with vLLM, the sync check's log-prob
        gap on the probe; then reset."""
        out = {"staleness_mean": sum(self.staleness) / len(self.staleness), "staleness_max": max(self.staleness)}
        for i, share in sorted(self.shares.items()):
            out |= {f"generator{i}_{key}": value for key, value in share.items()}
        if self.gaps:
            out["sync_logp_diff_mean"] = sum(g[0] for g in self.gaps) / len(self.gaps)
            out["sync_logp_diff_max"] = max(g[1] for g in self.gaps)
        self.staleness, self.gaps, self.shares = [], [], {}
        return out

    def close(self, loop: Loop) -> None:
        """End the engines (rounds in flight are dropped) and log what each did."""
        if self.generators is None:
            async_engine.stop(self.procs)
            return
        tallies = self.generators.close()
        loop.hooks.log.write(
            stage="rl", event="generators", rounds_submitted=self.submitted, generators=[asdict(t) for t in tallies]
        )
