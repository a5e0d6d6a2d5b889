"""The CLI read as a user reads it at 80 columns, into a pipe and on a pseudo-terminal (pexpect): names, paths,
commands and YAML are never split across lines; `rlctl init` gives, for every recipe, a project whose printed next
command plans as printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pexpect
import pytest
import yaml

from rlctl.config import presets
from tests.helpers import RLCTL, rlctl

NARROW = {"COLUMNS": "80"}
RECIPES = [name for name, p in presets.all_presets().items() if p.kind == "recipes"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(*args: str, cwd: Path | None = None) -> str:
    """What `rlctl ARGS` writes to an 80-column pseudo-terminal, colours stripped, one entry per written line
    (a line the terminal itself wraps stays one line here, as the terminal copies it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    child = pexpect.spawn(RLCTL, list(args), cwd=cwd, env=env, dimensions=(50, 80), encoding="utf-8", timeout=120)
    text = child.read()
    child.close()
    assert child.exitstatus == 0, text
    return ANSI.sub("", text).replace("\r\n", "\n")


def test_presets_list_keeps_names_and_models_whole(tmp_path):
    piped = rlctl("presets", "list", env=NARROW)
    assert piped.returncode == 0, piped.stderr
    recipes = json.loads(rlctl("presets", "list", "--json").stdout)["recipes"]
    assert [r["name"] for r in recipes] == RECIPES
    for text in (piped.stdout, on_terminal("presets", "list")):
        lines = text.splitlines()
        for r in recipes:  # the name and its model on one line, neither split
            assert any(r["name"] in line and r["model"] in line for line in lines), (r, text)
        assert "reinforce-pp-baseline" in text


def test_presets_show_redirected_is_the_preset_file(tmp_path):
    proc = rlctl("presets", "show", "tiny-demo", env=NARROW)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == presets.get("tiny-demo").path.read_text()
    resolved = yaml.safe_load(rlctl("presets", "show", "tiny-demo", "--resolved", env=NARROW).stdout)
    assert resolved["model"]["name_or_path"] == "builtin:tiny" and resolved["stages"] == ["sft", "rm", "rl"]


def test_plan_launch_command_is_one_pasteable_line(tmp_path):
    run_dir = "runs/a-rather-long-folder-name/for-the-launch-command-to-need-two-lines"
    command = f"accelerate launch --config_file {run_dir}/accelerate.yaml -m rlctl.launch.runner {run_dir}"
    piped = rlctl("plan", "--preset", "qwen7b-grpo", "--set", "data.generate=arithmetic", "--run-dir", run_dir,
                  env=NARROW)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    screen = on_terminal("plan", "--preset", "tiny-demo", "--run-dir", run_dir, cwd=tmp_path)
    for text in (piped.stdout, screen):
        assert f"Launch {command}\n" in text, text
        assert "rl/final" in text and "sft/final" not in piped.stdout
    assert all(len(line) <= 80 for line in screen.splitlines() if not line.startswith(("Launch", "Run "))), screen


def test_help_says_what_to_type():
    plan = rlctl("plan", "--help", env=NARROW).stdout
    for metavar in ("KEY=VALUE", "RUN_DIR", "FILE", "HOST[:PORT]"):
        assert metavar in plan, plan
    evaluate = rlctl("eval", "--help", env=NARROW).stdout
    for text in (plan, evaluate, rlctl("presets", "show", "--help", env=NARROW).stdout):
        assert "<bool>" not in text and "<list[str]>" not in text and "{" not in text, text
    assert "RUN_DIR/eval/<data>.json" in evaluate and "…" not in evaluate, evaluate


def test_doctor_fits_80_columns():
    screen = on_terminal("doctor", "--offline")
    for name in ("huggingface_hub", "disk (Hugging Face cache)", "bitsandbytes"):
        assert re.search(rf"^ *\w+ +{re.escape(name)} ", screen, re.M), screen
    assert "…" not in screen and all(len(line) <= 80 for line in screen.splitlines() if "fix" not in line)


@pytest.mark.parametrize("recipe", RECIPES)
def test_init_next_command_plans_as_printed(recipe, tmp_path):
    """For every recipe: `rlctl init DIR --preset R`, then its printed next command up to `rlctl train`, as a
    user pastes it; the plan finds every dataset its stages read."""
    proc = rlctl("init", "proj", "--preset", recipe, cwd=tmp_path, env=NARROW)
    assert proc.returncode == 0, proc.stderr
    printed = next(line for line in proc.stdout.splitlines() if line.startswith("Next: "))
    assert printed == "Next: cd proj && rlctl plan && rlctl train", printed
    plan = printed.removeprefix("Next: ").removesuffix(" && rlctl train")
    env = {**os.environ, **NARROW, "PATH": f"{Path(RLCTL).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", plan], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needs data" not in done.stdout + done.stderr, done.stdout
    cfg = yaml.safe_load((tmp_path / "proj" / "rlctl.yaml").read_text())
    for key, path in cfg["data"].items():
        assert key == "generate" or (tmp_path / "proj" / path).is_file(), (key, path)
    assert shlex.split(plan)[-2:] == ["rlctl", "plan"]


@pytest.mark.slow
def test_eval_json_is_the_metrics_on_stdout(demo_run: Path, tmp_path: Path):
    proc = rlctl(
        "eval", str(demo_run), "--data", str(demo_run / "data" / "eval.jsonl"), "--limit", "4",
        "--max-new-tokens", "4", "--out", str(tmp_path / "e.json"), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads((tmp_path / "e.json").read_text())
    assert "Evaluation" in proc.stderr, "the table goes to stderr"
