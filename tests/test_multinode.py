"""Multi-node: the exact accelerate config and launch command per node, the rules on node rank and rendezvous
address, the SLURM script line by line, and a real 2-node x 1-process CPU run through the same launch path
(two `rlctl train` processes on one machine sharing a run directory over 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

from conftest import RLCTL, rlctl

MULTI = ("--hardware", "2x8xH100-80GB", "--nodes", "2", "--node-rank", "1", "--main-address", "10.0.0.1:29500")


def _plan(tmp_path: Path, *args: str) -> dict:
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--run-dir", str(tmp_path / "run"), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_multinode_accelerate_config_and_launch_are_exact(tmp_path: Path):
    plan = _plan(tmp_path, *MULTI)
    run = str(tmp_path / "run")
    assert plan["accelerate"] == {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "num_machines": 2,
        "machine_rank": 1,
        "num_processes": 16,
        "main_process_ip": "10.0.0.1",
        "main_process_port": 29500,
        "mixed_precision": "bf16",
        "use_cpu": False,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
        },
    }
    assert plan["launch"] == (
        f"accelerate launch --config_file {run}/accelerate.yaml --num_machines 2 --machine_rank 1 "
        f"--main_process_ip 10.0.0.1 --main_process_port 29500 -m rlctl.runner {run}"
    )
    assert plan["layout"] == {
        "nodes": 2,
        "gpus_per_node": 8,
        "processes_per_node": 8,
        "world_size": 16,
        "node_rank": 1,
        "main": "10.0.0.1:29500",
    }
    assert plan["hardware"]["nodes"] == 2 and plan["strategy"] == "fsdp2"
    hw = plan["config"]["hardware"]
    assert (hw["nodes"], hw["node_rank"], hw["main_address"], hw["main_port"]) == (2, 1, "10.0.0.1", 29500)


def test_single_node_launch_is_unchanged(tmp_path: Path):
    plan = _plan(tmp_path, "--hardware", "8xH100-80GB")
    run = str(tmp_path / "run")
    assert plan["launch"] == f"accelerate launch --config_file {run}/accelerate.yaml -m rlctl.runner {run}"
    assert plan["accelerate"]["num_machines"] == 1 and plan["accelerate"]["machine_rank"] == 0
    assert "main_process_ip" not in plan["accelerate"]
    assert plan["layout"]["main"] is None and plan["layout"]["world_size"] == 8


def test_nodes_flag_multiplies_a_single_node_spec_and_config_keys_work(tmp_path: Path):
    by_flag = _plan(tmp_path, "--hardware", "8xH100-80GB", "--nodes", "2", "--main-address", "node001")
    by_set = _plan(
        tmp_path,
        "--hardware",
        "8xH100-80GB",
        "--set",
        "hardware.nodes=2",
        "--set",
        "hardware.main_address=node001",
    )
    for plan in (by_flag, by_set):
        assert plan["accelerate"]["num_processes"] == 16 and plan["accelerate"]["machine_rank"] == 0
        assert plan["layout"]["main"] == "node001:29500"
        assert "--machine_rank 0 --main_process_ip node001 --main_process_port 29500" in plan["launch"]


def test_plan_shows_the_layout(tmp_path: Path):
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--run-dir", str(tmp_path / "run"), *MULTI)
    assert proc.returncode == 0, proc.stderr
    assert (
        "Layout 2 node(s) x 8 process(es) = world size 16, one process per GPU (H100 80 GiB); "
        "this node: rank 1 of 2, main 10.0.0.1:29500"
    ) in proc.stdout
    assert "Per GPU peak" in proc.stdout


def test_node_rank_out_of_range_is_refused(tmp_path: Path):
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--hardware", "2x8xH100-80GB", "--node-rank", "2")
    assert proc.returncode == 2
    assert "hardware.node_rank=2 is out of range: a 2-node run has node ranks 0 to 1" in " ".join(proc.stderr.split())


def test_nodes_contradicting_the_spec_is_refused():
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--hardware", "2x8xH100-80GB", "--nodes", "3")
    assert proc.returncode == 2
    assert "use --hardware 3x8xH100-80GB" in " ".join(proc.stderr.split())


def test_train_without_main_address_is_refused(tmp_path: Path):
    run = tmp_path / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--nodes", "2", "--run-dir", str(run))
    assert proc.returncode == 2
    assert "A 2-node run needs the rank-0 node's address" in " ".join(proc.stderr.split())
    assert not run.exists()
    bad = rlctl("plan", "--preset", "tiny-demo", "--nodes", "2", "--main-address", "10.0.0.1:notaport")
    assert bad.returncode == 2 and "is not HOST[:PORT]" in bad.stderr


def test_multinode_train_needs_a_run_dir():
    proc = rlctl("train", "--preset", "tiny-demo", "--nodes", "2", "--main-address", "127.0.0.1")
    assert proc.returncode == 2
    assert "needs --run-dir" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_one_process_each_on_cpu(tmp_path: Path):
    """Two `rlctl train` processes, node ranks 0 and 1, meet over torch.distributed (gloo) at 127.0.0.1."""
    run = tmp_path / "run"
    args = [
        "train",
        "--preset",
        "tiny-demo",
        "--hardware",
        "cpu",
        "--stages",
        "sft",
        "--set",
        "sft.max_steps=4",
        "--set",
        "rl.eval_samples=8",
        "--nodes",
        "2",
        "--main-address",
        f"127.0.0.1:{_free_port()}",
        "--run-dir",
        str(run),
    ]
    logs = [(tmp_path / f"node{r}.out").open("w") for r in (0, 1)]
    procs = [
        subprocess.Popen([RLCTL, *args, "--node-rank", str(r)], stdout=logs[r], stderr=subprocess.STDOUT)
        for r in (0, 1)
    ]
    started = time.monotonic()
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = [(tmp_path / f"node{r}.out").read_text() for r in (0, 1)]
    assert codes == [0, 0], "\n".join(outs) + (run / "logs" / "train.log").read_text()[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["completed"] == ["sft"]
    accel = json.loads((run / "plan.json").read_text())["accelerate"]
    assert (accel["num_machines"], accel["num_processes"], accel["main_process_ip"]) == (2, 2, "127.0.0.1")
    assert (run / "sft" / "final").is_dir()
    print(f"2-node CPU run: {time.monotonic() - started:.0f} s")
