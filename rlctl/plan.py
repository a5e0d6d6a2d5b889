"""The plan: what `rlctl train` will do, resolved from the config and the hardware, without importing torch.

It fixes each stage's starting point and output, the batch arithmetic per process, the distribution
strategy, the accelerate config and the exact launch command.
"""

from __future__ import annotations

import importlib.util
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlctl import hardware as hw
from rlctl.config import RunConfig
from rlctl.errors import UserError


@dataclass
class StagePlan:
    """One stage: where its weights start, where they land, and its batch arithmetic per process."""

    name: str
    init_from: str
    output: str
    max_steps: int
    batch_size: int
    micro_batch_size: int
    grad_accum: int
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    config: RunConfig
    run_dir: str
    hardware: hw.Hardware
    num_processes: int
    strategy: str
    mixed_precision: str
    adapter: str
    gradient_checkpointing: bool
    generation_engine: str
    stages: list[StagePlan]
    accelerate: dict[str, Any]
    launch: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return shlex.join(self.launch)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "hardware": self.hardware.to_dict(),
            "num_processes": self.num_processes,
            "strategy": self.strategy,
            "mixed_precision": self.mixed_precision,
            "adapter": self.adapter,
            "gradient_checkpointing": self.gradient_checkpointing,
            "generation_engine": self.generation_engine,
            "stages": [asdict(s) for s in self.stages],
            "accelerate": self.accelerate,
            "launch": self.command,
            "warnings": self.warnings,
            "config": self.config.model_dump(mode="json"),
        }


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    return Path(run_dir) / stage


def final_dir(run_dir: str | Path, stage: str) -> Path:
    """Where a finished stage leaves its model."""
    return stage_dir(run_dir, stage) / "final"


def base_model(cfg: RunConfig, run_dir: str | Path) -> str:
    """The starting weights: a Hub id or folder, or the tiny model built into the run directory."""
    if cfg.model.name_or_path == "builtin:tiny":
        return str(Path(run_dir) / "base")
    return cfg.model.name_or_path


DATA_ROLES = ("sft", "preference", "rl", "eval")
DATA_ROLE = {"sft": "sft", "dpo": "preference", "rm": "preference", "rl": "rl"}  # what each stage trains on


def data_paths(cfg: RunConfig, run_dir: str | Path) -> dict[str, Path]:
    """The dataset file of each role the run uses (generated ones live in run_dir/data)."""
    if cfg.data.generate:
        return {role: Path(run_dir) / "data" / f"{role}.jsonl" for role in DATA_ROLES}
    return {role: Path(getattr(cfg.data, role)) for role in DATA_ROLES if getattr(cfg.data, role)}


def missing_data(cfg: RunConfig) -> list[str]:
    """Datasets the selected stages need but the config does not name."""
    if cfg.data.generate:
        return []
    return [
        f"stage '{s}' needs data.{DATA_ROLE[s]} (set --set data.{DATA_ROLE[s]}=FILE or data.generate=arithmetic)"
        for s in cfg.stages
        if getattr(cfg.data, DATA_ROLE[s]) is None
    ]


def _batching(stage: str, batch: int, micro: int | str, procs: int) -> tuple[int, int]:
    """(micro batch per process, gradient accumulation) for a global batch, or a UserError with a fix."""
    if batch % procs:
        raise UserError(
            f"Invalid config: {stage} batch of {batch} sequences does not divide over {procs} processes; "
            f"use a multiple of {procs}, e.g. {max(procs, batch - batch % procs)}."
        )
    per_proc = batch // procs
    if micro == "auto":
        micro = max(d for d in range(1, min(per_proc, 64) + 1) if per_proc % d == 0)
    if per_proc % micro:
        ok = [d for d in range(1, per_proc + 1) if per_proc % d == 0]
        near = min(ok, key=lambda d: abs(d - micro))
        raise UserError(
            f"Invalid config: {stage}.micro_batch_size={micro} does not divide the {per_proc} sequences "
            f"each process handles per step; nearest valid: {stage}.micro_batch_size={near}."
        )
    return micro, per_proc // micro


def _accelerate_config(hardware: hw.Hardware, procs: int, strategy: str, precision: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO" if procs * hardware.nodes == 1 else "MULTI_GPU",
        "num_machines": hardware.nodes,
        "machine_rank": 0,
        "num_processes": procs * hardware.nodes,
        "mixed_precision": precision,
        "use_cpu": hardware.is_cpu,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
    }
    if strategy == "fsdp2":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
        }
    return cfg


def generation_engine(cfg: RunConfig, hardware: hw.Hardware, warnings: list[str]) -> str:
    """`vllm` (colocated, sleep mode) when asked for or installed on a GPU, else `transformers`."""
    if "rl" not in cfg.stages:
        return "none"
    installed = importlib.util.find_spec("vllm") is not None
    if cfg.rl.use_vllm is True:
        if hardware.is_cpu or not installed:
            why = "the plan is for CPU" if hardware.is_cpu else "vllm is not installed (pip install 'rlctl[vllm]')"
            raise UserError(f"Invalid config: rl.use_vllm=true but {why}; set rl.use_vllm=auto.")
        return "vllm"
    if cfg.rl.use_vllm == "auto" and not hardware.is_cpu:
        if installed:
            return "vllm"
        warnings.append("vllm is not installed: RL generation uses plain transformers (pip install 'rlctl[vllm]')")
    return "transformers"


def build(cfg: RunConfig, run_dir: str | Path) -> Plan:
    """The plan for `cfg` in `run_dir`."""
    hardware = hw.resolve(cfg.hardware.spec)
    procs = cfg.hardware.num_processes or max(hardware.gpus_per_node, 1)
    strategy = cfg.hardware.strategy
    if strategy == "auto":
        strategy = "single" if procs * hardware.nodes == 1 else "ddp"
    precision = "no" if hardware.is_cpu or cfg.model.dtype == "float32" else "bf16"
    adapter = "full" if cfg.model.adapter == "auto" else cfg.model.adapter
    checkpointing = cfg.model.gradient_checkpointing
    if checkpointing == "auto":
        checkpointing = not hardware.is_cpu
    world = procs * hardware.nodes
    base = base_model(cfg, run_dir)
    stages: list[StagePlan] = []
    policy = base  # the latest policy: each of sft, dpo, rl starts from the one before it
    for name in cfg.stages:
        sc = getattr(cfg, name)
        batch = cfg.rl.prompts_per_step * cfg.rl.group_size if name == "rl" else sc.batch_size
        if name == "rm":
            init = str(final_dir(run_dir, "sft")) if "sft" in cfg.stages and cfg.rm.init_from == "sft" else base
        else:
            init, policy = policy, str(final_dir(run_dir, name))
        micro, accum = _batching(name, batch, sc.micro_batch_size, world)
        stages.append(StagePlan(name, init, str(final_dir(run_dir, name)), sc.max_steps, batch, micro, accum))
    accel = _accelerate_config(hardware, procs, strategy, precision)
    launch = ["accelerate", "launch", "--config_file", str(Path(run_dir) / "accelerate.yaml")]
    launch += ["-m", "rlctl.runner", str(run_dir)]
    warnings = missing_data(cfg)
    engine = generation_engine(cfg, hardware, warnings)
    if hardware.is_cpu and cfg.model.name_or_path != "builtin:tiny":
        warnings.append("planning for CPU: real models train very slowly without a GPU")
    return Plan(
        cfg,
        str(run_dir),
        hardware,
        procs,
        strategy,
        precision,
        adapter,
        checkpointing,
        engine,
        stages,
        accel,
        launch,
        warnings,
    )
