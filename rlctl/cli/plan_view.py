"""How `rlctl plan` and `rlctl train` print a plan: the run, the stages table, the layout, memory, the async split
and the launch command."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from rlctl.plan import Plan


def show(console: Console, plan: Plan) -> None:
    """The plan as `rlctl plan` and `rlctl train` print it."""
    from rich.markup import escape

    from rlctl import tables

    cfg = plan.config
    hw = plan.hardware
    where = "CPU" if hw.is_cpu else f"{hw.nodes} node(s) x {hw.gpus_per_node} x {hw.gpu_name} {hw.gpu_memory_gib:g} GiB"
    console.print(f"[bold]Run[/] {cfg.name}  ->  {plan.run_dir}")
    console.print(f"[bold]Model[/] {cfg.model.name_or_path}   [bold]Hardware[/] {hw.spec} ({where})")
    count = plan.model.params
    if count:
        size = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"
        console.print(f"[bold]Parameters[/] {size} (architecture from {plan.model.arch_source})")
    if plan.model_import is not None:
        console.print(f"[bold]Import[/] {escape(plan.model_import.describe())}")
    console.print(
        f"[bold]Strategy[/] {plan.strategy}, {plan.num_processes} process(es) per node, "
        f"mixed precision {plan.mixed_precision}"
    )
    # Paths relative to the run directory, the Hub model as "model" (named above), no cell wrapped or cut.
    table = _compact(f"Stages (paths in {plan.run_dir})")
    for col in ("stage", "starts from", "steps", "batch", "micro x accum", "lr", "writes"):
        table.add_column(col, no_wrap=True)

    def short(path: str) -> str:
        if path == cfg.model.name_or_path:
            return "model"
        return path[len(f"{plan.run_dir}/") :] if path.startswith(f"{plan.run_dir}/") else path

    for s in plan.stages:
        sc = getattr(cfg, s.name)
        label = f"rl ({cfg.rl.algorithm})" if s.name == "rl" else s.name
        steps = str(s.max_steps) if s.epochs is None else f"{s.max_steps} ({s.epochs:g} ep.)"
        if s.name == "rl" and cfg.rl.critic.pretrain_steps:
            steps = f"{s.max_steps} ({cfg.rl.critic.pretrain_steps} value pretraining + {cfg.rl.max_steps})"
        table.add_row(
            label,
            short(s.init_from),
            steps,
            str(s.batch_size),
            f"{s.micro_batch_size} x {s.grad_accum}",
            f"{sc.learning_rate:g}",
            short(s.output),
        )
    tables.show(console, table)  # a row per stage where a path is too long for the columns
    lay = plan.layout
    per = "CPU process" if hw.is_cpu else f"GPU ({hw.gpu_name} {hw.gpu_memory_gib:g} GiB)"
    line = (
        f"[bold]Layout[/] {lay.nodes} node(s) x {lay.processes_per_node} process(es) = world size "
        f"{lay.world_size}, one process per {per}"
    )
    if lay.nodes > 1:
        line += f"; this node: rank {lay.node_rank} of {lay.nodes}, main {lay.main or '(unset)'}"
    console.print(line)
    mem = plan.memory
    if mem is not None:
        console.print(
            f"[bold]Per {'process' if hw.is_cpu else 'GPU'}[/] peak {mem.peak_gib:g} GiB ({mem.peak_phase}) of "
            f"{mem.budget_gib:g} GiB budget; per stage micro batch x accumulation above",
        )
    _value_pretraining(console, plan)
    _vision(console, plan)
    if plan.async_split is not None:
        tables.show(console, _async_table(plan))
    console.print(f"[bold]Launch[/] {escape(plan.command)}", soft_wrap=True)  # one line: it must paste as is
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")


def _value_pretraining(console: Console, plan: Plan) -> None:
    """VAPO's value pretraining (rl.critic.pretrain_steps): its rollouts and updates before the policy's first step,
    and its planned memory beside the training phase's."""
    rl = plan.config.rl
    if "rl" not in plan.config.stages or not rl.critic.pretrain_steps:
        return
    line = (
        f"[bold]Value pretraining[/] {rl.critic.pretrain_steps} steps of {rl.batch_size} rollouts from the starting "
        f"policy fit the critic to Monte-Carlo returns before the policy's {rl.max_steps} steps (each a step's "
        "generation and the critic's update; the policy does not move)"
    )
    rows = {p.phase: p for p in plan.memory.stage_phases("rl")} if plan.memory is not None else {}
    if "value pretraining" in rows and "training" in rows:
        unit = "process" if plan.hardware.is_cpu else "GPU"
        line += f"; {rows['value pretraining'].peak_gib:g} GiB per {unit} (training: {rows['training'].peak_gib:g})"
    console.print(line)


