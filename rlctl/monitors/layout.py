"""What a stage actually runs, read from the live objects, against what its plan said.

After the first optimizer step every process records its layout: the strategy its parameters show (DTensor shards
for FSDP2, several processes for DDP), the adapter (LoRA modules, 4-bit `Linear4bit` base layers and their compute
dtype), trainable and total parameters, parameter and optimizer-state devices and dtypes, gradient checkpointing,
autocast, the models beside the policy (reference: a frozen copy and where it lives, or the adapters switched off;
reward model; critic; the async generator engines whose shares made up a round) with their dtypes, the optimizer
offload between phases, the generation engine and the world size. A value that contradicts the plan stops the
stage with both named (`LayoutMismatch`), so a run never trains something other than what `rlctl plan` promised.
The offload's switches (bytes moved, seconds) are added when the stage ends. The records land in the stage's
`layout/` folder; the runner puts the main process's beside the plan's
values in summary.json. A stage's side of the check is its `Contract`: the plan, the stage's plan and the run
directory the records go to. rlctl's RL loop calls `check` and `finish` through the stage's monitors; a TRL
trainer through its callback (`rlctl.monitors.trl_callbacks.LayoutCheck`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.plan import Plan, StagePlan
from rlctl.rundir import LayoutRecord, RunDir, every_rank, read_record, write_record
from rlctl.runtime.context import Stopped
from rlctl.runtime.models import ModelSource, torch_dtype

NO_OP = "no-op on CPU"  # the plan offloads the optimizer between phases, on a machine where it stays put


class LayoutMismatch(Stopped):
    """The live objects contradict the plan; raised at the stage's first step."""


@dataclass(frozen=True)
class Contract:
    """What the plan promises one stage (`plan`, its config included; `stage`, the stage's own plan), and the run
    directory its layout records go to."""

    plan: Plan
    stage: StagePlan
    run_dir: Path

    @property
    def name(self) -> str:
        return self.stage.name

    def record(self, rank: int) -> Path:
        """Process `rank`'s layout record of this stage."""
        return RunDir(self.run_dir).layout(self.stage.name, rank)


class Beside:
    """What a stage runs beside its policy: autocast (the accelerator's mixed precision), the frozen reference
    copy (None: none, or the adapters switched off), reward models (other reward functions are ignored), critic,
    and the async generator engines whose shares made up a round (None: not async)."""

    def __init__(
        self, autocast: str, reference: Any = None, rewards: Any = (), critic: Any = None, generators: int | None = None
    ):
        import torch

        self.autocast, self.reference, self.critic, self.generators = autocast, reference, critic, generators
        self.rewards = [f for f in rewards if isinstance(f, torch.nn.Module)]


def uses_reference(contract: Contract) -> bool:
    """Whether the stage computes reference log-probs (rl with a KL term, dpo, kto)."""
    name = contract.name
    return name in ("dpo", "kto") or (name == "rl" and contract.plan.config.rl.beta > 0)


def planned(contract: Contract, engine: str | None = None) -> dict[str, Any]:
    """The layout the plan promises this stage (the keys `observed` also reports)."""
    plan = contract.plan
    dtype = plan.config.model.dtype
    frozen = dtype if dtype != "auto" else "bfloat16" if plan.mixed_precision == "bf16" else "float32"
    out: dict[str, Any] = {
        "strategy": contract.stage.strategy or plan.strategy,  # fsdp2 on CPU: some stages run ddp (the plan says which)
        "adapter": plan.adapter,
        "world_size": plan.layout.world_size,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "device": "cpu" if plan.hardware.is_cpu else "cuda",
        "trainable_dtype": dtype if dtype != "auto" and plan.adapter == "full" else "float32",  # adapters: fp32
    }
    if plan.adapter != "full":
        out["frozen_dtype"] = frozen
    if engine is not None:  # async: the generator process's engine
        out["generation_engine"] = plan.async_split.generator_engine if plan.async_split else plan.generation_engine
    return out | _planned_precision(plan) | _planned_beside(contract)


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _planned_precision(plan: Plan) -> dict[str, Any]:
    """Autocast and the 4-bit layers' compute dtype: one decision, the plan's mixed precision."""
    bf16 = plan.mixed_precision == "bf16"
    out: dict[str, Any] = {"autocast": plan.mixed_precision}
    if plan.adapter == "qlora":
        out["linear4bit_compute_dtype"] = "bfloat16" if bf16 else "float32"
    return out


def _planned_beside(contract: Contract) -> dict[str, Any]:
    """The reference (where the plan put it), reward model and critic of this stage, and the optimizer offload."""
    plan, name = contract.plan, contract.name
    out: dict[str, Any] = {}
    rl = plan.config.rl
    source = ModelSource.of(plan, contract.stage)  # the dtypes its models load in
    if name in ("rl", "dpo", "kto") and plan.reference != "unknown":
        out["reference"] = plan.reference if uses_reference(contract) else "none"
        if out["reference"] not in ("none", "adapters-disabled"):
            # rlctl's loop loads it frozen (bf16 under bf16); TRL's trainers build it in the policy's dtype
            out["reference_dtype"] = _name(torch_dtype(source, trainable=name != "rl"))
    if name == "rl":
        if any(r.name == "reward_model" for r in rl.rewards):
            out["reward_model_dtype"] = _name(torch_dtype(source, trainable=False))
        out["critic"] = rl.critic.init is not None
        if plan.async_split is not None:  # the engines that sample each round: the plan's count
            out["generators"] = plan.async_split.engines
        out["phase_offload"] = (NO_OP if plan.hardware.is_cpu else "between phases") if plan.phase_offload else "off"
    return out


