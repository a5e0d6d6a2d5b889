"""The plan: what `rlctl train` will do, resolved from the config and the hardware, without importing torch.

It fixes each stage's starting point and output, the batch arithmetic per process, the distribution
strategy, the accelerate config and the exact launch command. The memory planner (`rlctl.plan.memory`) chooses
what the user left on auto (strategy, adapter, gradient checkpointing, micro-batches, offload, the vLLM
fraction and tensor parallel size) and refuses, with the nearest plan that fits, when nothing fits.

Planning is a sequence of steps, each taking typed facts and returning a typed result with what it has to say
(`parts.Noted`): `facts` (hardware, epochs, embeddings, architecture, precision, engine), then in `build_from` the
async split, the batch sizes, the memory per phase (`memory.settings`), each stage's strategy and the assembled
`Plan`. `rlctl train` takes the facts before its pre-flight and builds the plan once, for the data's lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config import RunConfig
from rlctl.data.images import ImageBudget
from rlctl.errors import UserError
from rlctl.plan import arch as model_arch
from rlctl.plan import data_lengths, epochs, gguf, packages, strategies
from rlctl.plan import engine as engine_mod
from rlctl.plan import hardware as hw
from rlctl.plan.memory import settings as memory_settings
from rlctl.plan.parts import (
    Decision,
    GenerationSettings,
    Layout,
    MemoryTable,
    ModelFacts,
    Noted,
    VllmSettings,
)
from rlctl.plan.resolved import Plan, StagePlan
from rlctl.rundir import RunDir

if TYPE_CHECKING:
    from rlctl.plan.async_split import AsyncSplit


POLICY_STAGES = ("rl", "dpo", "sft")  # latest first: the policy a run ends with


def final_gone(run_dir: Path, stage: str) -> UserError:
    """A finished stage's final folder is gone: the error naming the way out (`rlctl resume` re-creates it)."""
    return UserError(
        f"{run_dir}: stage {stage} finished, but its final folder {RunDir(run_dir).final(stage)} is gone (deleted or "
        f"moved). `rlctl resume {run_dir}` re-creates it from the stage's last complete checkpoint (`rlctl verify "
        f"{run_dir}` lists them); then run this command again."
    )


def final_policy(run_dir: Path, cfg: RunConfig, completed: list[str]) -> tuple[str, Path]:
    """(stage, folder) of the last policy stage that finished; final_gone when its final folder is missing (an
    earlier stage's model is never taken instead)."""
    for stage in POLICY_STAGES:
        folder = RunDir(run_dir).final(stage)
        if stage in cfg.stages and stage in completed:
            if not folder.is_dir():
                raise final_gone(run_dir, stage)
            return stage, folder
    raise UserError(
        f"{run_dir} has no finished policy stage to export (finished: {', '.join(completed) or 'none'}). "
        f"Finish it with `rlctl resume {run_dir}`."
    )


def base_model(cfg: RunConfig, run_dir: str | Path) -> str:
    """The starting weights: a Hub id or folder, or the tiny model built into the run directory."""
    if cfg.model.name_or_path in model_arch.BUILTIN_MODELS:
        return str(RunDir(Path(run_dir)).base)
    return cfg.model.name_or_path


DATA_ROLES = ("sft", "preference", "rl", "eval")
DATA_ROLE = epochs.DATA_ROLE  # what each stage trains on


def data_paths(cfg: RunConfig, run_dir: str | Path) -> dict[str, Path]:
    """The dataset file of each role the run uses (generated ones live in run_dir/data)."""
    if cfg.data.generate:
        return {role: RunDir(Path(run_dir)).data_file(role) for role in DATA_ROLES}
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
    size = max(d for d in range(1, min(per_proc, 64) + 1) if per_proc % d == 0) if micro == "auto" else int(micro)
    if per_proc % size:
        ok = [d for d in range(1, per_proc + 1) if per_proc % d == 0]
        near = min(ok, key=lambda d: abs(d - size))
        raise UserError(
            f"Invalid config: {stage}.micro_batch_size={size} does not divide the {per_proc} sequences "
            f"each process handles per step; nearest valid: {stage}.micro_batch_size={near}."
        )
    return size, per_proc // size


