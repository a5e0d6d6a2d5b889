"""The async generator's weight push (rlctl.rollout.weight_push): a trainer process broadcasts three pushes of
mixed-dtype weights, in buckets, to two engine processes over a gloo group met at a TCPStore; each engine takes in
every push, bit for bit, with the probe log-probs, and a round's shares cut a batch evenly."""

from __future__ import annotations

import multiprocessing as mp

import torch

from rlctl.rollout import async_engine, weight_push

WEIGHTS = {"a.weight": torch.float32, "b.bias": torch.bfloat16, "c.weight": torch.float32}
SHAPES = {"a.weight": (3, 4), "b.bias": (5,), "c.weight": (7, 2)}


def _weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of WEIGHTS holding 0, 1, 2, ... plus `version`."""
    out = []
    for name, dtype in WEIGHTS.items():
        shape = SHAPES[name]
        out.append((name, (torch.arange(torch.Size(shape).numel()).reshape(shape) + version).to(dtype)))
    return out


def _engine(port: int, rank: int, world: int, layout: weight_push.Layout, out) -> None:
    pushes = weight_push.Receiver(weight_push.group(weight_push.store("127.0.0.1", port, world), rank, world), layout)
    seen = []
    for version in (0, 1, 2):
        pushes.wait_for(version)
        with pushes.lock:
            seen.append((pushes.version, async_engine.fingerprint(pushes.buffers.items()), pushes.probe.tolist()))
    pushes.join(60)
    out.put((rank, seen, pushes.pushes, pushes.thread.is_alive()))


def test_every_engine_takes_in_every_push_bit_for_bit():
    layout = weight_push.Layout.of(_weights(0), probe=4)
    assert [dtype for dtype, _ in layout.buckets] == ["float32", "bfloat16"]  # one bucket per dtype here
    store = weight_push.store("127.0.0.1", 0, 3, is_master=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_engine, args=(store.port, r, 3, layout, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        sender = weight_push.Sender(weight_push.group(store, 0, 3), layout)
        sent = []
        for version in (0, 1, 2):
            probe = torch.full((4,), -float(version), dtype=torch.float64)
            sent.append(sender.send(_weights(version), version, probe).tolist())
        sender.stop()
        got = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert sent[1] == async_engine.fingerprint(_weights(1))
    for rank, seen, pushes, alive in got:
        assert pushes == 3 and not alive, rank
        versions = [v for v, _, _ in seen]
        assert versions == sorted(versions) and versions[-1] == 2
        for version, sums, probe in seen:
            assert sums == sent[version] and probe == [-float(version)] * 4, (rank, version)


def test_a_round_is_cut_into_even_contiguous_shares():
    samples = list(range(10))
    assert async_engine.shares(samples, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert async_engine.shares(samples, 1) == [samples]
