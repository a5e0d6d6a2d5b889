"""The async generator's weight push: the trainer's main process broadcasts the policy's weights to every
generator engine over a torch.distributed process group of its own (gloo, TCP), on one node or across nodes.

The group is rank 0 (the trainer's main process, `Sender`) and one rank per engine (`Receiver`), met at a TCPStore
the trainer opens; it is not the trainers' own process group (accelerate's), so the trainers' collectives and the
push never wait on each other. Every push is a header (the policy version; -1 ends the group) and then the weights
as a few flat buckets per dtype (`Layout`), broadcast from rank 0: each engine receives every push, in a thread of
its own, into CPU buffers it loads into its engine between rounds (OpenRLHF's and NeMo-RL's collective push to
every engine, with gloo in place of NCCL so it runs on CPU and across nodes without a GPU path of its own).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

BUCKET_BYTES = 256 * 2**20  # weights travel in flat buckets of at most this (a larger tensor: a bucket of its own)
PREFIX = "rlctl-weight-push"  # the group's keys in the TCPStore
TIMEOUT = datetime.timedelta(minutes=30)  # a collective that waits this long fails (an engine that vanished)


@dataclass(frozen=True)
class Entry:
    """One tensor of the policy: where it lies in its bucket."""

    name: str
    shape: tuple[int, ...]
    bucket: int
    offset: int  # elements into the bucket
    numel: int


@dataclass(frozen=True)
class Layout:
    """How the policy's tensors are packed into flat buckets (the same on both sides of the push)."""

    entries: tuple[Entry, ...]
    buckets: tuple[tuple[str, int], ...]  # (dtype name, elements) of each bucket
    probe: int  # elements of the probe log-probs sent with each push (vLLM's sync check; 0: none)

    @classmethod
    def of(cls, weights: Iterable[tuple[str, torch.Tensor]], probe: int) -> Layout:
        entries, buckets, open_bucket = [], [], {}
        for name, tensor in sorted(weights, key=lambda nt: nt[0]):
            dtype, numel = str(tensor.dtype).removeprefix("torch."), tensor.numel()
            b = open_bucket.get(dtype)
            if b is None or (buckets[b][1] + numel) * tensor.element_size() > BUCKET_BYTES:
                b = open_bucket[dtype] = len(buckets)
                buckets.append((dtype, 0))
            entries.append(Entry(name, tuple(tensor.shape), b, buckets[b][1], numel))
            buckets[b] = (dtype, buckets[b][1] + numel)
        return cls(tuple(entries), tuple(buckets), probe)

    def allocate(self) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Empty flat buckets and each tensor as a view into its bucket."""
        flat = [torch.empty(n, dtype=getattr(torch, dtype)) for dtype, n in self.buckets]
        views = {e.name: flat[e.bucket][e.offset : e.offset + e.numel].view(e.shape) for e in self.entries}
        return flat, views


def store(host: str, port: int, world: int, is_master: bool = False):
    """The TCPStore the push group meets at: the trainer's main process holds it (`is_master`, port 0: a free
    one), every engine connects to it."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world, is_master=is_master, timeout=TIMEOUT, wait_for_workers=False)


def group(at, rank: int, world: int):
    """The push's process group over the store `at`: rank `rank` of `world` (0: the trainer's main process);
    blocks until every rank joined."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, at), rank, world, TIMEOUT)


def _broadcast(pg, tensor: torch.Tensor) -> None:
    pg.broadcast(tensor, 0).wait()


class Sender:
    """Rank 0: broadcasts every push to all engines."""

    def __init__(self, pg, layout: Layout):
        self.pg, self.layout = pg, layout
        self.flat, self.views = layout.allocate()
        self.probe = torch.zeros(layout.probe, dtype=torch.float64)

    def send(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int, probe: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Push `weights` (iterated to the end: a sharded policy gathers in it) as policy `version`; their
        fingerprint (one float64 sum per tensor, in name order)."""
        sums = {}
        for name, tensor in weights:
            self.views[name].copy_(tensor.detach())
            sums[name] = float(tensor.detach().double().sum())
        if probe is not None:
            self.probe.copy_(probe.detach().reshape(-1))
        _broadcast(self.pg, torch.tensor([version], dtype=torch.int64))
        for bucket in self.flat:
            _broadcast(self.pg, bucket)
        if self.layout.probe:
            _broadcast(self.pg, self.probe)
        return torch.tensor([sums[name] for name in sorted(sums)])

    def stop(self) -> None:
        """End the group: every engine's receiving thread returns."""
        _broadcast(self.pg, torch.tensor([-1], dtype=torch.int64))


class Receiver:
    """An engine's side: a thread takes in every push into CPU buffers (under `lock`, which the engine holds
    while it loads them); `version` is the newest complete push, `pushes` how many arrived."""

    def __init__(self, pg, layout: Layout):
        self.pg, self.layout = pg, layout
        self.flat, self.buffers = layout.allocate()
        self.probe = torch.zeros(layout.probe, dtype=torch.float64)
        self.lock = threading.Lock()
        self.arrived = threading.Condition()
        self.version, self.pushes = -1, 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rlctl-weight-push", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        header = torch.zeros(1, dtype=torch.int64)
        try:
            while True:
                _broadcast(self.pg, header)
                version = int(header.item())
                if version < 0:
                    return
                with self.lock:
                    for bucket in self.flat:
                        _broadcast(self.pg, bucket)
                    if self.layout.probe:
                        _broadcast(self.pg, self.probe)
                with self.arrived:
                    self.version, self.pushes = version, self.pushes + 1
                    self.arrived.notify_all()
        except BaseException as e:  # the trainer ended or the group broke: the engine's next wait says so
            with self.arrived:
                self.error = e
                self.arrived.notify_all()

    def wait_for(self, version: int, poll_s: float = 5.0) -> None:
        """Block until push `version` (or a newer one) arrived; a RuntimeError when the pushes stopped."""
        with self.arrived:
            while self.version < version:
                if self.error is not None or not self.thread.is_alive():
                    raise RuntimeError(f"the weight push stopped before policy version {version}: {self.error}")
                self.arrived.wait(poll_s)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