def _accelerate_config(
    hardware: hw.Hardware,
    procs: int,
    strategy: str,
    precision: str,
    cpu_offload: bool = False,
    node_rank: int = 0,
    main: tuple[str | None, int] = (None, 29500),
    gpu_ids: tuple[int, ...] | None = None,
    elastic: bool = False,
) -> dict[str, Any]:
    """accelerate's config: `num_processes` counts every process of every node; a multi-node run adds this
    node's rank and the rank-0 node's address (torch.distributed static rendezvous, or c10d when `elastic`: the
    address is then torchrun's rendezvous endpoint, which accelerate passes only with same_network off); `gpu_ids`
    (async RL) the GPUs of each node the processes run on (accelerate sets CUDA_VISIBLE_DEVICES to them)."""
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO" if procs * hardware.nodes == 1 else "MULTI_GPU",
        "num_machines": hardware.nodes,
        "machine_rank": node_rank,
        "num_processes": procs * hardware.nodes,
    }
    if gpu_ids is not None:
        cfg["gpu_ids"] = ",".join(map(str, gpu_ids))
    if hardware.nodes > 1:
        cfg["main_process_ip"], cfg["main_process_port"] = main
    cfg |= {
        "mixed_precision": precision,
        "use_cpu": hardware.is_cpu,
        "rdzv_backend": "c10d" if elastic and hardware.nodes > 1 else "static",
        "same_network": not (elastic and hardware.nodes > 1),
        "main_training_function": "main",
    }
    if strategy == "fsdp2" and not hardware.is_cpu:  # on CPU rlctl shards its stages itself (stage_strategies)
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": cpu_offload,
        }
    return cfg


def precision_for(cfg: RunConfig, hardware: hw.Hardware) -> Noted[str]:
    """bf16 mixed precision on GPUs that have it, else float32 ("no")."""
    if hardware.is_cpu or cfg.model.dtype == "float32":
        return Noted("no")
    if not hardware.bf16:
        why = f"{hardware.gpu_name} (compute capability {hardware.compute_capability}) has no bf16: training in float32"
        return Noted("no", (why,))
    return Noted("bf16")


def _nodes(cfg: RunConfig, hardware: hw.Hardware) -> hw.Hardware:
    """The hardware with `hardware.nodes` applied (it must agree with an MxN spec), node_rank checked."""
    nodes, rank = cfg.hardware.nodes, cfg.hardware.node_rank
    if nodes is not None and nodes != hardware.nodes:
        if hardware.nodes > 1:
            raise UserError(
                f"Invalid config: hardware.nodes={nodes} contradicts the hardware spec {hardware.spec} "
                f"({hardware.nodes} nodes); drop --nodes or use --hardware {nodes}x"
                f"{hardware.spec.split('x', 1)[1]}."
            )
        hardware = replace(hardware, nodes=nodes)
    if rank >= hardware.nodes:
        raise UserError(
            f"Invalid config: hardware.node_rank={rank} is out of range: a {hardware.nodes}-node run has node "
            f"ranks 0 to {hardware.nodes - 1} (--node-rank R, one per machine, 0 on the one at --main-address)."
        )
    return hardware


def launch_command(run_dir: str | Path, hardware: hw.Hardware, cfg: RunConfig) -> list[str]:
    """`accelerate launch ... -m rlctl.launch.runner RUN`; on several nodes this node's rank and the rank-0 address are
    on the command line too (they win over the shared accelerate.yaml, so a requeued job can move)."""
    launch = ["accelerate", "launch", "--config_file", str(RunDir(Path(run_dir)).accelerate)]
    if hardware.nodes > 1:
        launch += ["--num_machines", str(hardware.nodes), "--machine_rank", str(cfg.hardware.node_rank)]
        if cfg.hardware.main_address:
            launch += ["--main_process_ip", cfg.hardware.main_address]
        launch += ["--main_process_port", str(cfg.hardware.main_port)]
    if cfg.hardware.max_restarts:  # torchrun's elastic agent restarts the processes; c10d waits for lost nodes
        launch += ["--max_restarts", str(cfg.hardware.max_restarts)]
        if hardware.nodes > 1:  # on the command line: accelerate's own default (static) wins over its config file
            # the rank-0 node hosts the c10d store (two nodes whose address resolves to themselves would both try)
            host = int(cfg.hardware.node_rank == 0)
            conf = f"join_timeout={cfg.hardware.rendezvous_timeout_s},is_host={host}"
            launch += ["--rdzv_backend", "c10d", "--rdzv_conf", conf]
    return [*launch, "-m", "rlctl.launch.runner", str(run_dir)]


