"""`rlctl ui` as a careless or hostile visitor tries it: paths that lead outside the served folder by any route,
damaged run directories in the runs list, and a Stop aimed at a copied run directory. The page's own handlers are
called as the page calls them; the server and its token are tried over HTTP in tests/test_ui.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("gradio")

from rlctl.cli.web.wiring import Same

SECRET = "SECRET-OUTSIDE"
BASE_YAML = "defaults: [tiny, cpu]\nname: t\nstages: [sft]\nsft: {max_steps: 2, max_length: 16}\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A served folder with its own data, and beside it a folder the page must never read, reached by symlinks."""
    base = tmp_path_factory.mktemp("safety")
    root, outside = base / "served", base / "outside"
    root.mkdir()
    outside.mkdir()
    rows = [{"prompt": f"{SECRET} {i}+1=", "completion": str(i + 1)} for i in range(8)]
    (outside / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (outside / "t.jinja").write_text(f"{SECRET} {{{{ messages }}}}")
    mine = [{"prompt": f"{i}+2=", "completion": str(i + 2)} for i in range(8)]
    (root / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
    (root / "link.jsonl").symlink_to(outside / "data.jsonl")
    (root / "linkdir").symlink_to(outside)
    (root / "loop").symlink_to(root / "loop")
    (root / "datadir").mkdir()
    (root / "datadir" / "a.jsonl").symlink_to(outside / "data.jsonl")  # a data folder whose file leads outside
    (root / "saved" / "train").mkdir(parents=True)
    (root / "saved" / "train" / "data.arrow").symlink_to(outside / "data.jsonl")
    return root, outside


def actions(root: Path):
    from rlctl.cli.web.actions import Actions
    from rlctl.cli.web.jobs import Jobs

    return Actions(root, Jobs(root))


def outside_routes(outside: Path) -> list[tuple[str, str]]:
    """(YAML, overrides) pairs, each naming the outside file by another route."""
    with_data = BASE_YAML + "data: {sft: mine.jsonl}\n"
    routes = [(with_data, f"data.sft={p}") for p in ("../outside/data.jsonl", str(outside / "data.jsonl"))]
    routes += [(with_data, f"data.sft={p}") for p in ("link.jsonl", "linkdir/data.jsonl", "./../outside/data.jsonl")]
    routes += [(with_data, "data.sft=sub/../../outside/data.jsonl"), (with_data, "data.sft=~/../outside/data.jsonl")]
    routes += [(BASE_YAML + f"data: {{sft: {p}}}\n", "") for p in ("../outside/data.jsonl", outside / "data.jsonl")]
    routes += [(BASE_YAML + "data: {sft: linkdir/data.jsonl}\n", "")]
    routes += [(with_data, f"data.eval={outside / 'data.jsonl'}"), (with_data, "data.sft=loop/x.jsonl")]
    routes += [(with_data, f"data.chat_template={outside / 't.jinja'}")]
    routes += [(with_data, "data.sft=datadir"), (with_data, "data.sft=saved@train"), (with_data, "data.sft=saved")]
    routes += [(with_data, f"model.name_or_path={outside}"), (with_data, "rl.rewards=[{name: '../outside/r.py:f'}]")]
    return routes


def test_read_the_data_never_shows_a_file_outside_the_served_folder(served, monkeypatch):
    """Whatever route a path comes through (the overrides, the YAML, an absolute path, `..`, a symlink), the one
    path check refuses it, naming the key, and nothing of the outside file is shown."""
    root, outside = served
    monkeypatch.chdir(root)  # as `rlctl ui` serves the folder it is started in
    act = actions(root)
    for yaml_text, sets in outside_routes(outside):
        values = [yaml_text, "configs/t.yaml", "", "", [], [], sets]
        for shown in (act.read_data(*values, "runs/t", "en"), act.plan(*values, "runs/t", "en")):
            seen = json.dumps(dataclasses.asdict(shown), default=str)
            assert SECRET not in seen, (yaml_text, sets)
            assert "leads outside" in seen, (yaml_text, sets, seen)
        checked = act.check(*values, "en").check
        assert "bad" in checked and "leads outside" in checked, (yaml_text, sets, checked)
        assert "leads outside" in act.start(*values, "runs/t", "en").start_state
        assert not (root / "runs" / "t").exists()
    inside = act.read_data(
        BASE_YAML + "data: {sft: mine.jsonl}\n", "configs/t.yaml", "", "", [], [], "", "runs/t", "en"
    )
    assert "0+2=" in json.dumps(dataclasses.asdict(inside), default=str)  # a file of the folder is read as ever


def test_use_this_file_and_every_typed_path_refuse_the_outside(served, monkeypatch):
    from rlctl.cli.web.paths import inside
    from rlctl.errors import UserError

    root, outside = served
    monkeypatch.chdir(root)
    for bad in ("../outside/data.jsonl", str(outside / "data.jsonl"), "link.jsonl", "linkdir", "~", "loop", "a\0b"):
        with pytest.raises(UserError):
            inside(root, bad, "data file")
        used = actions(root).use_file("sft", bad, "", "en")
        assert isinstance(used.sets, Same) and "outside" in used.data_state
        assert "bad" in actions(root).first_page(bad, "en").preview_state
    assert inside(root, str(root / "mine.jsonl"), "data file") == Path("mine.jsonl")
    from rlctl.cli.web import draft

    assert draft.data_files(root) == ["mine.jsonl"]  # the picker lists no file reached through a symlink outside


def test_a_run_whose_config_names_data_outside_is_not_evaluated(served, monkeypatch):
    """A run directory copied into the folder whose config.yaml names held-out data outside it: Evaluate (which
    shows the scored rows) refuses it, naming the key, and starts nothing."""
    root, outside = served
    monkeypatch.chdir(root)
    run = root / "runs" / "copied"
    _valid_run_config(run, [f"data.eval={outside / 'data.jsonl'}"])
    act = actions(root)
    message = act.evaluate("runs/copied", 4, 1, "en").eval_state
    assert "data.eval=" in message and "leads outside" in message and act.jobs.get(Path("runs/copied")) is None
    assert not (run / "logs").exists()


def _valid_run_config(run: Path, sets: list[str] | None = None) -> None:
    from rlctl.cli.app import resolve_config
    from rlctl.config import dump

    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump(resolve_config("tiny-demo", None, None, None, sets or [], None, [])))


def test_the_runs_list_names_a_damaged_run_and_lists_the_others(tmp_path, monkeypatch):
    """One run's config.yaml damaged (a number where a stage name goes, YAML that is not a mapping, bytes that are not
    text, a summary.json of the wrong kind): the intact runs are listed and each damaged one is named."""
    monkeypatch.chdir(tmp_path)
    _valid_run_config(tmp_path / "runs" / "good")
    damaged = {"ints": "stages: [1, 2]\n", "list": "- a\n- b\n", "broken": "sft: [\n", "kind": "stages: sft\n"}
    for name, text in damaged.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text(text)
    (tmp_path / "runs" / "bytes").mkdir()
    (tmp_path / "runs" / "bytes" / "config.yaml").write_bytes(b"\xff\xfe\x00name: \x80\x81")
    _valid_run_config(tmp_path / "runs" / "badsummary")
    (tmp_path / "runs" / "badsummary" / "summary.json").write_text('{"completed": "sft,rl"}')
    (tmp_path / "runs" / "good" / "metrics.jsonl").write_text(
        '{"stage": ["x"], "step": 1}\n{"stage": "sft", "step": "2", "max_steps": 3}\n{"stage": "sft", "step": 1, '
        '"max_steps": 3, "loss": 1.5}\n'
    )
    table = actions(tmp_path).list_runs("runs", "en").runs_table
    rows = {row[0]: row for row in table.values.tolist()}
    assert set(rows) == {f"runs/{n}" for n in ("good", "badsummary", "bytes", *damaged)}
    assert rows["runs/good"][1] == "tiny-demo" and "sft step 1/3" in rows["runs/good"][4]
    for name in ("bytes", *damaged):
        assert "config.yaml cannot be read" in rows[f"runs/{name}"][4], rows[f"runs/{name}"]
    assert rows["runs/badsummary"][1] == "tiny-demo"


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rlctl.launch.start import holding_lock
    with holding_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(120)
    """
)


def test_stop_signals_only_the_run_of_this_run_directory(tmp_path):
    """A run started from a terminal holds its run.lock open (`launch.start.holding_lock`); Stop signals it. A copy
    of its run directory (run.lock copied too) names the same pid, but Stop on the copy signals nothing."""
    from rlctl.cli.web.jobs import Jobs

    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    jobs = Jobs(tmp_path)
    assert jobs.stop(Path("runs/t"))[0] == "nothing_to_stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run), "rlctl", "train"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        shutil.copytree(run, tmp_path / "runs" / "copy")
        assert (tmp_path / "runs" / "copy" / "run.lock").read_text() == (run / "run.lock").read_text()
        assert jobs.stop(Path("runs/copy"))[0] == "nothing_to_stop"
        (tmp_path / "runs" / "forged").mkdir()
        (tmp_path / "runs" / "forged" / "run.lock").write_text(f"{holder.pid}\n")
        assert jobs.stop(Path("runs/forged"))[0] == "nothing_to_stop"
        (tmp_path / "runs" / "mine").mkdir()
        (tmp_path / "runs" / "mine" / "run.lock").write_text(f"{os.getpid()}\n")  # the server itself: never
        assert jobs.stop(Path("runs/mine"))[0] == "nothing_to_stop"
        time.sleep(0.5)
        assert holder.poll() is None  # the original run goes on
        assert jobs.stop(Path("runs/t")) == ("stopping_other", {"run": Path("runs/t"), "pid": holder.pid})
        assert holder.wait(30) == -signal.SIGTERM
    finally:
        if holder.poll() is None:
            holder.kill()
