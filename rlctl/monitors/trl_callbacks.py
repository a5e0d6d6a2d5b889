"""The monitors' side of a TRL trainer (the sft, rm, dpo and kto stages): transformers callbacks that run the
layout check at its first optimizer step (`LayoutCheck`) and tell the memory probe its phase boundaries
(`TrainerPhases`), installed by `follow`. Only the TRL stages import this module: transformers' callback module
pulls in its trainer utilities (peft, bitsandbytes: seconds at import), which a run without a TRL stage never
needs."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from rlctl.monitors import layout
from rlctl.monitors.hooks import Monitors
from rlctl.monitors.memory_probe import Probe


def follow(monitors: Monitors, trainer: Any) -> None:
    """Before a TRL trainer trains: its weights in the plan's precision, the layout check at its first step, and
    the memory probe told of its phase boundaries."""
    follow_plan(monitors.contract, trainer)
    if monitors.probe is not None:
        trainer.add_callback(TrainerPhases(monitors.probe))


def follow_plan(contract: layout.Contract, trainer: Any) -> None:
    """Before a TRL trainer trains: its weights in the plan's precision, and the layout check at its first step.

    Adapters train in fp32, as the plan counts them and as autocast expects master weights: TRL 1.16's trainers
    cast a 4-bit model's trainable weights (LoRA adapters, the reward head) to bf16, and a LoRA reward model's
    head is a trainable copy in the bf16 base's dtype (on CPU, where 4-bit layers compute in fp32, a bf16 reward
    head would not even multiply with its fp32 input)."""
    if contract.plan.adapter != "full":
        import torch

        for param in trainer.model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
    trainer.add_callback(LayoutCheck(contract, trainer))


class LayoutCheck(TrainerCallback):
    """`check` at the end of a TRL trainer's first optimizer step (the optimizer state exists by then), and the
    record's last word when it ends. A TRL stage generates nothing and moves no optimizer state between phases:
    no engine, no offload switches."""

    def __init__(self, contract: layout.Contract, trainer: Any):
        self.contract, self.trainer, self.done = contract, trainer, False

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not self.done:
            self.done = True
            t = self.trainer
            rewards = getattr(t, "reward_funcs", [])
            beside = layout.Beside(t.accelerator.mixed_precision, getattr(t, "ref_model", None), rewards)
            layout.check(self.contract, model, optimizer, None, beside)

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        if self.done and optimizer is not None:
            layout.finish(self.contract, None)


class TrainerPhases(TrainerCallback):
    """TRL trainers' phase boundaries around the optimizer step, and a memory record at each log."""

    def __init__(self, probe: Probe):
        self.probe = probe

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.probe.lap("training")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.probe.lap("optimizer step")

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.probe.flush(state.global_step)
