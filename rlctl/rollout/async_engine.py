"""The generator process of asynchronous RL (rl.async_rollout): a copy of the policy that samples rollouts while
the trainer updates.

The trainer (`AsyncEngine`, on the main process) submits rounds of prompts; the generator (`serve`, a spawned
process with its own torch threads or its own GPU) samples each round with the newest weights it has, computes
the log-probs of what it sampled with the same forward pass the trainer uses (the behaviour policy of the
off-policy correction), and sends the round back tagged with the policy version that produced it. Weights travel
through shared memory: `push` copies the trainer's weights (LoRA merged, gathered when sharded) into shared
buffers under a lock and bumps the version; the generator copies them into its model between rounds, so a push
never waits longer than that copy. Each round also carries a fingerprint of the weights the generator used (a sum
per tensor): a push that did not arrive intact stops the run as a broken weight sync. Rounds are sampled with a
seed of their own, so a round regenerated after a resume (the same prompts, the same weights) is the same.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rlctl import processes
from rlctl.rollout.samples import Sample, collate, token_logprobs

POLL_S = 5.0  # how often a wait for the generator checks that it is still alive


@dataclass
class GeneratorSetup:
    """What the generator process builds itself from (picklable)."""

    model_config: Any  # the policy's transformers config
    tokenizer: Any
    rl: Any  # the run's rl section: sampling settings and tools
    device: str  # cpu, or cuda:0 of `visible_gpus`
    visible_gpus: str | None  # the generator's own GPUs (CUDA_VISIBLE_DEVICES, physical ids), None on CPU
    threads: int  # torch CPU threads
    seed: int
    batch_size: int  # rollouts per generate call


@dataclass
class Round:
    """A round of prompts sent to the generator; `key` seeds its sampling (the cursor of its first prompt)."""

    key: int
    samples: list[Sample]


@dataclass
class Done:
    """A sampled round: the samples with completions and behaviour log-probs, the version that sampled them."""

    key: int
    samples: list[Sample]
    version: int
    fingerprint: torch.Tensor
    seconds: float


def fingerprint(weights: Iterable[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """One float64 sum per tensor, in name order: equal weights give equal fingerprints, bit for bit."""
    return torch.tensor([float(t.double().sum()) for _, t in sorted(weights, key=lambda nt: nt[0])])


class AsyncEngine:
    """The trainer's side: starts the generator process, pushes weights, submits rounds, receives them."""

    def __init__(self, setup: GeneratorSetup, weights: Iterable[tuple[str, torch.Tensor]], version: int):
        """Start the generator with `weights` (iterated to the end) as policy version `version`."""
        import torch.multiprocessing as mp

        self.buffers = {name: t.detach().to("cpu", copy=True).share_memory_() for name, t in weights}
        ctx = mp.get_context("spawn")
        self.lock, self.version = ctx.Lock(), ctx.Value("q", version)
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.fingerprints = {version: fingerprint(self.buffers.items())}
        args = (setup, self.buffers, self.lock, self.version, self.requests, self.replies)
        self.proc = ctx.Process(target=serve, args=args, daemon=True, name="rlctl-generator")
        self.proc.start()

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Copy the policy's weights into the shared buffers as `version`; the seconds the copy held the lock.
        `weights` is iterated to its end (a sharded policy gathers in it, on every process)."""
        start, sums = time.perf_counter(), {}
        with self.lock:
            for name, tensor in weights:
                self.buffers[name].copy_(tensor.detach())
                sums[name] = float(tensor.detach().double().sum())
            self.version.value = version
        self.fingerprints = {v: f for v, f in self.fingerprints.items() if v > version - 64}
        self.fingerprints[version] = torch.tensor([sums[name] for name in sorted(sums)])
        return time.perf_counter() - start

    def submit(self, round_: Round) -> None:
        self.requests.put(round_)

    def receive(self) -> Done:
        """The next sampled round (in the order submitted); a RuntimeError when the generator failed or died."""
        while True:
            try:
                reply = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(
                        f"the async generator process exited with code {self.proc.exitcode} without answering "
                        "(out of memory? see logs/train.log)"
                    ) from None
                continue
            if isinstance(reply, str):
                raise RuntimeError(f"the async generator process failed:\n{reply}")
            return reply

    def intact(self, done: Done) -> bool:
        """Whether the round was sampled with exactly the weights pushed as its version."""
        pushed = self.fingerprints.get(done.version)
        same_size = pushed is not None and pushed.shape == done.fingerprint.shape
        return same_size and torch.allclose(pushed, done.fingerprint, rtol=1e-6, atol=1e-6)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.requests.put(None)
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def serve(setup: GeneratorSetup, buffers: dict, lock: Any, version: Any, requests: Any, replies: Any) -> None:
    """The generator process: sample every round it is sent until it gets None."""
    processes.die_with_parent()
    if setup.visible_gpus is not None:  # the trainer's processes see only their GPUs; this one only its own
        os.environ["CUDA_VISIBLE_DEVICES"] = setup.visible_gpus
    for signum in (signal.SIGINT, signal.SIGTERM):  # a stop reaches the whole group: the trainer saves, then ends
        signal.signal(signum, signal.SIG_IGN)  # this process (a trainer killed outright takes it along)
    try:
        _serve(setup, buffers, lock, version, requests, replies)
    except Exception:
        replies.put(traceback.format_exc())


def _serve(setup: GeneratorSetup, buffers: dict, lock: Any, version: Any, requests: Any, replies: Any) -> None:
    from transformers import AutoModelForCausalLM

    from rlctl.rollout import multiturn
    from rlctl.rollout.generate import HFGenerator

    torch.set_num_threads(setup.threads)
    rl, tok = setup.rl, setup.tokenizer
    dtype = next(iter(buffers.values())).dtype
    model = AutoModelForCausalLM.from_config(setup.model_config, torch_dtype=dtype).to(setup.device).eval()
    agent = multiturn.agent_for(rl, tok)
    stops = agent.stop_ids if agent else ()
    engine = HFGenerator(tok, rl.max_new_tokens, rl.temperature, setup.batch_size, stop_ids=stops)
    engine.sync(model)
    loaded, mark = -1, torch.zeros(0)
    while (round_ := requests.get()) is not None:
        start = time.perf_counter()
        with lock:
            if version.value != loaded:
                model.load_state_dict(buffers, strict=False)  # a tied head comes once; tie_weights keeps it tied
                model.tie_weights()
                loaded = version.value
                mark = fingerprint((n, p) for n, p in model.state_dict().items() if n in buffers)
        torch.manual_seed(setup.seed + round_.key)
        samples = round_.samples
        if agent is not None:
            multiturn.rollout(agent, engine, samples)
        else:
            for s, ids in zip(samples, engine.generate([s.prompt_ids for s in samples]), strict=True):
                s.completion_ids, s.truncated = ids, tok.eos_token_id not in ids
        with torch.no_grad():
            for i in range(0, len(samples), setup.batch_size):
                part = samples[i : i + setup.batch_size]
                lps = token_logprobs(model, collate(part, tok.pad_token_id, setup.device), rl.temperature)
                for s, row in zip(part, lps.cpu().tolist(), strict=True):
                    s.rollout_logprobs = row[: len(s.completion_ids)]
        replies.put(Done(round_.key, samples, loaded, mark, time.perf_counter() - start))
