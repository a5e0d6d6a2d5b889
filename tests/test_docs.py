"""The docs cannot drift from the code: generated pages and tables match what the code generates now, the
troubleshooting messages exist in the source, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.cli import docs_gen

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def test_generated_docs_match_the_code():
    stale = [
        str(path.relative_to(REPO))
        for path, text in docs_gen.expected().items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"stale generated docs: {stale}; run `python -m rlctl.cli.docs_gen` and commit the result"


def test_generated_content_covers_the_code():
    from rlctl import config, data, rewards
    from rlctl.after import doctor
    from rlctl.config import presets

    reference = (DOCS / "config.md").read_text()
    for key in ("data.columns", "data.answer_field", "rl.rewards[].name", "model.adapter", "logging.report_to"):
        assert f"`{key}`" in reference, key
    assert config.DataConfig.model_fields["columns"].description.split(";")[0] in reference
    catalogue = (DOCS / "presets.md").read_text()
    assert all(f"`{name}`" in catalogue for name in presets.all_presets())
    cli = (DOCS / "cli.md").read_text()
    for command in (
        "rlctl eval",
        "rlctl report",
        "rlctl doctor",
        "rlctl rewards test",
        "rlctl export",
        "--push",
        "--adapter",
    ):
        assert command in cli, command
    assert all(f"`{fmt}`" in (DOCS / "datasets.md").read_text() for fmt in data.FORMATS)
    assert all(f"`{name}`" in (DOCS / "rewards.md").read_text() for name in rewards.BUILTINS)
    assert all(f"`{row.spec}`" in (DOCS / "getting-started.md").read_text() for row in doctor.MATRIX)


def test_a_changed_description_makes_the_docs_stale(monkeypatch):
    from rlctl.config import DataConfig

    field = DataConfig.model_fields["answer_field"]
    monkeypatch.setattr(field, "description", "A different description.")
    assert "A different description." in docs_gen.config_md()
    assert docs_gen.config_md() != (DOCS / "config.md").read_text()


def test_troubleshooting_lists_ten_errors_whose_messages_exist_in_the_code():
    text = (DOCS / "troubleshooting.md").read_text()
    assert len(re.findall(r"^## \d+\. ", text, re.MULTILINE)) == 10
    source = "\n".join(p.read_text() for p in (REPO / "rlctl").rglob("*.py"))
    messages = re.findall(r"<!-- message: (.+?) -->", text)
    assert len(messages) >= 10
    missing = [m for m in messages if m not in source]
    assert not missing, f"troubleshooting quotes messages the code no longer prints: {missing}"


def test_relative_links_resolve():
    pages = [*DOCS.glob("*.md"), REPO / "README.md", REPO / "plugins" / "README.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
    assert "(memory-planner.md)" in (DOCS / "hardware.md").read_text()


# ---------------------------------------------------------------------------------- the CLI's feel
def test_shell_completion_knows_the_new_commands():
    from tests.helpers import rlctl

    # Typer reads the shell from the process tree (CI's is sh); its own switch makes the option take one
    script = rlctl("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_rlctl_completion" in script.stdout
    words = rlctl(env={"_RLCTL_COMPLETE": "complete_bash", "COMP_WORDS": "rlctl rew", "COMP_CWORD": "1"})
    assert words.stdout.split() == ["rewards"]
    options = rlctl(env={"_RLCTL_COMPLETE": "complete_bash", "COMP_WORDS": "rlctl eval x --sa", "COMP_CWORD": "3"})
    assert options.stdout.split() == ["--samples"]


def test_quiet_keeps_errors_and_results_and_output_has_no_colour_codes(tmp_path):
    from tests.helpers import rlctl

    (tmp_path / "s.jsonl").write_text('{"prompt": "1+1=", "completion": "2", "answer": "2"}\n')
    quiet = rlctl("-q", "rewards", "test", "--data", str(tmp_path / "s.jsonl"), "-r", "exact_match")
    assert quiet.returncode == 0 and "exact_match x1" in quiet.stdout, "the result table prints even with --quiet"
    bad = rlctl(
        "-q", "train", "--preset", "qwen0.5b-grpo", "--set", "data.rl=/nope.jsonl", "--run-dir", str(tmp_path / "r")
    )
    assert bad.returncode == 2 and "Dataset file not found" in bad.stderr, "errors print even with --quiet"
    plan = rlctl("plan", "--preset", "tiny-demo")
    assert plan.returncode == 0 and "\x1b[" not in plan.stdout + plan.stderr, "no colour codes when not a terminal"
    both = rlctl("-q", "-v", "doctor")
    assert both.returncode == 2 and "contradict" in both.stderr
