"""The generator engines of asynchronous RL (rl.async_rollout), as the trainer sees them: copies of the policy that
sample rollouts while the trainer updates, one process each (`rlctl.rollout.async_generator`), on this node or
another.

The trainer's main process (`Generators`) opens a listener and a TCPStore (`Link`); every node's first trainer
process starts the engines of its node (`start`), and each engine connects back: rounds of prompts and sampled
rounds travel over an authenticated `multiprocessing.connection` (pickled, never shared memory, so a connection
to another node works alike), the weights over the push's own torch.distributed group (`rlctl.rollout.weight_push`:
gloo broadcasts from the trainer to every engine). Each round is cut into one share per engine, in order; each
share comes back as a `Done` tagged with the policy version that sampled it and a fingerprint of the weights the
engine loaded (a sum per tensor): a push that did not arrive intact stops the run as a broken weight sync. A round
says the oldest version it may be sampled with (`Round.min_version`, the trainer's version when it was sent): an
engine waits for that push before sampling, so the staleness bound holds whatever the network does. Shares are
sampled with seeds of their own, so a round regenerated after a resume (the same prompts, the same weights, the
same engines) is the same.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch

from rlctl.errors import ChildDied, GeneratorFailed
from rlctl.rollout import weight_push
from rlctl.rollout.samples import Sample

POLL_S = 5.0  # how often a wait for an engine checks that it is still alive
CONNECT_S = 900.0  # every engine connects within this (their processes start and import torch first)
CLOSE_S = 30.0  # at the end, how long an engine may take to finish its round and report


@dataclass
class GeneratorSetup:
    """What one engine process builds itself from (picklable)."""

    model_config: Any  # the policy's transformers config
    tokenizer: Any
    rl: Any  # the run's rl section: sampling settings and tools
    device: str  # cpu, or cuda:0 of `visible_gpus`
    visible_gpus: str | None  # the engine's own GPUs (CUDA_VISIBLE_DEVICES, physical ids), None on CPU
    threads: int  # torch CPU threads
    seed: int
    batch_size: int  # rollouts per generate call (transformers)
    llm_args: dict[str, Any] | None = None  # vLLM's engine arguments but `model`; None: transformers samples
    env: dict[str, str] | None = None  # set before the engine loads (vLLM's)
    probe: list[int] | None = None  # vLLM: the probe text's token ids the sync check scores
    index: int = 0  # the engine's number over all nodes
    node: int = 0  # the node it runs on


@dataclass
class AsyncGenerators:
    """The engines of a run, as a node's trainer processes start them: this node's engines' setups, the count
    over all nodes, and the address the engines reach the trainer's main process at."""

    setups: list[GeneratorSetup]  # this node's engines
    engines: int  # over all nodes
    host: str  # the rank-0 node's address (127.0.0.1 on one node)
    nodes: int


@dataclass(frozen=True)
class Link:
    """Where the engines reach the trainer's main process: its listener for rounds, its TCPStore for the push
    group, and the key both ends prove they hold."""

    host: str
    port: int
    store_port: int
    authkey: bytes
    engines: int


@dataclass
class Round:
    """One engine's share of a round of prompts: `key` (the cursor of the round's first prompt) and `share`
    seed its sampling; it is sampled with policy version `min_version` or newer."""

    key: int
    share: int
    samples: list[Sample]
    min_version: int


@dataclass
class Done:
    """A sampled share: the samples with completions and behaviour log-probs, the version that sampled them."""

    key: int
    share: int
    samples: list[Sample]
    version: int
    fingerprint: list[float]
    seconds: float
    probe_gap: tuple[float, float] | None = None  # vLLM: mean, max |log-prob difference| with the trainer's
    engine: str = "transformers"  # what sampled it: transformers or vllm
    pushes: int = 0  # the pushes the engine had received when it sent this share back


@dataclass
class Failure:
    """An engine's exception, as the engine saw it: its type, message, innermost frame and full traceback."""

    kind: str
    message: str
    where: str
    traceback: str


@dataclass
class Tally:
    """What an engine did over the stage, sent when it ends."""

    index: int
    node: int
    host: str
    pid: int
    engine: str
    rounds: int = 0  # shares sampled
    rollouts: int = 0
    pushes: int = 0  # pushes received (the first, at start, included)
    loaded: list[int] = field(default_factory=list)  # the policy versions it loaded into its engine, in order


def fingerprint(weights: Iterable[tuple[str, torch.Tensor]]) -> list[float]:
    """One float64 sum per tensor, in name order: equal weights give equal fingerprints, bit for bit."""
    return [float(t.double().sum()) for _, t in sorted(weights, key=lambda nt: nt[0])]


