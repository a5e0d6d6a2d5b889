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
    resume = rlctl("resume", "--help", env=NARROW).stdout
    for text in (plan, evaluate, resume, rlctl("presets", "show", "--help", env=NARROW).stdout):
        assert "<bool>" not in text and "<list[str]>" not in text and "{" not in text, text
        assert "<path>" not in text, "an argument's name says what to type, Typer's type column repeats it"
    assert re.search(r"RUN_DIR +Run directory to continue", resume), resume
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
    assert "\n\n" not in proc.stderr, "off a terminal no bar: no blank line where its frame was"


def test_plan_tables_keep_long_paths_whole(tmp_path):
    """A stage that starts from a long path (the converted GGUF in the cache) and a dataset in a deep folder: at 80
    columns, piped and on a terminal, the Stages and Data tables print a block per row instead of cutting the path
    with "…" or folding it mid-word."""
    deep = tmp_path / "a-rather-long-folder-name" / "with-another-level-of-nesting" / "my-training-prompts-v2.jsonl"
    deep.parent.mkdir(parents=True)
    deep.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    args = ("plan", "--preset", "smollm2-grpo-cpu", "--set", f"data.rl={deep}", "--run-dir", "runs/x")
    starts_from = json.loads(rlctl(*args, "--json", cwd=tmp_path).stdout)["stages"][0]["init_from"]
    piped = rlctl(*args, cwd=tmp_path, env=NARROW)
    assert piped.returncode == 0, piped.stderr
    for text in (piped.stdout, on_terminal(*args, cwd=tmp_path)):
        assert "…" not in text, text
        for path in (starts_from, str(deep)):
            assert re.search(rf"^ +\w[\w ]* +{re.escape(path)}$", text, re.M), (path, text)


@pytest.mark.slow
def test_train_piped_prints_a_line_per_logged_step_and_no_frame(tmp_path):
    """Off a terminal `rlctl train` prints plain lines: exactly one per step each stage logged to metrics.jsonl
    (logging.every), in step order, none twice, and no frame of the progress bars (rich printed their last frame
    cut to 80 columns: `s…`, `b…`, `r…`); a held-out scoring under way prints its own lines."""
    run_dir = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "sft,rm", "--set", "sft.max_steps=7", "--set", "rm.max_steps=4",
        "--set", "logging.every=2", "--run-dir", str(run_dir), env=NARROW,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = proc.stdout.split("Summary (held-out)")[0]
    assert not re.search(r"[…━╸\r]|\x1b\[", shown), proc.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for stage in ("sft", "rm"):
        logged = [r["step"] for r in records if r.get("stage") == stage and "step" in r and "event" not in r]
        printed = [int(n) for n in re.findall(rf"^{stage} step (\d+)/\d+  ", proc.stdout, re.M)]
        assert logged and printed == logged, (stage, logged, proc.stdout)
        assert logged[-1] == (7 if stage == "sft" else 4)  # the last step is logged, logging.every or not
    progress = [line for line in proc.stdout.splitlines() if line.startswith(("sft ", "rm ", "base "))]
    assert all(re.match(r"(sft|rm) (step \d+/\d+  .*ETA|scoring \w+ \d+/\d+ rows  ETA)", x) for x in progress), progress
    assert len(progress) == len(set(progress)), "no line repeats"


def test_a_table_too_wide_prints_a_line_per_value():
    """rlctl.tables.show: a table that fits prints as is; a path longer than its column prints whole, a key and
    value per line (two columns) or a block per row, never cut with "…" nor folded."""
    import io

    from rich.console import Console
    from rich.table import Table

    from rlctl import tables

    path = "/a/rather/long/path/" + "x" * 70 + "/model.safetensors"
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False)
    small = Table(title="Small")
    small.add_column("metric")
    small.add_column("value", no_wrap=True)
    small.add_row("model", "runs/a/rl/final")
    tables.show(console, small)
    assert "┃ metric" in out.getvalue() and "runs/a/rl/final" in out.getvalue()
    for cols, expected in ((2, f"  model  {path}\n"), (3, f"model\n  value  {path}\n  note   fine\n")):
        out.truncate(0), out.seek(0)
        table = Table(title="Evaluation")
        for name in ("metric", "value", "note")[:cols]:
            table.add_column(name, no_wrap=name == "value")
        table.add_row(*("model", path, "fine")[:cols])
        tables.show(console, table)
        assert out.getvalue() == "Evaluation\n" + expected, out.getvalue()
    out.truncate(0), out.seek(0)
    table = Table(title="Recipes")
    table.add_column("name", no_wrap=True)
    table.add_column("model, description")
    table.add_row("smollm2-grpo-cpu", f"{path}  grpo\nGRPO on CPU.")
    table.add_row("", "")  # a spacer row prints nothing
    tables.show(console, table)
    assert out.getvalue() == f"Recipes\n  smollm2-grpo-cpu  {path}  grpo\n{' ' * 20}GRPO on CPU.\n", out.getvalue()


