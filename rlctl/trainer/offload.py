"""The optimizer-state offload between phases: the training-only state (AdamW moments) lives in host RAM outside the
optimizer step when the plan says memory requires it (`plan.phase_offload`), so generation and forward/backward
run without it, as the memory plan assumes.

* `offload_optimizer_state` / `reload_optimizer_state` move it out and back; `Offloaded` keeps where each moved
  tensor lived and the switches so far (bytes, seconds: the layout records, `rlctl.monitors.layout`);
* rlctl's loop calls them around the policy's optimizer step (`rlctl.trainer.loop.optimizer_step`), and
  `release_cached_blocks` before each rollout.

Importing this module is cheap (no torch): torch is imported inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Offloaded:
    """One optimizer's state moved out between phases: where each moved tensor lived ({(id(param), key): device}),
    and the switches so far ({offload|reload: calls, moves, bytes, seconds}, for the layout records)."""

    homes: dict[tuple[int, str], Any] = field(default_factory=dict)
    switches: dict[str, dict[str, float]] = field(default_factory=dict)

    def tally(self, direction: str, moved: int, start: float) -> None:
        """Count one offload or reload call; the bytes and seconds of those that moved something."""
        import time

        entry = self.switches.setdefault(direction, {"calls": 0, "moves": 0, "bytes": 0, "seconds": 0.0})
        entry["calls"] += 1
        if moved:
            entry["moves"] += 1
            entry["bytes"] += moved
            entry["seconds"] += time.perf_counter() - start


def offload_optimizer_state(optimizer: Any, offloaded: Offloaded, device: Any = "cpu") -> int:
    """Move every non-scalar optimizer state tensor (AdamW's exp_avg, exp_avg_sq) to `device`, remembering in
    `offloaded` where it lived; returns the bytes moved. Scalars (`step`) stay. Uses pinned host memory when CUDA
    is up."""
    import time

    import torch

    start = time.perf_counter()
    homes = offloaded.homes
    target = torch.device(device)
    pin = target.type == "cpu" and torch.cuda.is_available()
    moved = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if not torch.is_tensor(value) or value.dim() == 0 or value.device == target:
                    continue
                homes[(id(p), key)] = value.device
                if pin:
                    host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
                    host.copy_(value, non_blocking=True)
                    state[key] = host
                else:
                    state[key] = value.to(target)
                moved += value.numel() * value.element_size()
    if pin:
        torch.cuda.synchronize()
    offloaded.tally("offload", moved, start)
    return moved


def reload_optimizer_state(optimizer: Any, offloaded: Offloaded) -> int:
    """Bring offloaded optimizer state back to where `offloaded` says it lived (the parameter's device when not
    recorded); returns the bytes moved (timed to the end of the copies)."""
    import time

    import torch

    start = time.perf_counter()
    homes = offloaded.homes
    moved = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if not torch.is_tensor(value) or value.dim() == 0:
                    continue
                home = homes.pop((id(p), key), p.device)
                if value.device != torch.device(home):
                    state[key] = value.to(home, non_blocking=True)
                    moved += value.numel() * value.element_size()
    if moved and torch.cuda.is_available():
        torch.cuda.synchronize()  # the optimizer step needs them anyway; the switch's seconds are then real
    offloaded.tally("reload", moved, start)
    return moved


def release_cached_blocks(device: Any) -> None:
    """Give the CUDA caching allocator's free blocks (the training phase's activations, logits, gradients) back to
    the device before generation wakes the engine, so the engine finds them free and the memory probe's next phase
    starts from what is allocated; nothing on CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
