"""Plain helpers the test modules share (fixtures live in conftest.py): run the real `rlctl` CLI in a subprocess,
read a run's records, kill a run after a checkpoint, a free local port, an interpreter without some packages."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlctl.processes import free_port  # noqa: F401  (the tests take it from here)

RLCTL = shutil.which("rlctl", path=str(Path(sys.executable).parent)) or "rlctl"

# An interpreter on which these modules are absent: a None in sys.modules is what Python's import system reads as
# "not importable" (import raises ImportError, importlib.util.find_spec answers None).
HIDE = """
import sys
for name in {names!r}:
    sys.modules[name] = None
"""


def rlctl(*args: str, cwd: Path | None = None, timeout: float = 1800, env: dict | None = None):
    """`rlctl ARGS` as a user would type it; returns the CompletedProcess (text output)."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([RLCTL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


# `rlctl plan --json ARGS` in a fresh interpreter (ARGS as JSON in argv[1]), printing the plan and which of torch
# and vllm the plan imported.
_PLAN_SCRIPT = """
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
sys.argv = ["rlctl", "plan", "--json", *args]
from rlctl.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        main()
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps({"plan": json.loads(out.getvalue()), "torch": "torch" in sys.modules, "vllm": "vllm" in sys.modules}))
"""


def plan_in_fresh_interpreter(*args: str) -> dict:
    """`rlctl plan --json ARGS` run in a new interpreter: {"plan": the plan, "torch": bool, "vllm": bool}, the last
    two saying whether planning imported them."""
    proc = subprocess.run(
        [sys.executable, "-c", _PLAN_SCRIPT, json.dumps(list(args))], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def strict_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl as a strict JSON reader sees it (NaN and Infinity refused); every line must parse."""
    from rlctl import strictjson

    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [strictjson.loads(line) for line in lines if line.strip()]


def summary(run_dir: Path) -> dict:
    """summary.json of a run; its metrics.jsonl and summary.json must be strict JSON too."""
    from rlctl import strictjson

    strict_records(run_dir)
    return strictjson.loads((run_dir / "summary.json").read_text())


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl of a run that may still be running (none yet: [])."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def kill_after_checkpoint(run_dir: Path, cmd: list[str], stage: str, every: int) -> None:
    """Start `cmd`, wait until `stage` has a complete checkpoint and has trained past it, then kill -9 it all."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline:
            steps = [r["step"] for r in records(run_dir) if r.get("stage") == stage and "step" in r]
            done = list((run_dir / stage / "checkpoints").glob("checkpoint-*/rlctl_complete"))
            if done and steps and steps[-1] % every != 0 and steps[-1] > every:
                break
            assert proc.poll() is None, f"the run ended before {stage} could be interrupted"
            time.sleep(0.05)
        else:
            raise AssertionError(f"{stage} never reached a checkpoint")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_once(tmp_path_factory, name: str, *args: str) -> Path:
    """`rlctl train ARGS` into a run folder that every pytest-xdist worker of this test run shares: the first
    worker to ask trains it, the others wait on its lock and read the same finished run."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    run_dir = shared / name / "run"
    with FileLock(str(shared / f"{name}.lock")):
        if not (run_dir / "summary.json").exists():
            proc = rlctl("train", *args, "--run-dir", str(run_dir))
            assert proc.returncode == 0, proc.stdout + proc.stderr
    strict_records(run_dir)
    return run_dir


def injected(tmp_path: Path, source: str, folder: str = "inject") -> dict[str, str]:
    """Environment for an `rlctl` subprocess whose every Python process runs `source` at start-up (a
    sitecustomize.py in tmp_path/folder, ahead of the PYTHONPATH it had): how tests inject faults."""
    site = tmp_path / folder
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}


def without(tmp_path: Path, names: list[str]) -> dict[str, str]:
    """Environment for an `rlctl` subprocess on which the modules `names` are not importable."""
    return injected(tmp_path, HIDE.format(names=names), "site")


def assert_cpu_precision(layout: dict) -> None:
    """Every stage ran what its plan said, and in the CPU plan's one precision: fp32 weights that train and fp32
    frozen ones, no autocast, 4-bit layers computing in fp32, fp32 reference, reward model and critic."""
    for stage, record in layout.items():
        assert record["mismatches"] == [], (stage, record["mismatches"])
        live = record["observed"]
        assert record["planned"]["autocast"] == live["autocast"] == "no", stage
        assert live["trainable_dtype"] == "float32" and live["frozen_dtype"] in ("", "float32"), stage
        for key in ("linear4bit_compute_dtype", "reference_dtype", "reward_model_dtype", "critic_dtype"):
            assert live.get(key, "float32") == "float32", (stage, key, live.get(key))
        assert live["optimizer_state"]["dtypes"] == ["float32"], stage


# The short run every two-node launch test trains (SLURM, SkyPilot): SFT of the tiny demo, 3 steps, on 2 CPU nodes.
TWO_NODE_RUN = ("--preset", "tiny-demo", "--hardware", "cpu", "--nodes", "2", "--stages", "sft")
TWO_NODE_RUN += ("--set", "sft.max_steps=3", "--set", "rl.eval_samples=8")
# what a scheduler sets for a node: a local "node" must not inherit them from the machine running the tests
SCHEDULER_VARS = ("JOB_COMPLETION_INDEX", "SKYPILOT_", "SLURM_", "TORCHELASTIC_", "RLCTL_NODE_RANK")


def node_env(given: dict[str, str]) -> dict[str, str]:
    """A local node's environment: this machine's (the image's: this rlctl first on PATH) without scheduler
    variables or credentials, plus what the job file and the scheduler give it (`given`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_VARS)}
    env = {k: v for k, v in env.items() if k not in ("HF_TOKEN", "WANDB_API_KEY")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env | given


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a local node's whole process tree at once, as a machine that vanished takes it."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    proc.wait()


def outputs(folder: Path, names: list[str]) -> str:
    """The last lines of each of the files `names` in `folder`: what failing nodes printed."""
    return "\n".join(f"--- {n}\n{(folder / n).read_text()[-3000:]}" for n in names if (folder / n).exists())