def test_progress_bars_keep_stage_names_and_metrics_whole():
    """On an 80-column terminal the bars' last frame stays on screen: the stage name, the step count and every
    metric whole (a 40-wide bar left `r…` and `eval_reward …`)."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from rlctl.launch.live import bar_columns

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    progress = Progress(*bar_columns(), console=console, auto_refresh=False)
    info = "loss 0.001654  reward 1.155  kl 0.04221  eval_accuracy 0.950  eval_reward 0.961"
    progress.add_task("rl", total=60, completed=60, info=info, eta="ETA 0s")
    console.print(progress.make_tasks_table(progress.tasks))
    text = out.getvalue()
    assert "…" not in text and re.match(r"rl +━+ 60/60 ", text), text
    assert all(word in text.split() for word in info.split()), text


def test_train_summary_fits_80_columns_as_a_table():
    """The held-out summary a run prints last: a row per metric and a column per stage, so that a run with tool
    metrics (eight of them) still prints a table at 80 columns, every name whole."""
    import io

    from rich.console import Console

    from rlctl import tables
    from rlctl.launch.live import summary_table
    from rlctl.rundir import Summary

    keys = ("accuracy", "reward", "rows", "tool_call_rate", "tool_calls", "tool_errors", "turns", "margin")
    stages = {s: {f"eval_{k}": 0.123456 for k in keys} for s in ("base", "sft", "rm", "rl")}
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False)
    table = summary_table(Summary.from_json({"stages": stages}))
    assert tables.fits(console, table)
    tables.show(console, table)
    for k in keys:
        assert re.search(rf"┃? *eval_{k} +│ +0\.1235 │", out.getvalue()), out.getvalue()
    assert "…" not in out.getvalue()


@pytest.mark.slow
def test_train_on_a_terminal_keeps_the_command_and_stage_names_whole(tmp_path):
    """`rlctl train` on an 80-column terminal: the launch command on one line (it pastes as is), the bars' last
    frame with whole stage names and no "…"."""
    run_dir = "runs/a-rather-long-folder-name/for-the-command-to-need-two-lines"
    screen = on_terminal(
        "train", "--preset", "tiny-demo", "--stages", "sft,rm", "--set", "sft.max_steps=3", "--set", "rm.max_steps=2",
        "--run-dir", run_dir, cwd=tmp_path,
    )  # fmt: skip
    command = f"accelerate launch --config_file {run_dir}/accelerate.yaml -m rlctl.launch.runner {run_dir}\n"
    assert command in screen and "…" not in screen, screen
    last_frame = screen.split("Summary (held-out)")[0].rsplit("\r", 1)[-1]  # each frame starts at a carriage return
    assert re.search(r"^sft +━+ 3/3 ", last_frame, re.M) and re.search(r"^rm +━+ 2/2 ", last_frame, re.M), screen
    assert f"Export with: rlctl export {run_dir} --out {run_dir}/export\n" in screen, screen


def test_gguf_import_lines_keep_the_cached_folder_whole(monkeypatch):
    """`rlctl train` of a GGUF recipe says where the converted model is cached: one line, the path unfolded (piped
    at 80 columns it came out as `...ea3737` / `28110db53-float32`)."""
    import io

    from rich.console import Console

    from rlctl import launch
    from rlctl.plan.gguf import GgufImport, ImportRecord
    from rlctl.stages import gguf_import

    folder = "/root/.cache/rlctl/gguf/" + "b179c9523d0e6a0f98a330c7562b682750a6f8c8" * 2 + "-float32"

    def ensure(spec, say):
        say(f"SmolLM2-135M-Instruct.Q4_1.gguf: converted already ({folder})")
        return gguf_import.Imported(Path(folder), ImportRecord(source=spec.file, sha256=""), converted_now=False)

    monkeypatch.setattr(gguf_import, "ensure", ensure)
    out = io.StringIO()
    spec = GgufImport("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1", 90.0, folder, "float32", True, 540.0, 20)
    launch.import_model(spec, Console(file=out, width=80), quiet=False)
    assert out.getvalue() == f"Model SmolLM2-135M-Instruct.Q4_1.gguf: converted already ({folder})\n"


def test_plan_stage_table_with_epochs_stays_a_table_at_80_columns(tmp_path):
    """Three stages planned by epochs (`45 (1 ep.)` in the steps column) still fit 80 columns as a table, a row
    per stage."""
    args = ("plan", "--preset", "tiny-demo", "--set", "sft.epochs=1", "--set", "rm.epochs=1", "--run-dir", "runs/x")
    piped = rlctl(*args, cwd=tmp_path, env=NARROW)
    assert piped.returncode == 0, piped.stderr
    for text in (piped.stdout, on_terminal(*args, cwd=tmp_path)):
        assert re.search(r"^sft +base +\d+ \(1 ep\.\) +64 +64 x 1 +[\d.e-]+ +sft/final *$", text, re.M), text
        assert re.search(r"^rm +sft/final +\d+ \(1 ep\.\) ", text, re.M), text


def test_a_run_without_held_out_metrics_ends_with_one_line_not_an_empty_table():
    import io

    from rich.console import Console

    from rlctl.launch.live import show_summary
    from rlctl.rundir import Summary

    out = io.StringIO()
    show_summary(Console(file=out, width=80), Summary.from_json({"stages": {"sft": {}}}))
    assert out.getvalue() == "No held-out metrics: set data.eval to score each policy stage after training.\n"
    out = io.StringIO()
    show_summary(
        Console(file=out, width=80), Summary.from_json({"stages": {"base": {"eval_accuracy": 0.25}, "sft": {}}})
    )
    assert "Summary (held-out)" in out.getvalue() and "0.25" in out.getvalue()
