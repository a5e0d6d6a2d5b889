"""Multi-node: the exact accelerate config and launch command per node, the rules on node rank and rendezvous
address, the SLURM script line by line, and the script itself running a real 2-node x 1-process CPU run (two
`rlctl train` process trees on one machine sharing a run directory, meeting at localhost): SFT, then async RL
with a generator engine on each node, node 1's taking every weight push from node 0's trainer over TCP."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import TWO_NODE_RUN, free_port, node_env, outputs, records, rlctl

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
        f"--main_process_ip 10.0.0.1 --main_process_port 29500 -m rlctl.launch.runner {run}"
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
    assert plan["launch"] == f"accelerate launch --config_file {run}/accelerate.yaml -m rlctl.launch.runner {run}"
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


def test_each_node_keeps_its_own_launch_log(tmp_path: Path):
    """Nodes share the run directory: node 0 writes logs/train.log, node R logs/train.nodeR.log."""
    from rlctl.rundir import RunDir

    assert RunDir(tmp_path).log(0) == tmp_path / "logs" / "train.log"
    assert RunDir(tmp_path).log(1) == tmp_path / "logs" / "train.node1.log"
    assert RunDir(tmp_path).log(15) == tmp_path / "logs" / "train.node15.log"


def _slurm(tmp_path: Path, *extra: str) -> tuple[Path, str]:
    run = tmp_path / "shared" / "q7"
    proc = rlctl("slurm", "--preset", "qwen7b-grpo", "--hardware", "2x8xH100-80GB", "--run-dir", str(run), *extra)
    assert proc.returncode == 0, proc.stderr
    return run, proc.stdout


def test_slurm_script_line_by_line(tmp_path: Path):
    from rlctl import __version__

    run, text = _slurm(tmp_path, "--set", "rl.rewards=[{name: gsm8k}]", "--time", "24:00:00")
    expected = f"""#!/bin/bash
# Written by rlctl {__version__}: qwen7b-grpo on 2 node(s) x 8 x H100-80GB = 16 processes, run directory {run}.
# Submit with: sbatch THIS_FILE. The run directory must be on a filesystem every node shares, and rlctl on
# PATH on every node. A requeued job (preemption, time limit) resumes from the last complete checkpoint.
#SBATCH --job-name=rlctl-qwen7b-grpo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --requeue
#SBATCH --signal=B:TERM@120
#SBATCH --output={run}/logs/slurm-%j.out
#SBATCH --time=24:00:00

set -uo pipefail
RUN={run}
MAIN=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
if [ -f "$RUN/config.yaml" ]; then
  STEP=(rlctl resume "$RUN")
else
  STEP=(rlctl train --preset qwen7b-grpo --hardware 2x8xH100-80GB --set 'rl.rewards=[{{name: gsm8k}}]' --run-dir "$RUN")
fi
# one task per node; each takes its rank from SLURM
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  bash -c 'exec "$@" --node-rank "$SLURM_NODEID"' rlctl-node \\
  "${{STEP[@]}}" --nodes 2 --main-address "$MAIN:29500" &
