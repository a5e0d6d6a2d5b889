"""What a stage actually runs, read from the live objects, against what its plan said.

After the first optimizer step every process records its layout: the strategy its parameters show (DTensor shards
for FSDP2, several processes for DDP), the adapter (LoRA modules, 4-bit `Linear4bit` base layers), trainable and
total parameters, parameter and optimizer-state devices and dtypes, gradient checkpointing, the generation engine
and the world size. A value that contradicts the plan stops the stage with both named (`LayoutMismatch`), so a
run never trains something other than what `rlctl plan` promised. The records land in the stage's `layout/`
folder; the runner puts the main process's beside the plan's values in summary.json.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rlctl import checkpoint
from rlctl.stages import memory_probe
from rlctl.stages.context import StageContext, Stopped


class LayoutMismatch(Stopped):
    """The live objects contradict the plan; raised at the stage's first step."""


def follow_plan(ctx: StageContext, trainer: Any) -> None:
    """Before a TRL trainer trains: its weights in the plan's precision, and the layout check at its first step.

    QLoRA: TRL 1.16's trainers cast a 4-bit model's trainable weights (LoRA adapters, the reward head) to bf16;
    rlctl keeps them in fp32, as the plan counts them and as autocast expects master weights (on CPU, where the
    4-bit layers compute in fp32, a bf16 reward head would not even multiply with its fp32 input). The memory
    probe learns the trainer's phase boundaries here too."""
    if ctx.plan.adapter == "qlora":
        import torch

        for param in trainer.model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
    trainer.add_callback(LayoutCheck(ctx, trainer))
    memory_probe.install(trainer)


class LayoutCheck(TrainerCallback):
    """`check` at the end of a TRL trainer's first optimizer step (the optimizer state exists by then)."""

    def __init__(self, ctx: StageContext, trainer: Any = None):
        self.ctx, self.done = ctx, False
        self.engine = None
        if trainer is not None and ctx.stage.name == "rl":
            self.engine = "vllm" if getattr(trainer, "use_vllm", False) else "transformers"

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not self.done:
            self.done = True
            check(self.ctx, model, optimizer, self.engine)


def planned(ctx: StageContext, engine: str | None = None) -> dict[str, Any]:
    """The layout the plan promises this stage (the keys `observed` also reports)."""
    plan, dtype = ctx.plan, ctx.cfg.model.dtype
    frozen = dtype if dtype != "auto" else "bfloat16" if plan.mixed_precision == "bf16" else "float32"
    out: dict[str, Any] = {
        "strategy": ctx.stage.strategy or plan.strategy,  # fsdp2 on CPU: some stages run ddp (the plan says which)
        "adapter": plan.adapter,
        "world_size": plan.layout.get("world_size", plan.num_processes),
        "gradient_checkpointing": plan.gradient_checkpointing,
        "device": "cpu" if plan.hardware.is_cpu else "cuda",
        "trainable_dtype": dtype if dtype != "auto" else "float32",
    }
    if plan.adapter != "full":
        out["frozen_dtype"] = frozen
    if engine is not None:
        out["generation_engine"] = plan.generation_engine
    return out


def observed(model: Any, optimizer: Any = None, engine: str | None = None) -> dict[str, Any]:
    """The layout read from `model` (wrapped or not), its optimizer and the process group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    inner = getattr(model, "module", model)  # DDP's wrapper
    classes: Counter[str] = Counter()
    lora = quantized = sharded = 0
    trainable = total = 0
    devices: set[str] = set()
    dtypes = {"trainable": set(), "frozen": set()}
    for module in inner.modules():
        name = type(module).__name__
        own = list(module.parameters(recurse=False))
        if own:
            classes[name] += 1
        quantized += name == "Linear4bit" and type(module).__module__.startswith("bitsandbytes")
        lora += hasattr(module, "lora_A") and bool(getattr(module, "lora_A", None))
    for p in inner.parameters():
        sharded += isinstance(p, DTensor)
        n = p.numel() * (2 if p.dtype == torch.uint8 else 1)  # two NF4 values per stored byte
        total += n
        trainable += n if p.requires_grad else 0
        devices.add(p.device.type)
        if p.dtype != torch.uint8:
            dtypes["trainable" if p.requires_grad else "frozen"].add(str(p.dtype).removeprefix("torch."))
    strategy = "fsdp2" if sharded else "ddp" if world > 1 else "single"
    out: dict[str, Any] = {
        "strategy": strategy,
        "adapter": "qlora" if quantized and lora else "lora" if lora else "full",
        "world_size": world,
        "gradient_checkpointing": bool(_checkpointing(inner)),
        "device": "cuda" if "cuda" in devices else "cpu",
        "trainable_dtype": "/".join(sorted(dtypes["trainable"])),
        "frozen_dtype": "/".join(sorted(dtypes["frozen"])),
        "parameter_classes": dict(classes.most_common()),
        "lora_modules": lora,
        "linear4bit_modules": quantized,
        "dtensor_parameters": sharded,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "parameter_devices": sorted(devices),
    }
    if optimizer is not None:
        out["optimizer_state"] = _optimizer_state(optimizer)
    if engine is not None:
        out["generation_engine"] = engine
    return out


def _checkpointing(model: Any) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "is_gradient_checkpointing", False)


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    devices, dtypes, size = set(), set(), 0
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim() > 0:
                devices.add(value.device.type)
                dtypes.add(str(value.dtype).removeprefix("torch."))
                local = value.to_local() if isinstance(value, DTensor) else value  # this process's shard
                size += local.numel() * local.element_size()
    return {"devices": sorted(devices), "dtypes": sorted(dtypes), "bytes": size}


def mismatches(plan_side: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """`key: planned X, observed Y` for every planned value the live objects contradict."""
    out = []
    for key, want in plan_side.items():
        got = live.get(key)
        if key == "frozen_dtype" and live.get("adapter") == "qlora" and got in ("", want):
            continue  # a QLoRA base is NF4 but for its norms and embeddings
        if got != want:
            out.append(f"{key}: planned {want}, observed {got}")
    return out


def check(ctx: StageContext, model: Any, optimizer: Any = None, engine: str | None = None) -> dict[str, Any]:
    """Record this process's layout and stop the stage when it contradicts the plan."""
    live = observed(model, optimizer, engine)
    promised = planned(ctx, engine)
    rank = _rank()
    folder = ctx.run_dir / ctx.stage.name / "layout"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"planned": promised, "observed": live, "mismatches": mismatches(promised, live)}
    checkpoint.write_json_atomic(folder / f"rank{rank}.json", record)
    if record["mismatches"]:
        raise LayoutMismatch(
            f"Stage {ctx.stage.name} does not run the layout its plan chose ({'; '.join(record['mismatches'])}). "
            f"Training stopped at its first step on process {rank}; nothing was saved. This is a bug in rlctl or an "
            f"environment that overrides the plan (an accelerate config, environment variables): see "
            f"{folder / f'rank{rank}.json'} and docs/troubleshooting.md."
        )
    return record


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def read(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """The main process's record of `stage`, with how many processes recorded one (for summary.json)."""
    folder = run_dir / stage / "layout"
    files = sorted(folder.glob("rank*.json")) if folder.is_dir() else []
    if not files:
        return None
    main = json.loads((folder / "rank0.json").read_text()) if (folder / "rank0.json").exists() else {}
    return {**main, "processes_recorded": len(files)}