def _vision(console: Console, plan: Plan) -> None:
    """A vision-language plan's vision tower (its size, whether it trains, its activations per phase) and image-token
    budget per stage (tokens per row and per image, the pixel bounds, where the numbers came from)."""
    arch = plan.model.arch
    if arch is None or arch.vision is None:
        return
    from rlctl.vision import of_tower

    v = arch.vision
    trains = "trains (full fine-tuning)" if plan.adapter == "full" else "frozen (LoRA on the language model)"
    if plan.adapter == "full" and plan.config.model.freeze_vision:
        trains = "frozen (model.freeze_vision; the language model trains in full)"
    elif plan.adapter != "full" and plan.config.model.lora_vision:
        trains = "LoRA adapters on it (model.lora_vision)"
    line = f"[bold]Vision tower[/] {(plan.model.vision_params or 0) / 1e6:.1f}M parameters ({v.layers} blocks of "
    line += of_tower(v).tower_brief(v)
    line += f", {trains}"
    mem = plan.memory
    acts = [(p.label, p.components_gib.get("vision tower activations")) for p in mem.phases] if mem else []
    shown = ", ".join(f"{label} {gib:g}" for label, gib in acts if gib)
    console.print(
        line + (f"; activations GiB per {'process' if plan.hardware.is_cpu else 'GPU'}: {shown}" if shown else "")
    )
    for stage, budget in plan.images.items():
        console.print(f"[bold]Image tokens[/] {stage}: {budget.describe()}")


def _compact(title: str) -> Table:
    """The plan's tables: a rule under the header, no edges, two spaces between columns (seven of them fit 80
    columns with epochs in the steps)."""
    from rich import box
    from rich.table import Table

    return Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )


def _async_table(plan: Plan) -> Table:
    """rl.async_rollout: the generator's and the trainers' devices, what runs there and each side's memory."""

    s, hw = plan.async_split, plan.hardware
    assert s is not None
    nodes = f", on each of {hw.nodes} nodes" if hw.nodes > 1 else ""
    table = _compact(f"Async RL split (rl.async_rollout{nodes})")
    for col in ("side", "devices", "runs"):
        table.add_column(col, no_wrap=True)
    table.add_column("memory per " + ("process" if hw.is_cpu else "GPU"))
    mem = plan.memory
    trainer_mem = f"peak {mem.peak_gib:.1f} of {mem.budget_gib:.1f} GiB" if mem is not None else "not estimated"
    procs = f"{plan.num_processes} process(es)"
    if not s.on_gpus:
        gen_threads, threads = f"{s.generator_threads} CPU thread(s)", f"{s.trainer_threads} CPU thread(s) each"
        runs = f"{s.engines // hw.nodes} {s.generator_engine} process(es)"
        table.add_row("generator", f"{gen_threads} each", runs, "host RAM")
        table.add_row("trainer", threads, procs, trainer_mem)
        return table
    if s.generator_gib_per_gpu is None:
        gen_mem = "not estimated"
    elif s.generator_engine == "vllm":
        gen_mem = f"{s.generator_gib_per_gpu:.1f} GiB reserved (KV cache {s.generator_kv_cache_gib:.1f})"
    else:
        gen_mem = f"peak {s.generator_gib_per_gpu:.1f} of {s.budget_gib_per_gpu:.1f} GiB"
    engines = s.engines // hw.nodes
    runs = f"{engines} vLLM engine(s), TP {s.tensor_parallel_size}" if s.generator_engine == "vllm" else ""
    runs = runs or f"{engines} transformers generator(s)"
    table.add_row("generator", _gpus(s.generator_gpu_ids), runs, gen_mem)
    table.add_row("trainer", _gpus(s.trainer_gpu_ids), f"{procs}, {plan.strategy}", trainer_mem)
    if s.idle_gpus:
        first = s.trainer_gpus + s.generator_gpus
        table.add_row("idle", _gpus(tuple(range(first, first + s.idle_gpus))), "nothing", "")
    return table


def _gpus(gpu_ids: tuple[int, ...]) -> str:
    from rlctl.plan.async_split import ids

    return f"GPU{'s' if len(gpu_ids) > 1 else ''} {ids(gpu_ids)}"
