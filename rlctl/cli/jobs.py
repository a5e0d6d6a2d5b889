"""`rlctl slurm`, `k8s` and `sky`: a ready job file for a multi-node run on SLURM, Kubernetes or SkyPilot, written
to stdout after the plan is checked (exit 2 when it does not fit, nothing written). Every node runs `rlctl train`
on the first start and `rlctl resume` once the run directory holds a config, its rank and the rank-0 node's
address taken from the scheduler."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.cli.app import AlgoOpt, ConfigOpt, HwOpt, NodesOpt, PresetOpt, SetOpt, StagesOpt, _resolve, app
from rlctl.cli.run import _apply_nodes
from rlctl.errors import UserError
from rlctl.rundir import RunDir

if TYPE_CHECKING:  # rlctl.launch loads on demand, keeping `rlctl --help` fast
    from rlctl.launch.jobs import Job
    from rlctl.plan import Plan

PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="Rendezvous port on the first node.")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Job name (default rlctl-PRESET).")]
MountOpt = Annotated[
    str | None,
    typer.Option("--mount", metavar="PATH", help="Where the run directory's storage is mounted (default: its parent)."),
]
RetriesOpt = Annotated[
    int, typer.Option("--retries", min=0, help="Times a failed node (pod, managed job) is started again.")
]


@dataclass(frozen=True)
class _Run:
    """The run options every job command takes, as given (the nodes run `rlctl train` with them)."""

    preset: str | None
    config: Path | None
    algorithm: str | None
    hardware: str | None
    set_: list[str] | None
    stages: str | None
    nodes: int | None


def _job(run_dir: Path, run: _Run, config_as: str | None, port: int, name: str | None) -> tuple[Job, Plan]:
    """The run as a job, and its plan, checked now (refuses what would fail on the cluster); `config_as` is where a
    --config file lies as the nodes see it."""
    from rlctl.launch.jobs import Job
    from rlctl.plan import planner as plan_mod

    cfg = _resolve(run.preset, run.config, run.algorithm, run.hardware, run.set_, run.stages)
    _apply_nodes(cfg, run.nodes, 0, "$MAIN")
    the_plan = plan_mod.build(cfg, run_dir)
    lay, hw = the_plan.layout, the_plan.hardware
    args: list[str] = []
    args += ["--preset", run.preset] if run.preset else []
    args += ["--config", config_as] if run.config and config_as else []
    args += ["--algorithm", run.algorithm] if run.algorithm else []
    args += ["--hardware", run.hardware] if run.hardware else []
    for item in run.set_ or []:
        args += ["--set", item]
    args += ["--stages", run.stages] if run.stages else []
    gpu = "" if hw.is_cpu else f"{hw.gpu_name}-{hw.gpu_memory_gib:g}GB"
    where = "CPU" if hw.is_cpu else f"{hw.gpus_per_node} x {gpu}"
    layout = f"{cfg.name} on {lay.nodes} node(s) x {where} = {lay.world_size} processes, run directory {run_dir}"
    job_name = name or f"rlctl-{run.preset or cfg.name}"
    posix = PurePosixPath(run_dir.as_posix())
    return Job(tuple(args), posix, lay.nodes, hw.gpus_per_node, gpu, port, job_name, layout), the_plan


def _remote_run_dir(run_dir: Path, mount: str | None) -> tuple[Path, PurePosixPath]:
    """The run directory as the pods / cluster nodes see it (absolute), and where its storage is mounted."""
    if not run_dir.is_absolute():
        raise UserError(
            f"--run-dir {run_dir} must be an absolute path as the nodes see it, on the storage every node mounts "
            "(e.g. --run-dir /runs/q7)."
        )
    where = PurePosixPath(mount) if mount else PurePosixPath(run_dir.as_posix()).parent
    if not where.is_absolute() or where not in PurePosixPath(run_dir.as_posix()).parents:
        raise UserError(f"--run-dir {run_dir} is not under --mount {mount}: the run directory lies on that storage.")
    return run_dir, where


@app.command()
def slurm(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run directory on a filesystem every node shares (required).")
    ],
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    stages: StagesOpt = None,
    nodes: NodesOpt = None,
    port: PortOpt = 29500,
    cpus_per_task: Annotated[
        int | None, typer.Option("--cpus-per-task", min=1, help="CPU cores per node task (default 8 per GPU).")
    ] = None,
    partition: Annotated[str | None, typer.Option("--partition", help="#SBATCH --partition.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="#SBATCH --time, e.g. 24:00:00.")] = None,
) -> None:
    """Write a ready SLURM sbatch script to stdout: one task per node running `rlctl train` with its rank and the
    first node's address from SLURM, `rlctl resume` when the job is requeued, a checkpoint before preemption.

    The plan is checked now (exit 2 if it does not fit); RUN_DIR/logs is created so SLURM can write its log there.
    Usage: rlctl slurm --preset qwen7b-grpo --hardware 2x8xH100-80GB --run-dir /shared/runs/q7 > job.sbatch"""
    from rlctl.launch import slurm as slurm_mod

    run_dir = run_dir.absolute()
    config_as = str(config.absolute()) if config else None  # the shared filesystem holds it too
    run = _Run(preset, config, algorithm, hardware, set_, stages, nodes)
    job, _ = _job(run_dir, run, config_as, port, None)
    RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
    sys.stdout.write(slurm_mod.script(job, cpus_per_task, partition, time_limit))


@app.command()
def k8s(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run directory as the pods see it, on the volume of --pvc (required).")
    ],
    image: Annotated[str, typer.Option("--image", help="Container image with rlctl installed (required).")],
    pvc: Annotated[
        str, typer.Option("--pvc", help="PersistentVolumeClaim (ReadWriteMany) holding the run directory (required).")
    ],
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    stages: StagesOpt = None,
    nodes: NodesOpt = None,
    mount: MountOpt = None,
    secret: Annotated[
        str, typer.Option("--secret", help="Secret whose keys (HF_TOKEN, WANDB_API_KEY, ...) become each pod's env.")
    ] = "rlctl-secrets",
    name: NameOpt = None,
    port: PortOpt = 29500,
    cpus: Annotated[int | None, typer.Option("--cpus", min=1, help="CPU cores per pod (default 8 per GPU).")] = None,
    retries: RetriesOpt = 3,
) -> None:
    """Write a ready Kubernetes manifest to stdout: an Indexed Job (one pod per node, the node rank its completion
    index) and a headless Service (the rank-0 pod's DNS name is the rendezvous address); no operator needed.

    Each pod requests the plan's GPUs and a memory-backed /dev/shm, mounts --pvc at --mount and takes its
    credentials from the Secret --secret by reference. A replaced pod resumes from the last complete checkpoint.
    Usage: rlctl k8s --preset qwen7b-grpo --hardware 2x8xH100-80GB --run-dir /runs/q7 --image IMAGE --pvc runs
    > job.yaml"""
    from rlctl.launch import k8s as k8s_mod

    run_dir, where = _remote_run_dir(run_dir, mount)
    config_as = str(k8s_mod.CONFIG_DIR / "config.yaml")
    label = k8s_mod.dns_label(name or f"rlctl-{preset or 'run'}")
    if name is not None and label != name:
        raise UserError(
            f"--name {name!r} is not a Kubernetes name: use lowercase letters, digits and '-' (e.g. {label})."
        )
    run = _Run(preset, config, algorithm, hardware, set_, stages, nodes)
    job, _ = _job(run_dir, run, config_as, port, label)
    text = config.read_text() if config else None
    pods = k8s_mod.Pods(image, pvc, where, secret, cpus, retries, text)
    sys.stdout.write(k8s_mod.manifest(job, pods))


@app.command()
def sky(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run directory as the nodes see it, on --volume or --bucket (required).")
    ],
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    stages: StagesOpt = None,
    nodes: NodesOpt = None,
    volume: Annotated[
        str | None, typer.Option("--volume", help="SkyPilot volume holding the run directory (sky volumes apply).")
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option("--bucket", help="Bucket holding the run directory, MOUNT mode: a name, or s3://... gs://..."),
    ] = None,
    mount: MountOpt = None,
    use_spot: Annotated[bool, typer.Option("--use-spot", help="Spot instances (run as a managed job).")] = False,
    secret: Annotated[
        list[str] | None,
        typer.Option("--secret", metavar="NAME", help="Env var `sky launch --secret NAME` passes (repeatable)."),
    ] = None,
    install: Annotated[
        str | None, typer.Option("--install", metavar="REQ", help="What setup pip-installs (default this rlctl).")
    ] = None,
    name: NameOpt = None,
    port: PortOpt = 29500,
    retries: RetriesOpt = 3,
) -> None:
    """Write a ready SkyPilot task to stdout: the plan's nodes and accelerators, a setup that installs rlctl, and a
    run that starts rlctl on every node with its rank from SkyPilot (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS).

    The run directory lies on a SkyPilot volume or a bucket every node mounts; a managed job recovered after a spot
    preemption resumes from the last complete checkpoint.
    Usage: rlctl sky --preset qwen7b-grpo --hardware 2x8xH100-80GB --run-dir /runs/q7 --bucket my-runs --use-spot
    > task.yaml"""
    from rlctl.launch import sky as sky_mod

    if (volume is None) == (bucket is None):
        raise UserError("rlctl sky needs the run directory's storage: --volume NAME or --bucket NAME|URI (one).")
    run_dir, where = _remote_run_dir(run_dir, mount)
    run = _Run(preset, config, algorithm, hardware, set_, stages, nodes)
    job, the_plan = _job(run_dir, run, sky_mod.CONFIG_FILE, port, name)
    cluster = sky_mod.Cluster(
        where,
        volume,
        bucket,
        use_spot,
        retries,
        install or sky_mod.requirement(the_plan.generation_engine == "vllm"),
        tuple(secret or ()),
        str(config.absolute()) if config else None,
    )
    sys.stdout.write(sky_mod.task_yaml(job, cluster))