def send(conn: Connection, obj: Any) -> None:
    """`obj` pickled as plain bytes (tensors by value: the other end may be on another node)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def shares(samples: list[Sample], engines: int) -> list[list[Sample]]:
    """A round cut into one contiguous share per engine, as even as whole samples allow."""
    n = len(samples)
    return [samples[i * n // engines : (i + 1) * n // engines] for i in range(engines)]


def open_link(engines: int, host: str, nodes: int) -> tuple[Link, Listener, Any]:
    """The trainer's main process opens the listener and the push group's TCPStore (free ports); `host`: the
    address other nodes reach it at. One node listens on the loopback only."""
    authkey = secrets.token_bytes(32)
    listener = Listener(("0.0.0.0" if nodes > 1 else "127.0.0.1", 0), authkey=authkey)
    store = weight_push.store(host, 0, engines + 1, is_master=True)
    return Link(host, listener.address[1], store.port, authkey, engines), listener, store


def start(setups: list[GeneratorSetup], link: Link, serve: Callable[[GeneratorSetup, Link], None]) -> list[Any]:
    """Start this node's engine processes, each running `serve` (`rlctl.rollout.async_generator.serve`); spawned
    and daemonic: none outlives the trainer process that started it."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = []
    for setup in setups:
        proc = ctx.Process(target=serve, args=(setup, link), daemon=True, name="rlctl-generator")
        proc.start()
        procs.append(proc)
    return procs


def stop(procs: list[Any], wait_s: float = CLOSE_S) -> None:
    """Wait for this node's engine processes to end (they end when the trainer's main process closes), then kill
    those that did not."""
    deadline = time.monotonic() + wait_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


