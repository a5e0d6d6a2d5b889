"""`rlctl k8s`: a ready Kubernetes manifest for a multi-node run, with nothing to install on the cluster.

An Indexed Job runs one pod per node; its completion index (JOB_COMPLETION_INDEX, set by the Job controller) is the
node rank, and a headless Service gives every pod a stable DNS name (NAME-INDEX.NAME, kept by a replacement pod), so
the rank-0 pod's name is the rendezvous address. Each pod asks for the plan's GPUs and a memory-backed /dev/shm,
mounts the run directory's volume (a PersistentVolumeClaim every pod mounts, ReadWriteMany) and takes its
credentials from a Secret named in the manifest, never from values written into it. A pod runs `rlctl train` on
the first start and `rlctl resume` once the run directory holds a config: a pod the Job controller replaces
(a lost node, a preemption) resumes from the last complete checkpoint. Exit 2 (bad input) fails the Job at once;
a disruption (preemption, eviction, a lost node) does not count against the retries.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from rlctl import __version__
from rlctl.launch.jobs import Job, dump_yaml, first_start_or_resume

CONTAINER = "rlctl"
CONFIG_DIR = PurePosixPath("/etc/rlctl")  # where a --config file's ConfigMap is mounted
CPUS_PER_GPU = 8


@dataclass(frozen=True)
class Pods:
    """What each pod runs with: the image (rlctl installed), the claim of the run directory's volume and where it
    is mounted, the Secret its environment comes from, CPU cores requested, retries per node, and the text of a
    --config file (a ConfigMap) when the run has one."""

    image: str
    claim: str
    mount: PurePosixPath
    secret: str
    cpus: int | None = None
    retries: int = 3
    config_text: str | None = None


def dns_label(name: str, limit: int = 50) -> str:
    """`name` as a DNS label a Kubernetes object accepts: lowercase letters, digits and '-', starting with a
    letter, at most `limit` characters (an Indexed Job's pods are named NAME-INDEX, at most 63)."""
    label = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower()))
    label = re.sub(r"^[^a-z]+", "", label)[:limit].strip("-")
    return label or "rlctl"


def main_host(name: str) -> str:
    """The rank-0 pod's DNS name: its hostname (NAME-0) under the headless Service's subdomain (NAME)."""
    return f"{name}-0.{name}"


def script(job: Job) -> str:
    """The container's shell script: the node's step with its rank from the Job controller."""
    lines = [
        "set -uo pipefail",
        f"RUN={shlex.quote(str(job.run_dir))}",
        f"MAIN={main_host(job.name)}",
        *first_start_or_resume(job),
        "# the node rank is the pod's completion index; the rank-0 pod's name is the rendezvous address",
        f'exec "${{STEP[@]}}" --nodes {job.nodes} --node-rank "$JOB_COMPLETION_INDEX" \\',
        f'  --main-address "$MAIN:{job.port}"',
    ]
    return "\n".join(lines) + "\n"


def _container(job: Job, pods: Pods) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": job.gpus_per_node} if job.gpus_per_node else {}
    cpus = pods.cpus or max(CPUS_PER_GPU * job.gpus_per_node, 2)
    mounts: list[dict[str, Any]] = [
        {"name": "run", "mountPath": str(pods.mount)},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if pods.config_text is not None:
        mounts.append({"name": "config", "mountPath": str(CONFIG_DIR), "readOnly": True})
    return {
        "name": CONTAINER,
        "image": pods.image,
        "command": ["/bin/bash", "-c", script(job)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        # HF_TOKEN, WANDB_API_KEY, ...: every key of the Secret, by reference; optional, so a run that needs none
        # starts without it
        "envFrom": [{"secretRef": {"name": pods.secret, "optional": True}}],
        "ports": [{"name": "rendezvous", "containerPort": job.port}],
        "resources": {"requests": {"cpu": str(cpus)}, **({"limits": limits} if limits else {})},
        "volumeMounts": mounts,
    }


def _volumes(job: Job, pods: Pods) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "run", "persistentVolumeClaim": {"claimName": pods.claim}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},  # NCCL and data loaders need more than 64 MiB
    ]
    if pods.config_text is not None:
        volumes.append({"name": "config", "configMap": {"name": f"{job.name}-config"}})
    return volumes


def resources(job: Job, pods: Pods) -> list[dict[str, Any]]:
    """The manifest's objects: the headless Service, a ConfigMap for a --config file, and the Indexed Job."""
    labels = {"app.kubernetes.io/name": "rlctl", "app.kubernetes.io/instance": job.name}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job.name, "labels": labels},
        "spec": {
            "clusterIP": "None",  # headless: DNS names for the pods, no load balancing
            "selector": {"batch.kubernetes.io/job-name": job.name},
            "publishNotReadyAddresses": True,  # resolvable as soon as the pod has an address
        },
    }
    objects = [service]
    if pods.config_text is not None:
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{job.name}-config", "labels": labels},
            "data": {"config.yaml": pods.config_text},
        }
        objects.append(configmap)
    pod_spec = {
        "subdomain": job.name,
        "restartPolicy": "Never",  # the Job controller replaces a failed pod (same index, same name)
        "terminationGracePeriodSeconds": 120,  # SIGTERM: rlctl saves a checkpoint at the next step, then exits
        "containers": [_container(job, pods)],
        "volumes": _volumes(job, pods),
    }
    job_spec = {
        "completionMode": "Indexed",
        "completions": job.nodes,
        "parallelism": job.nodes,
        "backoffLimitPerIndex": pods.retries,
        "maxFailedIndexes": 0,  # a node out of retries ends the whole run
        "podFailurePolicy": {
            "rules": [
                # exit 2: bad input (config, data): a retry would fail the same way
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [2]}},
                # preemption, eviction, a lost node: a replacement pod resumes, not counted as a retry
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    meta = {"name": job.name, "labels": labels}
    return [*objects, {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}]


def manifest(job: Job, pods: Pods) -> str:
    """The manifest text (`kubectl apply -f`), headed by what it runs and what it needs."""
    head = [
        f"# Written by rlctl {__version__}: {job.layout}.",
        f"# Apply with: kubectl apply -f THIS_FILE. Needs: the image {pods.image} (rlctl installed), the",
        f"# PersistentVolumeClaim {pods.claim} (ReadWriteMany, mounted at {pods.mount}, holding the run directory),",
        f"# and optionally the Secret {pods.secret} (HF_TOKEN, WANDB_API_KEY, ...: kubectl create secret generic",
        f"# {pods.secret} --from-literal=HF_TOKEN=...). A replaced pod resumes from the last complete checkpoint.",
    ]
    return "\n".join(head) + "\n" + dump_yaml(resources(job, pods))