def observed(
    model: Any, optimizer: Any = None, engine: str | None = None, switches: dict | None = None
) -> dict[str, Any]:
    """The layout read from `model` (wrapped or not), its optimizer (with the offload `switches` of
    `rlctl.trainer.offload.Offloaded`, None when it never ran) and the process group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    inner = getattr(model, "module", model)  # DDP's wrapper
    classes: Counter[str] = Counter()
    compute: set[str] = set()
    lora = quantized = sharded = 0
    trainable = total = 0
    devices: set[str] = set()
    dtypes = {"trainable": set(), "frozen": set()}
    for module in inner.modules():
        name = type(module).__name__
        own = list(module.parameters(recurse=False))
        if own:
            classes[name] += 1
        if name == "Linear4bit" and type(module).__module__.startswith("bitsandbytes"):
            quantized += 1
            compute.add(_name(module.compute_dtype))
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
    if compute:
        out["linear4bit_compute_dtype"] = "/".join(sorted(compute))
    if optimizer is not None:
        out["optimizer_state"] = _optimizer_state(optimizer)
        out |= offload_record(switches, out["optimizer_state"]["devices"])
    if engine is not None:
        out["generation_engine"] = engine
    return out


def offload_record(switches: dict | None, state_devices: list[str]) -> dict[str, Any]:
    """The optimizer offload between phases as it ran: off (never called), a no-op (called, the state never left
    host RAM), or between phases with the bytes and seconds of each direction per switch that moved something."""
    if not switches:
        return {"phase_offload": "off"}
    moved = sum(s["bytes"] for s in switches.values())
    if not moved and set(state_devices) <= {"cpu"}:
        calls = sum(s["calls"] for s in switches.values())
        return {"phase_offload": NO_OP, "optimizer_switches": {"calls": calls, "bytes_moved": 0}}
    per = {
        direction: {
            "switches": s["moves"],
            "bytes_per_switch": s["bytes"] // max(s["moves"], 1),
            "seconds_per_switch": round(s["seconds"] / max(s["moves"], 1), 6),
        }
        for direction, s in switches.items()
    }
    return {"phase_offload": "between phases", "optimizer_switches": per}


def observed_beside(contract: Contract, policy: Any, beside: Beside) -> dict[str, Any]:
    """Autocast, reference, reward models and critic, read from the live objects."""
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {"autocast": beside.autocast}
    if contract.name in ("rl", "dpo", "kto"):
        ref = getattr(beside.reference, "module", beside.reference)
        if ref is None:
            adapters = hasattr(getattr(policy, "module", policy), "disable_adapter")
            out["reference"] = "adapters-disabled" if uses_reference(contract) and adapters else "none"
        else:
            params = list(ref.parameters())
            sharded = any(isinstance(p, DTensor) for p in params)
            on_gpu = any(p.device.type == "cuda" for p in params)
            offload = "cpu-sharded" if contract.plan.hardware.is_cpu else "cpu-offload"
            out["reference"] = ("gpu-sharded" if on_gpu else offload) if sharded else "gpu" if on_gpu else "cpu"
            out["reference_dtype"] = _dtypes(ref)
    if contract.name == "rl":
        if beside.rewards:
            out["reward_model_dtype"] = "/".join(sorted({_dtypes(m) for m in beside.rewards}))
        out["critic"] = beside.critic is not None
        if beside.generators is not None:
            out["generators"] = beside.generators
        if beside.critic is not None:
            out["critic_dtype"] = _dtypes(beside.critic)
    return out


def _dtypes(model: Any) -> str:
    """The dtypes of a model's parameters (4-bit storage aside)."""
    import torch

    return "/".join(sorted({_name(p.dtype) for p in model.parameters() if p.dtype != torch.uint8}))


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


def check(
    contract: Contract, model: Any, optimizer: Any, engine: str | None, beside: Beside, switches: dict | None = None
) -> LayoutRecord:
    """Record this process's layout and stop the stage when it contradicts the plan."""
    live = observed(model, optimizer, engine, switches) | observed_beside(contract, model, beside)
    if contract.name != "rl":
        live.pop("phase_offload", None)  # only the RL stage offloads between phases
    promised = planned(contract, engine)
    rank = _rank()
    path = contract.record(rank)
    record = LayoutRecord(promised, live, mismatches(promised, live))
    write_record(path, record)
    if record.mismatches:
        raise LayoutMismatch(
            f"Stage {contract.name} does not run the layout its plan chose ({'; '.join(record.mismatches)}). "
            f"Training stopped at its first step on process {rank}; nothing was saved. This is a bug in rlctl or an "
            f"environment that overrides the plan (an accelerate config, environment variables): see {path} and "
            "docs/troubleshooting.md."
        )
    return record


def finish(contract: Contract, switches: dict | None) -> None:
    """When the stage ends: this process's record gets the offload's switches over the whole stage."""
    path = contract.record(_rank())
    if contract.name != "rl" or not path.exists():
        return
    record = read_record(path, LayoutRecord.from_json)
    record.observed.pop("optimizer_switches", None)
    record.observed |= offload_record(switches, record.observed["optimizer_state"]["devices"])
    write_record(path, record)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def read(run_dir: Path, stage: str) -> LayoutRecord | None:
    """The main process's record of `stage`, with how many processes recorded one (for summary.json)."""
    main = RunDir(run_dir).layout(stage)
    files = every_rank(main)
    if not files:
        return None
    record = read_record(main, LayoutRecord.from_json) if main.exists() else LayoutRecord()
    record.processes_recorded = len(files)
    return record
