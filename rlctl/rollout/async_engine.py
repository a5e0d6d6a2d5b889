"""The generator process of asynchronous RL (rl.async_rollout): a copy of the policy that samples rollouts while
the trainer updates.

The trainer (`AsyncEngine`, on the main process) submits rounds of prompts; the generator (`serve`, a spawned
process with its own torch threads or its own GPU) samples each round with the newest weights it has, computes
the log-probs of what it sampled (the behaviour policy of the off-policy correction), and sends the round back
tagged with the policy version that produced it. Its engine is a transformers copy of the policy (log-probs from
the trainer's own forward pass) or, with rl.use_vllm, a vLLM engine of its own (`rlctl.rollout.vllm.dedicated`,
log-probs from vLLM).

Weights travel through shared memory: `push` copies the trainer's weights (LoRA merged, gathered when sharded)
into shared buffers under a lock and bumps the version; the generator loads them into its engine between rounds,
so a push never waits longer than that copy. Each round carries a fingerprint of the weights the generator loaded
(a sum per tensor): a push that did not arrive intact stops the run as a broken weight sync. A vLLM engine keeps
its weights in its own layout (fused, packed), so each push also carries the trainer's log-probs of a fixed probe
text, and the generator compares vLLM's with them after loading (issue 18's sync check, on every push). Rounds
are sampled with a seed of their own, so a round regenerated after a resume (the same prompts, the same weights)
is the same.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rlctl import processes
from rlctl.errors import ChildDied
from rlctl.rollout import multiturn
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
    batch_size: int  # rollouts per generate call (transformers)
    llm_args: dict[str, Any] | None = None  # vLLM's engine arguments but `model`; None: transformers samples
    env: dict[str, str] | None = None  # set before the engine loads (vLLM's)
    probe: list[int] | None = None  # vLLM: the probe text's token ids the sync check scores


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
    probe_gap: tuple[float, float] | None = None  # vLLM: mean, max |log-prob difference| with the trainer's
    engine: str = "transformers"  # what sampled it: transformers or vllm


def fingerprint(weights: Iterable[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """One float64 sum per tensor, in name order: equal weights give equal fingerprints, bit for bit."""
    return torch.tensor([float(t.double().sum()) for _, t in sorted(weights, key=lambda nt: nt[0])])


class AsyncEngine:
    """The trainer's side: starts the generator process, pushes weights, submits rounds, receives them."""

    def __init__(
        self,
        setup: GeneratorSetup,
        weights: Iterable[tuple[str, torch.Tensor]],
        version: int,
        probe: torch.Tensor | None = None,
    ):
        """Start the generator with `weights` (iterated to the end) as policy version `version`; `probe`: the
        policy's log-probs of the probe text (vLLM)."""
        import torch.multiprocessing as mp

        self.buffers = {name: t.detach().to("cpu", copy=True).share_memory_() for name, t in weights}
        self.probe = (probe.detach().to("cpu", torch.float64) if probe is not None else torch.zeros(0)).share_memory_()
        ctx = mp.get_context("spawn")
        self.lock, self.version = ctx.Lock(), ctx.Value("q", version)
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.fingerprints = {version: fingerprint(self.buffers.items())}
        shared = Shared(self.buffers, self.probe, self.lock, self.version)
        args = (setup, shared, self.requests, self.replies)
        self.proc = ctx.Process(target=serve, args=args, daemon=True, name="rlctl-generator")
        self.proc.start()

    def push(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int, probe: torch.Tensor | None = None
    ) -> float:
        """Copy the policy's weights (and its probe log-probs) into the shared buffers as `version`; the seconds
        the copy held the lock. `weights` is iterated to its end (a sharded policy gathers in it, on every
        process)."""
        start, sums = time.perf_counter(), {}
        with self._locked():
            for name, tensor in weights:
                self.buffers[name].copy_(tensor.detach())
                sums[name] = float(tensor.detach().double().sum())
            if probe is not None:
                self.probe.copy_(probe.detach().reshape(-1))
            self.version.value = version
        self.fingerprints = {v: f for v, f in self.fingerprints.items() if v > version - 64}
        self.fingerprints[version] = torch.tensor([sums[name] for name in sorted(sums)])
        return time.perf_counter() - start

    def submit(self, round_: Round) -> None:
        self.requests.put(round_)

    def receive(self) -> Done:
        """The next sampled round (in the order submitted); ChildDied when the generator died, a RuntimeError when
        it failed."""
        while True:
            try:
                reply = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive()
                continue
            except Exception:  # a reply whose sender died cannot be read: its shared tensors went with it
                self._check_alive(wait_s=POLL_S)
                raise
            if isinstance(reply, str):
                raise RuntimeError(f"the async generator process failed:\n{reply}")
            return reply

    def _check_alive(self, wait_s: float = 0.0) -> None:
        """ChildDied when the generator process has ended (waiting up to `wait_s` for an end under way)."""
        self.proc.join(wait_s)
        if not self.proc.is_alive():
            raise ChildDied("async generator process", self.proc.pid, self.proc.exitcode) from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The shared weights' lock; ChildDied when the generator died holding it (killed mid-load)."""
        while not self.lock.acquire(timeout=POLL_S):
            self._check_alive()
        try:
            yield
        finally:
            self.lock.release()

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