SRUN=$!
STOPPED=0
# time limit or preemption: rlctl saves a checkpoint at the next step, then the job is requeued
trap 'STOPPED=1; kill -TERM "$SRUN" 2>/dev/null' TERM
wait "$SRUN"; CODE=$?
while [ "$STOPPED" = 1 ] && kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN"; CODE=$?; done
if [ "$STOPPED" = 1 ]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit "$CODE"
"""
    assert text.splitlines() == expected.splitlines()
    assert (run / "logs").is_dir()  # SLURM opens its --output file before the job starts


def test_slurm_script_runs_train_then_resume_with_each_nodes_rank(tmp_path: Path):
    """The script under a fake SLURM (scontrol, srun with two node ids) and a fake rlctl that records its argv."""
    run, text = _slurm(tmp_path, "--set", "rl.rewards=[{name: exact_match}]")
    job = tmp_path / "job.sbatch"
    job.write_text(text)
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    (fake / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && printf "gpu017\\ngpu018\\n"\n')
    (fake / "srun").write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
        'for id in 0 1; do SLURM_NODEID=$id "$@" || exit $?; done\n'
    )
    (fake / "rlctl").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_JOB_ID": "1"}
    first = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    (run / "config.yaml").write_text("name: q7\n")  # what node 0's `rlctl train` leaves: a requeue resumes
    second = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    train = (
        f"train --preset qwen7b-grpo --hardware 2x8xH100-80GB --set rl.rewards=[{{name: exact_match}}] --run-dir {run}"
    )
    node = "--nodes 2 --main-address gpu017:29500 --node-rank"
    assert calls.read_text().splitlines() == [
        f"{train} {node} 0",
        f"{train} {node} 1",
        f"resume {run} {node} 0",
        f"resume {run} {node} 1",
    ]


def test_slurm_refuses_what_would_fail_on_the_cluster(tmp_path: Path):
    proc = rlctl("slurm", "--preset", "qwen7b-grpo", "--hardware", "2x8xH100-80GB", "--nodes", "3", "--run-dir", "r")
    assert proc.returncode == 2 and "contradicts the hardware spec" in " ".join(proc.stderr.split())
    missing = rlctl("slurm", "--preset", "qwen7b-grpo")
    assert missing.returncode == 2 and "--run-dir" in missing.stderr


@pytest.mark.slow
def test_slurm_script_trains_two_nodes_on_cpu(tmp_path: Path):
    """The sbatch script itself runs a real two-node run (2 x 1 process over gloo) on this machine: SLURM's part is
    played by an `srun` that starts one task per node, each a process tree of its own with its SLURM_NODEID, and
    a `scontrol` that names the allocation's hosts (this machine); the batch shell has SLURM_JOB_NODELIST and
    SLURM_JOB_ID. The node rank, the rendezvous address and train-or-resume are the script's."""
    run = tmp_path / "shared" / "run"
    steps = 4  # SFT, then async RL with an engine on each node
    sets = ["rl.async_rollout.enabled=true", "rl.rewards=[{name: exact_match}]", f"rl.max_steps={steps}"]
    args = [a if a != "sft" else "sft,rl" for a in TWO_NODE_RUN] + [a for kv in sets for a in ("--set", kv)]
    proc = rlctl("slurm", *args, "--run-dir", str(run), "--port", str(free_port()))
    assert proc.returncode == 0, proc.stderr
    job = tmp_path / "job.sbatch"
    job.write_text(proc.stdout)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && printf "localhost\\nlocalhost\\n"\n')
    (fake / "srun").write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == --* ]]; do shift; done\n'
        f'SLURM_NODEID=0 setsid "$@" > {tmp_path}/node0.out 2>&1 & A=$!\n'
        f'SLURM_NODEID=1 setsid "$@" > {tmp_path}/node1.out 2>&1 & B=$!\n'
        'wait "$A"; a=$?; wait "$B"; b=$?\n'
        "exit $(( a ? a : b ))\n"
    )
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = node_env({"SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "1"})
    env["PATH"] = f"{fake}:{env['PATH']}"
    batch = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=900)
    logs = [run / "logs" / "train.log", run / "logs" / "train.node1.log"]
    assert batch.returncode == 0, batch.stderr + outputs(tmp_path, ["node0.out", "node1.out"])
    assert all(log.stat().st_size > 0 for log in logs)  # each node's launcher writes its own file
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["completed"] == ["sft", "rl"]
    plan = json.loads((run / "plan.json").read_text())
    accel = plan["accelerate"]
    assert (accel["num_machines"], accel["num_processes"], accel["main_process_ip"]) == (2, 2, "localhost")
    assert (run / "sft" / "final").is_dir() and (run / "rl" / "final").is_dir()
    # node 0's trainer sends node 1's engine its share of every round and every weight push over TCP (gloo)
    assert plan["async_split"]["engines"] == 2
    rollouts = plan["config"]["rl"]["prompts_per_step"] * plan["config"]["rl"]["group_size"]
    rl = [r for r in records(run) if r.get("stage") == "rl"]
    trained = [r for r in rl if "loss" in r]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    for r in trained:
        assert r["generator0_rollouts"] == r["generator1_rollouts"] == rollouts // 2, r
        assert r["staleness_max"] <= 1 and r["generator1_pushes"] >= max(r["step"] - 1, 1), r
    (ended,) = [r for r in rl if r.get("event") == "generators"]
    assert [(g["index"], g["node"]) for g in ended["generators"]] == [(0, 0), (1, 1)]
    for g in ended["generators"]:
        assert g["pushes"] == steps and g["rounds"] == steps  # the start's and one after each step but the last
    assert summary["layout"]["rl"]["observed"]["generators"] == 2 and not summary["layout"]["rl"]["mismatches"]
