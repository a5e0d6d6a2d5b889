"""Worker of tests/test_fsdp2.py: 20 AdamW updates of the RL loop's policy loss (token_logprobs, the ppo
policy loss, the loop's micro-batch weights) on fixed batches of a small random Qwen2 model.

* under torchrun (2 processes): the model sharded by rlctl.trainer.sharding (FSDP2, gloo), each process on its half
  of every batch; a DCP checkpoint after update 10; per-update losses, each process's share of the parameters and
  the gathered final weights written to OUT;
* alone (1 process): the plain model on whole batches; then a fresh model resumes from the 2-process checkpoint
  (DCP reshards 2 -> 1) and runs updates 11-20.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlctl.algorithms import POLICY_LOSSES, PolicyLossConfig, loss_units
from rlctl.rollout.samples import Batch, token_logprobs
from rlctl.trainer import sharding, state

STEPS, SAVED_AT, ROWS, MICRO, PROMPT, TOTAL = 20, 10, 8, 2, 4, 12


def batches() -> list[tuple[Batch, torch.Tensor]]:
    """(batch, advantages) of every update, the same on every process."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(1, 96, (ROWS, TOTAL), generator=gen)
        lengths = torch.randint(1, TOTAL - PROMPT + 1, (ROWS,), generator=gen)
        mask = (torch.arange(TOTAL - PROMPT)[None] < lengths[:, None]).float()
        attn = torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask.long()], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        adv = torch.randn(ROWS, TOTAL - PROMPT, generator=gen)
        out.append((Batch(ids, attn, pos, ids[:, PROMPT:], mask, mask), adv))
    return out


def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    arch = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(arch)


def update(policy, opt, batch: Batch, adv: torch.Tensor, rank: int, world: int) -> float:
    """One optimizer update as the loop makes it; returns the loss over the whole batch (every process)."""
    share = ROWS // world
    rows = slice(rank * share, (rank + 1) * share)
    mine, adv = batch[rows], adv[rows]
    with torch.no_grad():
        old = token_logprobs(policy, mine, 1.0)
    units = mine.mask.sum()
    if world > 1:
        dist.all_reduce(units)
    total = torch.zeros(())
    for i in range(0, share, MICRO):
        b, mk = mine[i : i + MICRO], mine.mask[i : i + MICRO]
        logp = token_logprobs(policy, b, 1.0)
        loss, _ = POLICY_LOSSES["ppo"](logp, old[i : i + MICRO] - 0.1, adv[i : i + MICRO], mk, cfg=PolicyLossConfig())
        weight = loss_units(mk, "token-mean") / units
        (loss * weight * world).backward()
        total += loss.detach() * weight
    if world > 1:
        dist.all_reduce(total)
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(total)


def train(policy, opt, first: int, rank: int, world: int, save: Path | None = None) -> list[float]:
    losses = []
    for step, (batch, adv) in enumerate(batches()[first:], start=first + 1):
        losses.append(update(policy, opt, batch, adv, rank, world))
        if save is not None and step == SAVED_AT:
            state.save_shards(save, {"policy": (policy, opt)})
    return losses


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        policy = sharding.shard(model(), "cpu")
        opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
        losses = train(policy, opt, 0, rank, world, save=out / "ckpt")
        local = sum(p.to_local().numel() for p in policy.parameters())
        (out / f"share{rank}.json").write_text(json.dumps(local))
        weights = sharding.gathered_state_dict(policy, keep=rank == 0)
        if rank == 0:
            (out / "losses.json").write_text(json.dumps(losses))
            torch.save(weights, out / "weights.pt")
        dist.destroy_process_group()
        return
    policy = model()
    losses = train(policy, torch.optim.AdamW(policy.parameters(), lr=3e-3), 0, 0, 1)
    resumed = model()
    opt = torch.optim.AdamW(resumed.parameters(), lr=3e-3)
    state.load_shards(Path(sys.argv[2]) / "ckpt", {"policy": (resumed, opt)})
    after = train(resumed, opt, SAVED_AT, 0, 1)
    (out / "losses.json").write_text(json.dumps({"single": losses, "resumed": after}))
    torch.save({"single": dict(policy.state_dict()), "resumed": dict(resumed.state_dict())}, out / "weights.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