class Generators:
    """The trainer's main process's side: every engine's connection, the push, the rounds in flight."""

    def __init__(
        self,
        link: Link,
        listener: Listener,
        store: Any,
        local: dict[int, Any],
        weights: Iterable[tuple[str, torch.Tensor]],
        version: int,
        probe: torch.Tensor | None = None,
    ):
        """Accept every engine (`local`: the processes this node started, by engine index, watched while they
        connect), then push `weights` (iterated to the end) as policy version `version`; `probe`: the policy's
        log-probs of the probe text (vLLM)."""
        self.link, self.local, self.store = link, local, store
        self.conns, self.peers = _accept(listener, link.engines, local)
        weights = list(weights)
        layout = weight_push.Layout.of(weights, 0 if probe is None else probe.numel())
        for conn in self.conns:
            send(conn, layout)
        self.sender = weight_push.Sender(self._join_group(store), layout)
        self.fingerprints: dict[int, list[float]] = {}
        self.tallies: list[Tally] = []
        self.push(weights, version, probe)

    def _join_group(self, store: Any) -> Any:
        """The push group, once every engine joined it; an engine that fails or dies first is named (a group
        that cannot form would otherwise wait out its whole timeout)."""
        made: list[Any] = []

        def join() -> None:
            try:
                made.append(weight_push.group(store, 0, self.link.engines + 1))
            except RuntimeError as e:
                made.append(e)

        thread = threading.Thread(target=join, daemon=True, name="rlctl-weight-push-group")
        thread.start()
        while thread.is_alive():
            thread.join(POLL_S)
            self._check_alive()
            for index, conn in enumerate(self.conns):
                if conn.poll(0):
                    self._receive(index)  # an engine says something before the group formed: its failure
        if isinstance(made[0], RuntimeError):
            raise RuntimeError(f"the async generator's weight-push group did not form: {made[0]}") from made[0]
        return made[0]

    def push(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int, probe: torch.Tensor | None = None
    ) -> float:
        """Broadcast the policy's weights (and its probe log-probs) to every engine as `version`; the seconds it
        took. `weights` is iterated to its end (a sharded policy gathers in it, on every process)."""
        start = time.perf_counter()
        try:
            sums = self.sender.send(weights, version, probe)
        except RuntimeError as e:  # an engine left the group: say which
            self._check_alive(wait_s=POLL_S)
            away = [f"{i} (node {node}, pid {pid})" for i, (node, pid) in enumerate(self.peers) if i not in self.local]
            raise ChildDied(f"async generator process of one of engines {', '.join(away)}", None, None) from e
        self.fingerprints = {v: f for v, f in self.fingerprints.items() if v > version - 64}
        self.fingerprints[version] = sums.tolist()
        return time.perf_counter() - start

    def submit(self, key: int, samples: list[Sample], version: int) -> None:
        """Send each engine its share of the round whose first prompt is `key`, to sample with `version` or newer."""
        for i, (conn, share) in enumerate(zip(self.conns, shares(samples, len(self.conns)), strict=True)):
            send(conn, Round(key, i, share, version))

    def receive(self) -> list[Done]:
        """Every engine's share of the oldest round in flight, in engine order; ChildDied when an engine died,
        GeneratorFailed when one failed."""
        return [self._receive(i) for i in range(len(self.conns))]

    def _receive(self, index: int) -> Done:
        conn = self.conns[index]
        while not conn.poll(POLL_S):
            self._check_alive()
        try:
            reply = receive(conn)
        except (EOFError, OSError):
            self._check_alive(wait_s=POLL_S)
            node, pid = self.peers[index]
            raise ChildDied(f"async generator process of engine {index} on node {node}", pid, None) from None
        if isinstance(reply, Failure):
            raise GeneratorFailed(index, reply.kind, reply.message, reply.where)
        return reply

    def _check_alive(self, wait_s: float = 0.0) -> None:
        """ChildDied when one of this node's engine processes has ended (waiting up to `wait_s` for an end under
        way); an engine on another node is known dead when its connection closes."""
        for index, proc in self.local.items():
            proc.join(wait_s)
            if not proc.is_alive():
                raise ChildDied(f"async generator process of engine {index}", proc.pid, proc.exitcode) from None

    def intact(self, done: Done) -> bool:
        """Whether the share was sampled with exactly the weights pushed as its version."""
        pushed = self.fingerprints.get(done.version)
        if pushed is None or len(pushed) != len(done.fingerprint):
            return False
        return torch.allclose(torch.tensor(pushed), torch.tensor(done.fingerprint), rtol=1e-6, atol=1e-6)

    def close(self) -> list[Tally]:
        """End every engine (rounds still in flight are dropped); what each reported doing."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                send(conn, None)
        stopper = threading.Thread(target=self._stop_push, daemon=True)
        stopper.start()
        deadline = time.monotonic() + CLOSE_S
        for conn in self.conns:
            with contextlib.suppress(EOFError, OSError, pickle.UnpicklingError):
                while conn.poll(max(0.0, deadline - time.monotonic())):
                    reply = receive(conn)
                    if isinstance(reply, Tally):
                        self.tallies.append(reply)
                        break
        stopper.join(max(0.0, deadline - time.monotonic()))
        for conn in self.conns:
            conn.close()
        stop(list(self.local.values()), max(0.0, deadline - time.monotonic()))
        return self.tallies

    def _stop_push(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.sender.stop()


def _accept(listener: Listener, engines: int, local: dict[int, Any]) -> tuple[list[Connection], list[tuple[int, int]]]:
    """Every engine's connection and (node, pid), in engine order (each says who it is first); ChildDied when one
    of this node's engines dies first, a RuntimeError when they do not all connect within CONNECT_S."""
    conns: dict[int, Connection] = {}
    peers: dict[int, tuple[int, int]] = {}
    failed: list[BaseException] = []

    def accept() -> None:
        while len(conns) < engines:
            try:
                conn = listener.accept()
                index, node, pid = receive(conn)
                if index in conns or not 0 <= index < engines:
                    raise RuntimeError(f"a second engine {index} connected (node {node}, pid {pid})")
                conns[index], peers[index] = conn, (node, pid)
            except AuthenticationError:  # a peer without the key: not an engine of this run
                continue
            except BaseException as e:  # the listener closed (below)
                failed.append(e)
                return

    thread = threading.Thread(target=accept, daemon=True, name="rlctl-generator-accept")
    thread.start()
    deadline = time.monotonic() + CONNECT_S
    try:
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(POLL_S)
            for index, proc in local.items():
                if index not in conns and not proc.is_alive():
                    raise ChildDied(f"async generator process of engine {index}", proc.pid, proc.exitcode)
    finally:
        listener.close()
    if len(conns) < engines:
        missing = sorted(set(range(engines)) - set(conns))
        why = f" ({failed[0]})" if failed else ""
        raise RuntimeError(
            f"async generator engine(s) {', '.join(map(str, missing))} did not connect to the trainer within "
            f"{CONNECT_S:.0f} s{why}: on several nodes, each node must reach the rank-0 node's address on any port"
        )
    return [conns[i] for i in range(engines)], [peers[i] for i in range(engines)]


def connect(link: Link, index: int, node: int) -> Connection:
    """An engine's connection to the trainer's main process (saying its index, node and pid)."""
    conn = Client((link.host, link.port), authkey=link.authkey)
    send(conn, (index, node, os.getpid()))
    return conn


def hostname() -> str:
    return os.uname().nodename
