"""The CLI as a user runs it: fast torch-free help and plan, clear exit-2 errors, init, presets, packaging."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import RLCTL, rlctl

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--preset", "qwen7b-grpo"], ["presets", "list"]])
def test_cli_never_imports_torch(argv):
    code = (
        "import sys\nfrom rlctl.cli import main\nsys.argv = ['rlctl', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in proc.stderr, proc.stderr


def test_version():
    proc = rlctl("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("rlctl ")


def test_plan_json():
    proc = rlctl("plan", "--preset", "qwen7b-grpo", "--json", "--run-dir", "runs/x")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["config"]["model"]["name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert [s["name"] for s in plan["stages"]] == ["rl"]
    assert plan["launch"] == "accelerate launch --config_file runs/x/accelerate.yaml -m rlctl.launch.runner runs/x"
    assert plan["hardware"]["gpu_memory_gib"] == 80


def test_plan_rich_summary_names_stages_and_command():
    proc = rlctl("plan", "--preset", "tiny-demo", "--run-dir", "runs/t")
    assert proc.returncode == 0, proc.stderr
    for text in ("sft", "rm", "rl (grpo)", "accelerate launch --config_file runs/t/accelerate.yaml"):
        assert text in proc.stdout


def assert_bad_input(proc, *needles: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out.replace("\n", " "), out


def test_unknown_preset(tmp_path):
    assert_bad_input(
        rlctl("train", "--preset", "qwen7b-grop", "--run-dir", str(tmp_path / "r")),
        "Unknown preset 'qwen7b-grop'",
        "qwen7b-grpo",
    )
    assert not (tmp_path / "r").exists(), "nothing may be started"


def test_mistyped_key():
    assert_bad_input(
        rlctl("plan", "--preset", "tiny-demo", "--set", "sft.learnig_rate=1e-4"),
        "sft.learnig_rate",
        "Did you mean: learning_rate",
    )


def test_invalid_algorithm():
    assert_bad_input(rlctl("plan", "--preset", "tiny-demo", "--algorithm", "gpro"), "gpro", "grpo")


def test_missing_dataset(tmp_path):
    missing = tmp_path / "nope.jsonl"
    proc = rlctl("train", "--preset", "qwen0.5b-grpo", "--set", f"data.rl={missing}", "--run-dir", str(tmp_path / "r"))
    assert_bad_input(proc, "Dataset file not found", "nope.jsonl")
    assert not (tmp_path / "r" / "config.yaml").exists()


def test_malformed_dataset_names_file_and_line(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3=", oops}\n')
    proc = rlctl("train", "--preset", "qwen0.5b-grpo", "--set", f"data.rl={bad}", "--run-dir", str(tmp_path / "r"))
    assert_bad_input(proc, "prompts.jsonl:3")


def test_dataset_missing_column(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    proc = rlctl("train", "--preset", "qwen0.5b-grpo", "--set", f"data.rl={bad}", "--run-dir", str(tmp_path / "r"))
    assert_bad_input(proc, "prompts.jsonl:2", "answer")


def test_missing_data_for_stage(tmp_path):
    assert_bad_input(rlctl("train", "--preset", "qwen7b-grpo", "--run-dir", str(tmp_path / "r")), "data.rl")


def test_usage_error_exits_2():
    assert rlctl("train", "--no-such-flag").returncode == 2


def test_only_the_invoked_command_is_built_yet_every_name_still_resolves():
    """main() hands Typer only the command on the command line; misspellings, root options before the command,
    sub-apps and per-command help behave as with the full set."""
    assert_bad_input(rlctl("plna", "--preset", "tiny-demo"), "No such command 'plna'", "plan")
    proc = rlctl("-v", "presets", "list")
    assert proc.returncode == 0 and "tiny-demo" in proc.stdout, proc.stderr
    proc = rlctl("plan", "--help")
    assert proc.returncode == 0 and "--hardware" in proc.stdout and "--out" not in proc.stdout
    proc = rlctl("--help")
    assert proc.returncode == 0 and all(c in proc.stdout for c in ("plan", "train", "resume", "export", "presets"))


def test_presets_list_and_show():
    proc = rlctl("presets", "list")
    assert proc.returncode == 0, proc.stderr
    for name in (
        "tiny-demo",
        "qwen0.5b-grpo",
        "qwen7b-grpo",
        "qwen7b-sft",
        "qwen7b-dpo",
        "llama8b-grpo",
        "Qwen/Qwen2.5-7B-Instruct",
        "1xH100-80GB",
    ):
        assert name in proc.stdout
    proc = rlctl("presets", "show", "qwen7b-grpo", "--resolved")
    assert proc.returncode == 0 and "name_or_path: Qwen/Qwen2.5-7B-Instruct" in proc.stdout
    assert_bad_input(rlctl("presets", "show", "tiny-dem"), "tiny-demo")


def test_init_scaffolds_a_project_that_plans(tmp_path):
    proj = tmp_path / "proj"
    proc = rlctl("init", str(proj), "--preset", "tiny-demo")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((proj / "rlctl.yaml").read_text())
    assert cfg["defaults"] == ["tiny-demo"]
    assert cfg["data"] == {
        "generate": None,
        **{key: f"data/{key}.jsonl" for key in ("sft", "preference", "rl", "eval")},
    }, "the data is wired in, not commented out"
    assert (proj / "rewards.py").is_file()
    plan = rlctl("plan", "--json", cwd=proj)
    assert plan.returncode == 0, plan.stderr
    out = json.loads(plan.stdout)
    assert out["config"]["name"] == "my-run", "rlctl.yaml in the folder is picked up"
    assert out["config"]["data"]["rl"] == "data/rl.jsonl"
    assert_bad_input(rlctl("init", str(proj)), "already exists")


def test_init_template_reward_plugin_loads(tmp_path):
    from rlctl import rewards

    rlctl("init", str(tmp_path / "p"))
    fn = rewards.resolve(f"{tmp_path / 'p' / 'rewards.py'}:short_answer")
    assert fn(["1+1="], ["2"], answer=["2"]) == [1.0]
    assert fn(["1+1="], ["2222"], answer=["2"]) == [0.25]


def test_wheel_ships_presets_and_templates(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("rlctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "rlctl/_data/presets/recipes/tiny-demo.yaml" in names
    assert "rlctl/_data/templates/project/rlctl.yaml" in names
    assert "rlctl/_data/plugins/example_rewards.py" in names


def test_entry_point_exists():
    assert Path(RLCTL).name == "rlctl"


def test_help_keeps_brackets_as_typed():
    # rich markup would eat `[gguf]` and leave `pip install 'rlctl'`, an install command that installs nothing extra
    proc = rlctl("export", "--help")
    assert proc.returncode == 0 and proc.stdout.count("rlctl[gguf]") == 2, proc.stdout


@pytest.mark.slow
def test_train_takes_a_blank_omp_num_threads_as_unset(tmp_path):
    """`export OMP_NUM_THREADS=` (a blank left by a shell profile or a container template) stopped the launch in
    accelerate's int(); rlctl drops the blank and the run gets its default thread count."""
    args = ["--preset", "tiny-demo", "--stages", "sft", "--set", "sft.max_steps=1", "--run-dir", str(tmp_path / "r")]
    proc = rlctl("train", *args, env={"OMP_NUM_THREADS": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