def layout(hardware: hw.Hardware, procs: int, cfg: RunConfig) -> Layout:
    """Where the processes run: nodes x processes per node, this node's rank and the rendezvous address."""
    main = f"{cfg.hardware.main_address}:{cfg.hardware.main_port}" if cfg.hardware.main_address else None
    return Layout(
        nodes=hardware.nodes,
        gpus_per_node=hardware.gpus_per_node,
        processes_per_node=procs,
        world_size=procs * hardware.nodes,
        node_rank=cfg.hardware.node_rank,
        main=main if hardware.nodes > 1 else None,
    )


@dataclass(frozen=True)
class Facts:
    """What a plan is decided from, before any memory is planned: the config as the plan resolves it (epochs into
    steps, embeddings beside adapters, the model's architecture), the hardware, the processes per node, the
    precision and the generation engine, and what those steps said."""

    cfg: RunConfig
    run_dir: str
    hardware: hw.Hardware
    procs: int
    precision: str
    engine: str
    arch_source: str
    model_import: gguf.GgufImport | None
    warnings: tuple[str, ...]  # missing data, the architecture, the precision, the engine
    epochs: tuple[Decision, ...]
    embeddings: tuple[Decision, ...]  # shown when adapters train


@dataclass(frozen=True)
class Batch:
    """One stage's batch arithmetic: sequences per optimizer step over all processes, the micro-batch per process
    and the gradient accumulation."""

    size: int
    micro: int
    accumulation: int

    def with_micro(self, micro: int) -> Batch:
        """The same batch per process in micro-batches of `micro`."""
        return Batch(self.size, micro, self.micro * self.accumulation // micro)


def facts(cfg: RunConfig, run_dir: str | Path) -> Facts:
    """The facts `cfg` plans from in `run_dir`; `cfg` is left as given. Cheap: no memory is planned, so `rlctl
    train` can take the precision and a GGUF import from here before the pre-flight counts the data's lengths."""
    hardware = _nodes(cfg, hw.resolve(cfg.hardware.spec))
    by_epochs = epochs.resolve(cfg.model_copy(deep=True))
    embeddings = strategies.embeddings_for_adapters(by_epochs.value)
    arch = model_arch.resolve(embeddings.value)
    cfg, arch_source = arch.value
    precision = precision_for(cfg, hardware)
    engine = engine_mod.choose(cfg, hardware, detected=cfg.hardware.spec == "auto")
    model_import = gguf.plan_import(cfg.model, precision.value == "bf16")[0] if gguf.is_gguf(cfg.model) else None
    return Facts(
        cfg,
        str(run_dir),
        hardware,
        cfg.hardware.num_processes or max(hardware.gpus_per_node, 1),
        precision.value,
        engine.value,
        arch_source,
        model_import,
        (*missing_data(cfg), *arch.warnings, *precision.warnings, *engine.warnings),
        by_epochs.decisions,
        embeddings.decisions,
    )


def build(
    cfg: RunConfig, run_dir: str | Path, prompt_tokens: int | None = None, lengths: dict[str, int] | None = None
) -> Plan:
    """The plan for `cfg` in `run_dir`; a UserError (exit 2) when no plan fits the hardware. `lengths`: the data's
    counted lengths by stage (see LENGTH_KEYS), `prompt_tokens` its longest RL prompt alone, as the pre-flight
    counted them (else what the run directory recorded, else unknown: the configured limits). `cfg` is left as
    given: what the plan resolves (epochs into steps, embeddings, architecture) is in `Plan.config`."""
    given = lengths if prompt_tokens is None else {**(lengths or {}), "rl": prompt_tokens}
    return build_from(facts(cfg, run_dir), given)


def build_from(f: Facts, lengths: dict[str, int] | None = None, images: dict[str, ImageBudget] | None = None) -> Plan:
    """The plan from its facts: the async split, the batch sizes, the memory per phase, each stage's strategy and
    starting point, the accelerate config and the launch command, with what each step said. `lengths` and a
    vision-language run's `images` (its image tokens per row, by stage) as the pre-flight counted them in the data,
    else as the run directory recorded them, else the limits (the worst case of max_pixels)."""
    cfg, hardware = f.cfg, f.hardware
    sizes: dict[str, int] = {name: _global_batch(cfg, name) for name in cfg.stages}
    budgets = data_lengths.image_budgets(cfg, f.run_dir, images)
    image_tokens = {stage: b.tokens_per_row for stage, b in budgets.items()}
    split = _split(f, list(sizes.values()), image_tokens.get("rl", 0))
    procs = split.value.trainer_gpus if split.value is not None and split.value.trainer_gpus else f.procs
    configured = batch_sizes(cfg, sizes, procs * hardware.nodes)
    fitted = data_lengths.as_long_as_the_data(cfg, data_lengths.data_lengths_of(f.run_dir, lengths))
    trainers = memory_settings.Trainers(
        cfg, fitted.value, hardware, procs, f.engine, f.precision, f.run_dir, image_tokens
    )
    mem = memory_settings.plan(trainers, split.value)
    batches = {name: b.with_micro(mem.micro.get(name, b.micro)) for name, b in configured.items()}
    async_split, vllm, generation = _async_sides(split.value, mem.table, mem.vllm, mem.generation)
    per_stage = strategies.stage_strategies(cfg, hardware, mem.strategy)
    warnings = (*f.warnings, *split.warnings, *mem.warnings, *per_stage.warnings)
    warnings += _package_warnings(f, mem.adapter, warnings)
    embeddings = f.embeddings if mem.adapter in ("lora", "qlora") else ()
    said = (*mem.decisions, *([async_split.decision()] if async_split else []), *f.epochs, *fitted.decisions)
    said += tuple(
        {"setting": f"{stage} image tokens per row (memory)", "value": str(b.tokens_per_row), "why": b.describe()}
        for stage, b in budgets.items()
    )
    plan = _assemble(f, procs, mem, stage_plans(f, batches, per_stage.value), async_split)
    decisions = [*said, *embeddings, *per_stage.decisions]
    warnings = (*warnings, *plan.warnings)
    return replace(plan, vllm=vllm, generation=generation, warnings=list(warnings), decisions=decisions, images=budgets)


def _assemble(
    f: Facts, procs: int, mem: memory_settings.Memory, stages: list[StagePlan], split: AsyncSplit | None
) -> Plan:
    """The Plan of the decided settings: with the accelerate config, the launch command and the layout, warning
    what the launch needs beyond them."""
    cfg, hardware = f.cfg, f.hardware
    gpu_ids = split.trainer_gpu_ids if split is not None and split.on_gpus else None
    main = (cfg.hardware.main_address, cfg.hardware.main_port)
    if cfg.hardware.max_restarts and procs * hardware.nodes == 1:
        raise UserError(
            f"Invalid config: hardware.max_restarts={cfg.hardware.max_restarts} needs torchrun's elastic agent, which "
            "runs only when the plan has several processes (hardware.num_processes > 1 or several nodes); a "
            "one-process run resumes with `rlctl resume` instead. Drop hardware.max_restarts."
        )
    accel = _accelerate_config(
        hardware,
        procs,
        mem.strategy,
        f.precision,
        mem.cpu_offload,
        cfg.hardware.node_rank,
        main,
        gpu_ids,
        elastic=cfg.hardware.max_restarts > 0,
    )
    return Plan(
        cfg,
        f.run_dir,
        hardware,
        procs,
        mem.strategy,
        f.precision,
        mem.adapter,
        mem.checkpointing,
        f.engine,
        stages,
        accel,
        launch_command(f.run_dir, hardware, cfg),
        layout(hardware, procs, cfg),
        model_facts(cfg, f.arch_source),
        _launch_warnings(cfg, hardware),
        cpu_offload=mem.cpu_offload,
        phase_offload=mem.phase_offload,
        reference=mem.reference,
        memory=mem.table,
        model_import=f.model_import,
        async_split=split,
    )


def _package_warnings(f: Facts, adapter: str, said: tuple[str, ...]) -> tuple[str, ...]:
    """The packages the layout needs and this machine lacks: a refusal where the plan runs, else warnings."""
    vllm_forced = f.engine == "vllm" and f.cfg.rl.use_vllm is True
    here = f.hardware.is_cpu or hw.has_local_gpu()
    trackers = list(f.cfg.logging.report_to)
    return packages.check_layout(adapter, vllm_forced, f.hardware.is_cpu, trackers, here, said)


def _split(f: Facts, global_batches: list[int], image_tokens: int) -> Noted[AsyncSplit | None]:
    """An async RL run's split of the devices between the trainer processes and the generator (its prompts
    `image_tokens` longer for a vision-language run), or None."""
    cfg = f.cfg
    if "rl" not in cfg.stages or not cfg.rl.async_rollout.enabled:
        return Noted(None)
    from rlctl.plan import async_split  # loaded for async runs only: `rlctl plan` stays fast

    split = async_split.split(cfg, f.hardware, f.procs, f.engine, global_batches, image_tokens)
    others = [name for name in cfg.stages if name != "rl"]
    warnings = []
    if split.on_gpus and others:
        warnings.append(
            f"rl.async_rollout: {', '.join(others)} train on the trainer GPUs "
            f"({async_split.ids(split.trainer_gpu_ids)}) too, one launch runs every stage; run them without "
            "async (or as a run of their own) to use every GPU"
        )
    return Noted(split, tuple(warnings))


def batch_sizes(cfg: RunConfig, sizes: dict[str, int], world: int) -> dict[str, Batch]:
    """Each stage's configured batch arithmetic over `world` processes (a UserError with a fix when it does not
    divide)."""
    return {
        name: Batch(size, *_batching(name, size, getattr(cfg, name).micro_batch_size, world))
        for name, size in sizes.items()
    }


def stage_plans(f: Facts, batches: dict[str, Batch], strategies_by_stage: dict[str, str]) -> list[StagePlan]:
    """Each stage's starting point, output and batches: sft, dpo, kto and rl each start from the policy before it,
    rm from sft's (rm.init_from=sft) or the base model."""
    cfg, run = f.cfg, RunDir(Path(f.run_dir))
    base = f.model_import.folder if f.model_import else base_model(cfg, f.run_dir)
    stages: list[StagePlan] = []
    policy = base  # the latest policy: each of sft, dpo, kto, rl starts from the one before it
    for name in cfg.stages:
        sc = getattr(cfg, name)
        if name == "rm":
            init = str(run.final("sft")) if "sft" in cfg.stages and cfg.rm.init_from == "sft" else base
        else:
            init, policy = policy, str(run.final(name))
        b = batches[name]
        out = str(run.final(name))
        strategy = strategies_by_stage[name]
        steps = cfg.rl.total_steps if name == "rl" else sc.max_steps  # rl: value pretraining's steps included
        plan = StagePlan(name, init, out, steps, b.size, b.micro, b.accumulation, strategy=strategy, epochs=sc.epochs)
        stages.append(plan)
    return stages


def _launch_warnings(cfg: RunConfig, hardware: hw.Hardware) -> list[str]:
    """What the launch needs beyond the plan: the rank-0 address of a multi-node run, a GPU for a real model."""
    out = []
    if hardware.nodes > 1 and not cfg.hardware.main_address:
        out.append(
            f"{hardware.nodes} nodes: every node needs --main-address HOST[:PORT] of the rank-0 node and its own "
            "--node-rank to launch (rlctl slurm fills both in)"
        )
    if hardware.is_cpu and cfg.model.name_or_path not in model_arch.BUILTIN_MODELS:
        out.append("planning for CPU: real models train very slowly without a GPU")
    return out


def _global_batch(cfg: RunConfig, stage: str) -> int:
    """Sequences per optimizer step of `stage` over all processes (RL: prompts x completions per prompt)."""
    return cfg.rl.prompts_per_step * cfg.rl.group_size if stage == "rl" else getattr(cfg, stage).batch_size


def _async_sides(
    split: AsyncSplit | None,
    memory_table: MemoryTable | None,
    vllm: VllmSettings | None,
    generation: GenerationSettings | None,
) -> tuple[AsyncSplit | None, VllmSettings | None, GenerationSettings | None]:
    """An async run's split with the trainer side's planned peak, and the plan's vllm / generation sections: on
    GPUs those of the generator's engines (the trainer GPUs hold none), on CPU (and without a split) as planned."""
    if split is None or not split.on_gpus:
        return split, vllm, generation
    split = replace(split, trainer_gib_per_gpu=memory_table.peak_gib if memory_table else None)
    if split.generator_engine == "vllm":
        return split, split.vllm_settings(), None
    return split, None, split.transformers_settings()


def model_facts(cfg: RunConfig, arch_source: str) -> ModelFacts:
    """The model the plan is for: its parameter count and architecture, and where those numbers came from."""
    arch = cfg.model.arch
    if arch is None:
        return ModelFacts(cfg.model.name_or_path, arch_source)
    from rlctl.plan.memory.arch import Arch

    full = Arch.of(arch)
    params = full.params()
    vision = full.vision_params if arch.vision is not None else None
    return ModelFacts(cfg.model.name_or_path, arch_source, arch, params, round(params / 1e9, 2), vision)