@dataclass
class Shared:
    """What the trainer and the generator share: the pushed weights and probe log-probs, the lock the trainer
    holds while it writes them, and the policy version they are."""

    buffers: dict[str, torch.Tensor]
    probe: torch.Tensor
    lock: Any
    version: Any


def serve(setup: GeneratorSetup, shared: Shared, requests: Any, replies: Any) -> None:
    """The generator process: sample every round it is sent until it gets None."""
    processes.die_with_parent()
    if setup.visible_gpus is not None:  # the trainer's processes see only their GPUs; this one only its own
        os.environ["CUDA_VISIBLE_DEVICES"] = setup.visible_gpus
    os.environ.update(setup.env or {})
    for signum in (signal.SIGINT, signal.SIGTERM):  # a stop reaches the whole group: the trainer saves, then ends
        signal.signal(signum, signal.SIG_IGN)  # this process (a trainer killed outright takes it along)
    try:
        with tempfile.TemporaryDirectory(prefix="rlctl-generator-") as folder:
            _serve(setup, shared, requests, replies, folder)
    except Exception:
        replies.put(traceback.format_exc())


def _serve(setup: GeneratorSetup, shared: Shared, requests: Any, replies: Any, folder: str) -> None:
    torch.set_num_threads(setup.threads)
    agent = multiturn.agent_for(setup.rl, setup.tokenizer)
    stops = agent.stop_ids if agent else ()
    side = _VLLM(setup, folder, stops) if setup.llm_args is not None else _Transformers(setup, shared.buffers, stops)
    loaded, mark, gap = -1, torch.zeros(0), None
    while (round_ := requests.get()) is not None:
        start = time.perf_counter()
        with shared.lock:
            if shared.version.value != loaded:
                mark, gap = side.load(shared)
                loaded = shared.version.value
        samples = round_.samples
        side.sample(agent, samples, setup.seed + round_.key)
        replies.put(Done(round_.key, samples, loaded, mark, time.perf_counter() - start, gap, side.name))


class _Transformers:
    """A transformers copy of the policy: samples, then scores what it sampled with the trainer's forward pass."""

    name = "transformers"

    def __init__(self, setup: GeneratorSetup, buffers: dict[str, torch.Tensor], stops: tuple):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from rlctl.rollout.generate import HFGenerator
        from rlctl.rollout.vision import is_vision_model

        self.setup, rl = setup, setup.rl
        dtype = next(iter(buffers.values())).dtype
        auto = AutoModelForImageTextToText if is_vision_model(setup.model_config) else AutoModelForCausalLM
        self.model = auto.from_config(setup.model_config, torch_dtype=dtype).to(setup.device).eval()
        self.engine = HFGenerator(setup.tokenizer, rl.max_new_tokens, rl.temperature, setup.batch_size, stop_ids=stops)
        self.engine.sync(self.model)

    def load(self, shared: Shared) -> tuple[torch.Tensor, None]:
        """Take the pushed weights; the fingerprint of what the model now holds."""
        self.model.load_state_dict(shared.buffers, strict=False)  # a tied head comes once; tie_weights keeps it tied
        self.model.tie_weights()
        return fingerprint((n, p) for n, p in self.model.state_dict().items() if n in shared.buffers), None

    def sample(self, agent: Any, samples: list[Sample], seed: int) -> None:
        setup, tok = self.setup, self.setup.tokenizer
        torch.manual_seed(seed)
        multiturn.sample(agent, self.engine, samples, tok.eos_token_id)
        with torch.no_grad():
            for i in range(0, len(samples), setup.batch_size):
                part = samples[i : i + setup.batch_size]
                lps = token_logprobs(self.model, collate(part, tok.pad_token_id, setup.device), setup.rl.temperature)
                for s, row in zip(part, lps.cpu().tolist(), strict=True):
                    s.rollout_logprobs = row[: len(s.completion_ids)]


class _VLLM:
    """A vLLM engine of the generator's own: samples with its log-probs; each load is checked on the probe text."""

    name = "vllm"

    def __init__(self, setup: GeneratorSetup, folder: str, stops: tuple):
        from rlctl.rollout import vllm

        setup.model_config.save_pretrained(folder)  # what vLLM builds its engine from; the weights come by push
        setup.tokenizer.save_pretrained(folder)
        self.setup = setup
        args = {**(setup.llm_args or {}), "model": folder}
        self.engine = vllm.dedicated(args, setup.tokenizer, setup.rl, stops)

    def load(self, shared: Shared) -> tuple[torch.Tensor, tuple[float, float]]:
        """Take the pushed weights; their fingerprint and the probe's |log-prob difference| (mean, max)."""
        self.engine.load(shared.buffers.items())
        probe = (self.setup.probe or [])[: (self.setup.llm_args or {})["max_model_len"] - 1]  # what the engine holds
        got = torch.tensor(self.engine.probe_logprobs(probe), dtype=torch.float64)
        diff = (got - shared.probe[: len(got)]).abs()
        return fingerprint(shared.buffers.items()), (float(diff.mean()), float(diff.max()))

    def sample(self, agent: Any, samples: list[Sample], seed: int) -> None:
        self.engine.seed(seed)
        multiturn.sample(agent, self.engine, samples, self.setup.tokenizer.eos_token_id)
