"""`rlctl k8s` and `rlctl sky`: their files pass the Kubernetes API schema (kubernetes-validate) and SkyPilot's own
task parser, hold no secret value, and train a real two-node run on this machine's CPU with exactly what the
scheduler gives each node, read from the file; elastic restarts (hardware.max_restarts): a node killed with SIGKILL
during RL and replaced as the Job controller replaces a pod, the run going on from the last complete checkpoint, and
a node lost for good ending the run explained and resumable. The SLURM script's run is in tests/test_multinode.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rlctl import __version__
from tests.helpers import TWO_NODE_RUN, free_port, kill_tree, node_env, outputs, records, rlctl

MULTI = ("--preset", "qwen7b-grpo", "--hardware", "2x8xH100-80GB")
SECRETS = {"HF_TOKEN": "hf_launchersSECRETvalue123", "WANDB_API_KEY": "wandbSECRET0123456789abcdef"}


def _k8s(tmp_path: Path, *args: str, env: dict | None = None) -> str:
    run = tmp_path / "runs" / "q7"
    proc = rlctl("k8s", *MULTI, "--run-dir", str(run), "--image", "registry.example/rlctl:1", "--pvc", "runs", *args,
                 env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not run.exists()  # the run directory is the pods', on their volume
    return proc.stdout


def _objects(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def test_k8s_manifest_passes_the_kubernetes_schema(tmp_path: Path):
    """Service, ConfigMap and Job validated by kubernetes-validate against the API schema of Kubernetes 1.33 (the
    first with backoffLimitPerIndex and maxFailedIndexes stable) and of the newest it knows, strictly (an unknown
    field fails)."""
    import kubernetes_validate

    config = tmp_path / "mine.yaml"
    config.write_text("rl:\n  max_steps: 500\n")
    objects = _objects(_k8s(tmp_path, "--config", str(config)))
    assert set(objects) == {"Service", "ConfigMap", "Job"}
    for version in ("1.33", kubernetes_validate.latest_version()):
        for obj in objects.values():
            kubernetes_validate.validate(obj, version, strict=True)
    broken = json.loads(json.dumps(objects["Job"]))
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo the API server would refuse
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.33", strict=True)

    job, service = objects["Job"], objects["Service"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {
        "batch.kubernetes.io/job-name": "rlctl-qwen7b-grpo"
    }
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["run"]["persistentVolumeClaim"] == {"claimName": "runs"}
    assert volumes["config"]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    assert objects["ConfigMap"]["data"]["config.yaml"] == config.read_text()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"run": str(tmp_path / "runs"), "shm": "/dev/shm", "config": "/etc/rlctl"}
    assert container["envFrom"] == [{"secretRef": {"name": "rlctl-secrets", "optional": True}}]
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob" and rules[0]["onExitCodes"]["values"] == [2]
    assert rules[1] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    script = container["command"][2]
    assert "--config /etc/rlctl/config.yaml" in script and 'rlctl resume "$RUN"' in script
    assert '--node-rank "$JOB_COMPLETION_INDEX"' in script and "MAIN=rlctl-qwen7b-grpo-0.rlctl-qwen7b-grpo" in script


def test_job_files_hold_no_secret_value(tmp_path: Path):
    """Credentials in the environment of `rlctl k8s` / `rlctl sky` are named in the files, never written there."""
    manifest = _k8s(tmp_path, "--secret", "team-tokens", env=SECRETS)
    task = rlctl("sky", *MULTI, "--run-dir", "/runs/q7", "--bucket", "runs", "--secret", "HF_TOKEN",
                 "--secret", "WANDB_API_KEY", env=SECRETS)  # fmt: skip
    assert task.returncode == 0, task.stderr
    for text in (manifest, task.stdout):
        for value in SECRETS.values():
            assert value not in text
    assert "name: team-tokens" in manifest
    assert yaml.safe_load(task.stdout)["secrets"] == {"HF_TOKEN": None, "WANDB_API_KEY": None}


def _skypilot() -> str:
    """The Python that has SkyPilot (its own venv: SkyPilot pins click<8.2, which rlctl's huggingface_hub
    refuses): $RLCTL_SKYPILOT_PYTHON, else .venv-sky/bin/python that `make install` builds."""
    found = os.environ.get("RLCTL_SKYPILOT_PYTHON") or str(Path(__file__).parents[1] / ".venv-sky" / "bin" / "python")
    if not Path(found).is_file():
        pytest.skip(f"SkyPilot is not installed at {found} (make install-sky)")
    return found


# SkyPilot's own parser (schema and resources validation), offline: what it read back from the file
SKY_PARSE = """
import json, sys
import sky
task = sky.Task.from_yaml(sys.argv[1])
(res,) = task.resources
print(json.dumps({
    "nodes": task.num_nodes, "accelerators": res.accelerators, "spot": res.use_spot,
    "mounts": {path: [s.name, s.source, s.mode.value] for path, s in task.storage_mounts.items()},
    "volumes": task.volumes, "setup": task.setup, "run": task.run, "envs": task.envs,
}))
"""


def test_sky_task_passes_skypilots_parser(tmp_path: Path):
    python = _skypilot()
    out = {}
    for storage in (("--bucket", "my-runs", "--use-spot"), ("--volume", "runs-pvc")):
        proc = rlctl("sky", *MULTI, "--run-dir", "/runs/q7", *storage)
        assert proc.returncode == 0, proc.stderr
        path = tmp_path / f"{storage[0][2:]}.yaml"
        path.write_text(proc.stdout)
        parsed = subprocess.run([python, "-c", SKY_PARSE, str(path)], capture_output=True, text=True, timeout=300)
        assert parsed.returncode == 0, parsed.stderr
        out[storage[0]] = json.loads(parsed.stdout.splitlines()[-1])
    bucket, volume = out["--bucket"], out["--volume"]
    assert bucket["nodes"] == 2 and bucket["accelerators"] == {"H100": 8} and bucket["spot"] is True
    assert bucket["mounts"] == {"/runs": ["my-runs", None, "MOUNT"]}
    assert volume["volumes"] == {"/runs": "runs-pvc"} and volume["spot"] is False
    assert bucket["setup"].strip() == f"pip install 'rlctl[vllm]=={__version__}'"
    for var in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert f"${var}" in bucket["run"]
    broken = tmp_path / "broken.yaml"  # the parser is no rubber stamp
    broken.write_text((tmp_path / "bucket.yaml").read_text().replace("use_spot: true", "use_spott: true"))
    refused = subprocess.run([python, "-c", SKY_PARSE, str(broken)], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "use_spot" in refused.stderr


def test_job_files_refuse_what_would_fail_on_the_cluster(tmp_path: Path):
    relative = rlctl("k8s", *MULTI, "--run-dir", "runs/q7", "--image", "i", "--pvc", "p")
    assert relative.returncode == 2 and "must be an absolute path" in relative.stderr
    outside = rlctl("k8s", *MULTI, "--run-dir", "/runs/q7", "--mount", "/data", "--image", "i", "--pvc", "p")
    assert outside.returncode == 2 and "is not under --mount /data" in " ".join(outside.stderr.split())
    name = rlctl("k8s", *MULTI, "--run-dir", "/runs/q7", "--image", "i", "--pvc", "p", "--name", "My_Run")
    assert name.returncode == 2 and "e.g. my-run" in name.stderr
    nowhere = rlctl("sky", *MULTI, "--run-dir", "/runs/q7")
    assert nowhere.returncode == 2 and "--volume NAME or --bucket" in nowhere.stderr
    too_big = rlctl("sky", *MULTI, "--run-dir", "/runs/q7", "--bucket", "b", "--set", "rl.prompts_per_step=3")
    assert too_big.returncode == 2 and not too_big.stdout  # the plan is checked first: nothing written
    one = rlctl("plan", "--preset", "tiny-demo", "--hardware", "cpu", "--set", "hardware.max_restarts=2")
    assert one.returncode == 2 and "needs torchrun's elastic agent" in " ".join(one.stderr.split())


def test_elastic_plan_uses_c10d_and_the_agent(tmp_path: Path):
    elastic = ("--set", "hardware.max_restarts=3", "--set", "hardware.rendezvous_timeout_s=300")
    proc = rlctl("plan", *MULTI, "--run-dir", str(tmp_path / "run"), "--json", "--main-address", "node0", *elastic)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert (plan["accelerate"]["rdzv_backend"], plan["accelerate"]["same_network"]) == ("c10d", False)
    assert plan["launch"].endswith(
        "--main_process_ip node0 --main_process_port 29500 --max_restarts 3 --rdzv_backend c10d "
        "--rdzv_conf join_timeout=300,is_host=1 "
        f"-m rlctl.launch.runner {tmp_path / 'run'}"
    )
    other = rlctl("plan", *MULTI, "--run-dir", str(tmp_path / "run"), "--json", "--main-address", "node0", *elastic,
                  "--node-rank", "1")  # fmt: skip
    assert "--rdzv_conf join_timeout=300,is_host=0 " in json.loads(other.stdout)["launch"]  # a client of node 0's store


# ------------------------------------------------------------------------------------------- two local nodes


class Pods:
    """The pods of an Indexed Job, each a process tree started with the container's command and env from the
    manifest, JOB_COMPLETION_INDEX as the Job controller sets it, and the headless Service's DNS names resolving
    to this machine (an /etc/hosts bound over the real one in the pod's own mount namespace: `unshare`)."""

    def __init__(self, tmp_path: Path, manifest: str):
        self.tmp_path = tmp_path
        objects = _objects(manifest)
        name = objects["Service"]["metadata"]["name"]
        container = objects["Job"]["spec"]["template"]["spec"]["containers"][0]
        self.command = container["command"]
        self.env = {e["name"]: e["value"] for e in container["env"]}  # literal values; the Secret is optional
        hosts = tmp_path / "hosts"
        nodes = objects["Job"]["spec"]["completions"]
        names = " ".join(f"{name}-{i}.{name}" for i in range(nodes))
        hosts.write_text(f"127.0.0.1 {names}\n" + Path("/etc/hosts").read_text())  # the pod's own names kept
        bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
        self.netns = ["unshare", "--mount", "bash", "-c", bind, str(hosts)]
        if subprocess.run([*self.netns, "true"], capture_output=True).returncode:  # not root: a user namespace
            self.netns = ["unshare", "-r", "--mount", "bash", "-c", bind, str(hosts)]
            if subprocess.run([*self.netns, "true"], capture_output=True).returncode:
                pytest.skip("unshare cannot give a pod its own /etc/hosts here (no mount namespaces)")

    def start(self, index: int) -> subprocess.Popen:
        out = (self.tmp_path / f"pod{index}.out").open("a")
        env = node_env({**self.env, "JOB_COMPLETION_INDEX": str(index)})
        return subprocess.Popen([*self.netns, *self.command], env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait(what: str, ready, procs: list[subprocess.Popen], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:  # a hang fails instead of stalling CI; no assertion reads the clock
            raise AssertionError(f"timed out waiting for {what}")
        assert all(p.poll() is None for p in procs), f"a node ended while waiting for {what}"
        time.sleep(0.2)


def _complete(run: Path, step: int) -> bool:
    return (run / "rl" / "checkpoints" / f"checkpoint-{step}" / "rlctl_complete").exists()


@pytest.mark.slow
def test_k8s_pods_train_together_and_survive_a_lost_node(tmp_path: Path):
    """Two pods of the manifest train RL together (hardware.max_restarts=2). Pod 1's process tree is SIGKILLed
    during RL and the Job controller's replacement (the same command, index 1) rejoins: pod 0's elastic agent
    restarts its processes and every process resumes from the last complete checkpoint, without a person;
    summary.json says which node was lost, the step reached and the checkpoint resumed. Later pod 1 is killed and
    not replaced: pod 0 stops once the rendezvous times out, exit 1, naming the last checkpoint and `rlctl resume`;
    both pods started again resume and finish."""
    shared = tmp_path / "volume"
    run = shared / "run"
    rl = ("--preset", "tiny-demo", "--hardware", "cpu", "--nodes", "2", "--stages", "rl", "--set", "rl.max_steps=6")
    rl += ("--set", "rl.save_every=2", "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4")
    rl += ("--set", "rl.eval_samples=8", "--set", "rl.rewards=[{name: exact_match}]")
    rl += ("--set", "hardware.max_restarts=2", "--set", "hardware.rendezvous_timeout_s=40")
    proc = rlctl("k8s", *rl, "--run-dir", str(run), "--image", "local", "--pvc", "volume", "--port", str(free_port()))
    assert proc.returncode == 0, proc.stderr
    pods = Pods(tmp_path, proc.stdout)
    logs = ["pod0.out", "pod1.out"]
    nodes = [pods.start(0), pods.start(1)]
    try:
        _wait("a complete checkpoint", lambda: _complete(run, 2), nodes)
        kill_tree(nodes[1])  # the node is gone: its launcher, agent and training processes at once
        nodes[1] = pods.start(1)  # the Job controller's replacement pod: config.yaml is there, so `rlctl resume`
        _wait("the elastic restart", lambda: any(r.get("event") == "restart" for r in records(run)), nodes)
        restart = next(r for r in records(run) if r.get("event") == "restart")
        after = int(restart["resumed_from"].rsplit("-", 1)[1]) + 2
        _wait(f"checkpoint-{after} after the restart", lambda: _complete(run, after), nodes)
        kill_tree(nodes[1])  # lost for good: no replacement within the rendezvous timeout
        assert nodes[0].wait(timeout=300) == 1, outputs(tmp_path, logs)
        stopped = " ".join((tmp_path / "pod0.out").read_text().split())
        assert (
            "fewer than the plan's 2 nodes joined the rendezvous within hardware.rendezvous_timeout_s=40 s" in stopped
        )
        last = max(int(c.name.rsplit("-", 1)[1]) for c in (run / "rl" / "checkpoints").glob("checkpoint-*"))
        assert f"The last complete checkpoint is rl/checkpoints/checkpoint-{last}." in stopped
        assert f"rlctl resume {run}" in stopped
        nodes = [pods.start(0), pods.start(1)]  # the scheduler brings the nodes back: both resume
        codes = [p.wait(timeout=900) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                kill_tree(p)
    assert codes == [0, 0], outputs(tmp_path, logs)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == ["rl"] and summary["world_size"] == 2
    (recorded,) = summary["restarts"]  # the final resume started every node anew: not an elastic restart
    assert recorded["restart"] == 1 and recorded["lost_nodes"] == [1] and recorded["stage"] == "rl"
    assert recorded["resumed_from"] == restart["resumed_from"]
    assert recorded["reached_step"] >= int(recorded["resumed_from"].rsplit("-", 1)[1]) >= 2
    trained = [r for r in records(run) if r.get("event") == "trained"]
    assert trained[-1]["max_steps"] == 6 and trained[-1]["resumed_from"] >= after
    steps = [r["step"] for r in records(run) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert steps[-1] == 6
    assert "restart 1 (elastic, rl): node(s) replaced: 1" in " ".join((tmp_path / "pod0.out").read_text().split())


@pytest.mark.slow
def test_sky_task_runs_two_nodes(tmp_path: Path):
    """The task's `run` on two local nodes with SkyPilot's variables (rank, the nodes' IPs, their count, GPUs per
    node) and the task's envs; the bucket's mount point is a local folder. `setup` (pip install rlctl) is what
    SkyPilot runs first on a fresh node; here rlctl is already installed."""
    mount = tmp_path / "bucket"
    run = mount / "run"
    proc = rlctl("sky", *TWO_NODE_RUN, "--run-dir", str(run), "--bucket", "runs", "--port", str(free_port()))
    assert proc.returncode == 0, proc.stderr
    task = yaml.safe_load(proc.stdout)
    assert task["file_mounts"] == {str(mount): {"name": "runs", "mode": "MOUNT"}}
    mount.mkdir()  # SkyPilot mounts the bucket before `run`
    skypilot = {"SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "SKYPILOT_NUM_NODES": str(task["num_nodes"])}
    skypilot["SKYPILOT_NUM_GPUS_PER_NODE"] = "0"
    logs = ["sky0.out", "sky1.out"]
    nodes = []
    for rank in (0, 1):
        env = node_env({**task["envs"], **skypilot, "SKYPILOT_NODE_RANK": str(rank)})
        out = (tmp_path / logs[rank]).open("w")
        nodes.append(subprocess.Popen(["bash", "-c", task["run"]], env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=900) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                kill_tree(p)
    assert codes == [0, 0], outputs(tmp_path, logs)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["completed"] == ["sft"]
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["accelerate"]["num_machines"], plan["accelerate"]["main_process_ip"]) == (2, "127.0.0.1")
    assert (run / "logs" / "train.log").stat().st_size and (run / "logs" / "train.node1.log").stat().st_size


def test_restarts_round_trip_summary_json_and_name_the_replaced_nodes():
    """summary.json `restarts` reads back as written (a key this rlctl does not know kept); the nodes whose agent
    counts fewer restarts than the survivors' are the replaced ones."""
    from rlctl.launch.restarts import ProcessStart, lost_nodes
    from rlctl.rundir import Summary

    written = {"run": "r", "model": "m", "stages": {}, "completed": []}
    written["restarts"] = [
        {"restart": 1, "lost_nodes": [1], "stage": "rl", "reached_step": 7, "resumed_from": "rl/checkpoints/x-6",
         "time": 1.5, "later_key": True},
        {"restart": 2, "lost_nodes": [], "stage": "rl", "reached_step": 9, "resumed_from": None, "time": 2.0},
    ]  # fmt: skip
    assert Summary.from_json(written).to_json() == written
    starts = [ProcessStart(0, 2), ProcessStart(0, 2), ProcessStart(1, 0), ProcessStart(2, 1), ProcessStart(1, 0)]
    assert lost_nodes(starts) == [1, 2]
    assert lost_nodes([ProcessStart(0, 1), ProcessStart(1, 1)]) == []  # a process failed, no node was replaced
