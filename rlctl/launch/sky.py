"""`rlctl sky`: a ready SkyPilot task for a multi-node run (`sky launch` a cluster, or `sky jobs launch` a managed
job that SkyPilot recovers after a spot preemption).

The task asks for the plan's nodes and accelerators, installs rlctl in `setup`, and `run` starts one `rlctl train`
per node with the rank and the rank-0 node's address from SkyPilot's own variables (SKYPILOT_NODE_RANK,
SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES; SKYPILOT_NUM_GPUS_PER_NODE is checked against the plan). The run directory
lies on storage every node mounts (a SkyPilot volume, or a bucket in MOUNT mode), so a recovered job finds its
config there and resumes from the last complete checkpoint. Credentials are named, never written: SkyPilot takes
their values from `--secret NAME` at launch.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from rlctl import __version__
from rlctl.launch.jobs import Job, dump_yaml, first_start_or_resume

CONFIG_FILE = "rlctl-config.yaml"  # a --config file, uploaded into every node's home folder (`run` starts there)
# SkyPilot's accelerator names where one card comes in several sizes (its catalog's names); others are the card's
SIZED = {("A100", 80): "A100-80GB", ("V100", 32): "V100-32GB"}


@dataclass(frozen=True)
class Cluster:
    """Where the task runs and what it brings: the run directory's storage (a SkyPilot volume's name, or a bucket:
    a name SkyPilot creates, or a URI such as s3://bucket/path) and its mount point, spot instances, how many
    times a managed job recovers from errors, the pip requirement that installs rlctl (`requirement`), the
    secrets' names, and a local --config file to upload."""

    mount: PurePosixPath
    volume: str | None = None
    bucket: str | None = None
    use_spot: bool = False
    retries: int = 3
    install: str = ""
    secrets: tuple[str, ...] = ()
    config_file: str | None = None


def requirement(vllm: bool) -> str:
    """The pip requirement of this rlctl, with vLLM when the plan generates with it."""
    return f"rlctl{'[vllm]' if vllm else ''}=={__version__}"


def accelerators(job: Job) -> str | None:
    """resources.accelerators, NAME:COUNT in SkyPilot's names (None on CPU)."""
    if not job.gpus_per_node:
        return None
    name, _, memory = job.gpu.partition("-")
    size = int(float(memory.removesuffix("GB"))) if memory else 0
    return f"{SIZED.get((name, size), name)}:{job.gpus_per_node}"


def run_script(job: Job) -> str:
    """The task's `run`: every node's step with its rank and the first node's address from SkyPilot."""
    lines = [
        "set -uo pipefail",
        'cd "$HOME"',
        f"RUN={shlex.quote(str(job.run_dir))}",
        'MAIN=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
    ]
    if job.gpus_per_node:
        lines += [
            f'if [ "$SKYPILOT_NUM_GPUS_PER_NODE" != {job.gpus_per_node} ]; then',
            f'  echo "rlctl: the run is planned for {job.gpus_per_node} GPUs per node; SkyPilot gave this node '
            '$SKYPILOT_NUM_GPUS_PER_NODE. Write the task again with the right --hardware." >&2',
            "  exit 2",
            "fi",
        ]
    lines += [
        *first_start_or_resume(job),
        "# one rlctl per node: its rank and the rank-0 node's address as SkyPilot gives them",
        'exec "${STEP[@]}" --nodes "$SKYPILOT_NUM_NODES" --node-rank "$SKYPILOT_NODE_RANK" '
        f'--main-address "$MAIN:{job.port}"',
    ]
    return "\n".join(lines) + "\n"


def task(job: Job, cluster: Cluster) -> dict[str, Any]:
    """The task as SkyPilot's YAML holds it."""
    resources: dict[str, Any] = {}
    if (acc := accelerators(job)) is not None:
        resources["accelerators"] = acc
    resources["use_spot"] = cluster.use_spot
    # a managed job (sky jobs launch): recover a preempted cluster, and retry a run that failed this often
    resources["job_recovery"] = {"max_restarts_on_errors": cluster.retries}
    out: dict[str, Any] = {"name": job.name, "num_nodes": job.nodes, "resources": resources}
    out["envs"] = {"PYTHONUNBUFFERED": "1"}
    if cluster.secrets:
        out["secrets"] = dict.fromkeys(cluster.secrets)  # names only: values come from `--secret NAME` at launch
    mounts: dict[str, Any] = {}
    if cluster.bucket is not None:
        where = "source" if "://" in cluster.bucket else "name"
        mounts[str(cluster.mount)] = {where: cluster.bucket, "mode": "MOUNT"}
    if cluster.config_file is not None:
        mounts[f"~/{CONFIG_FILE}"] = cluster.config_file
    if mounts:
        out["file_mounts"] = mounts
    if cluster.volume is not None:
        out["volumes"] = {str(cluster.mount): cluster.volume}
    out["setup"] = f"pip install {shlex.quote(cluster.install)}\n"
    out["run"] = run_script(job)
    return out


def task_yaml(job: Job, cluster: Cluster) -> str:
    """The task file's text, headed by what it runs and what it needs."""
    storage = f"volume {cluster.volume}" if cluster.volume else f"bucket {cluster.bucket} (MOUNT mode)"
    secrets = " ".join(f"--secret {name}" for name in cluster.secrets)
    head = [
        f"# Written by rlctl {__version__}: {job.layout}.",
        f"# Launch with: sky jobs launch THIS_FILE {secrets}".rstrip(),
        f"# (a managed job, recovered after a spot preemption) or sky launch THIS_FILE {secrets}".rstrip() + ".",
        f"# The run directory lies on the {storage}, mounted at {cluster.mount} on every node; setup installs",
        f"# {cluster.install}. A recovered job resumes from the last complete checkpoint.",
    ]
    return "\n".join(head) + "\n" + dump_yaml([task(job, cluster)])
