"""The page of `rlctl ui` without a browser: every word in both languages, the form writing the CLI's `--set`
items, the metrics of a run read only where they grew, the port and `--open`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gradio")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The page built in English and in Chinese: {lang: (blocks, components)}."""
    from rlctl.cli.web import page
    from rlctl.cli.web.jobs import Jobs

    root = tmp_path_factory.mktemp("page")
    return {lang: page.layout(root, Jobs(root), lang) for lang in ("en", "zh")}


def words(component) -> list[str]:
    """What a component says of its own: its label, a button's or a static text's words, a tab's title, a table's
    columns, a plot's title."""
    import gradio as gr

    found = [getattr(component, "label", None)]
    if isinstance(component, gr.Button | gr.Markdown):
        found.append(component.value if isinstance(component.value, str) else None)
    if isinstance(component, gr.Dataframe):
        found += list(component.headers or [])
    if isinstance(component, gr.LinePlot):
        found += [component.title, component.x_title, component.y_title]
    return [w for w in found if isinstance(w, str) and w.strip()]


def test_no_label_of_the_page_is_left_untranslated(pages):
    """Every word a component shows in English shows in Chinese as another text (a key or flag it names aside);
    every message of the page's own has its Chinese."""
    from rlctl.cli.web import text

    en, zh = pages["en"][1].named, pages["zh"][1].named
    assert en.keys() == zh.keys()
    untranslated = []
    for name, component in en.items():
        english, chinese = words(component), words(zh[name])
        assert len(chinese) == len(english), (name, english, chinese)
        for e, c in zip(english, chinese, strict=True):
            if e == c and re.search("[A-Za-z]{2}", e) and e not in text.SAME_IN_BOTH:
                untranslated.append((name, e))
    assert not untranslated, untranslated
    for key, (english, chinese) in {**text.LABELS, **text.INFO, **text.MESSAGES}.items():
        assert chinese and chinese != english and re.search("[\u4e00-\u9fff]", chinese), key
    for names in (text.COLUMNS,):
        assert all(c != e or e in text.SAME_IN_BOTH for e, c in names.items())


def test_the_language_switch_relabels_every_labelled_component(pages):
    from rlctl.cli.web import text

    _, ui = pages["en"]
    labelled = text.labelled(ui.named)
    updates = text.relabel(ui.named, labelled, "zh")
    assert ui["tab_config"] in updates and updates[ui["tab_config"]]["label"] == "1 配方与配置"
    assert updates[ui["start"]]["value"] == "开始训练"
    assert set(labelled) == set(updates)
    back = text.relabel(ui.named, labelled, "en")
    assert back[ui["memory"]]["headers"][0] == "stage"


def test_the_form_writes_the_clis_set_items(tmp_path):
    """Each form field is a key of the schema with its widget, and writes the `--set` item a user would type; the
    check then reads it as the CLI does."""
    from rlctl.cli.web import draft
    from rlctl.config import STAGE_ORDER

    groups = draft.form_keys()
    assert list(groups) == ["model", *STAGE_ORDER]
    assert draft.form_field("model.adapter").choices == ("auto", "full", "lora", "qlora")
    assert draft.form_field("rl.temperature").kind == "number"
    sets = draft.with_set("sft.max_steps=3\nrl.group_size=4", "sft.max_steps", 12.0)
    assert sets == "rl.group_size=4\nsft.max_steps=12"
    sets = draft.with_set(sets, "rl.use_vllm", False)
    assert sets.endswith("rl.use_vllm=false")
    from rlctl.config import presets

    text = presets.get("tiny-demo").path.read_text()
    checked = draft.check(tmp_path, draft.Draft(text, "configs/t.yaml", sets=draft.set_items(sets)))
    assert checked.config is not None and checked.config.sft.max_steps == 12 and checked.config.rl.use_vllm is False
    assert draft.form_values(checked.config)["rl.group_size"] == 4


def test_a_missing_data_file_is_named_by_the_check(tmp_path, monkeypatch):
    from rlctl.cli.web import draft
    from rlctl.config import presets

    monkeypatch.chdir(tmp_path)
    text = presets.get("tiny-demo").path.read_text()
    sets = ("data.generate=null", "data.sft=nothere.jsonl", "stages=[sft]")
    checked = draft.check(tmp_path, draft.Draft(text, "configs/t.yaml", sets=sets))
    assert checked.config is None and "data.sft=nothere.jsonl: no such file" in checked.message


def test_a_refresh_reads_only_what_was_appended(tmp_path):
    """metrics.jsonl read where it grew since the last refresh: nothing when it did not grow, the new lines when it
    did (a half-written line waits for its end), everything again when it was replaced; the stages on one axis."""
    from rlctl.cli.web.watch import Watched, sample_rows

    metrics = tmp_path / "metrics.jsonl"
    lines = [{"stage": "sft", "step": s, "max_steps": 3, "loss": 1.0 / s} for s in (1, 2, 3)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
    seen = Watched(tmp_path)
    seen.refresh()
    assert seen.bytes_read == metrics.stat().st_size and "sft step 3/3" in seen.headline()
    seen.refresh()
    assert seen.bytes_read == 0
    new = json.dumps({"stage": "rl", "step": 1, "max_steps": 2, "reward": 0.5, "kl": 0.01}) + "\n"
    with metrics.open("a") as f:
        f.write(new + '{"stage": "rl", "st')
    seen.refresh()
    assert seen.bytes_read == len(new) + len('{"stage": "rl", "st')
    panels = seen.panels()
    assert [(p.series, p.step) for p in panels["reward"]] == [("rl reward", 4), ("rl kl", 4)]  # after sft's 3 steps
    with metrics.open("a") as f:
        f.write('ep": 2, "max_steps": 2, "reward": 0.7}\n{"stage": ["damaged"], "step": "x"}\n')
    seen.refresh()
    assert ("rl reward", 5) in [(p.series, p.step) for p in seen.panels()["reward"]]
    best = [{"prompt": "1+1=", "completion": "2", "reward": 1.0}]
    worst = [{"prompt": "9+9=", "completion": "1", "reward": 0.0}, {"prompt": "x", "reward": "bad"}]
    samples = {"stage": "rl", "step": 2, "event": "samples", "best": best, "worst": worst}
    with metrics.open("a") as f:
        f.write(json.dumps(samples) + "\n")
    seen.refresh()
    assert sample_rows(seen.samples) == [["best 1", 2, "1+1=", "2", 1.0], ["worst 1", 2, "9+9=", "1", 0.0]]
    assert ("rl reward", 5) in [(p.series, p.step) for p in seen.panels()["reward"]]  # no curve of its own
    metrics.write_text(json.dumps({"stage": "sft", "step": 1, "max_steps": 9, "loss": 2.0}) + "\n")
    seen.refresh()
    assert seen.panels()["reward"] == [] and "sft step 1/9" in seen.headline() and seen.samples == {}


def test_the_port_is_7860_or_the_next_free_one_and_open_opens_the_page(tmp_path):
    from rlctl.cli.web import serve

    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's: a port in TIME_WAIT is free
    try:
        taken.bind(("127.0.0.1", serve.DEFAULT_PORT))
        taken.listen(1)
    except OSError:
        taken.close()
        taken = None  # 7860 is someone else's already: the server goes to the next free one all the same
    opened = tmp_path / "opened"
    browser = f"{sys.executable} -c \"import sys; open('{opened}', 'w').write(sys.argv[1])\" %s"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlctl.cli", "ui", "--open"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "BROWSER": browser},
    )
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))
        assert serve.DEFAULT_PORT < port < serve.DEFAULT_PORT + serve.PORTS_TRIED, line
        for _ in range(100):
            if opened.is_file():
                break
            import time

            time.sleep(0.1)
        assert opened.read_text() == f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(60)
        if taken is not None:
            taken.close()


def test_a_port_given_and_taken_is_refused(tmp_path):
    from rlctl.cli.web import serve
    from rlctl.errors import UserError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(UserError, match="Pick another --port"):
            serve.listening("127.0.0.1", taken.getsockname()[1])


def test_the_chat_sends_what_rlctl_eval_sends():
    """A run trained on text prompts gets the text alone (no template, no history); a chat run the conversation."""
    from rlctl.cli.web.trying import TaskFormat, prompt_of

    history = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    assert prompt_of(TaskFormat(False, "3+4=", 4), history, "19+2=", "") == "19+2="
    chat = prompt_of(TaskFormat(True, "hi", 8), history, "19+2=", "Be brief.")
    assert chat[0] == {"role": "system", "content": "Be brief."} and chat[1:3] == history and len(chat) == 4


def test_the_device_view_reads_each_gpu_from_nvidia_smi(tmp_path, monkeypatch):
    """Where nvidia-smi answers (a stand-in here: no GPU in CI), one row per GPU: memory used of total in GiB,
    utilisation, the plan's budget."""
    from rlctl.cli.web import watch

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 40960, 143771, 87'\necho '1, NVIDIA H200, 1024, 143771, 0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert watch.gpu_rows(120.0) == [
        ["cuda:0 NVIDIA H200", 40.0, 140.4, "87", 120.0],
        ["cuda:1 NVIDIA H200", 1.0, 140.4, "0", 120.0],
    ]
    row = watch.ProcessUse().row(os.getpid(), None)
    assert row[0][0].startswith("cpu: ") and row[0][1] > 0


def test_a_refused_start_leaves_the_runs_files_as_they_were(tmp_path):
    """Start into a folder that holds a run (or other files) is refused before the page writes its log there."""
    import hashlib

    from rlctl.cli.web.jobs import Jobs
    from rlctl.errors import UserError

    run = tmp_path / "runs" / "done"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text("name: done\n")
    (run / "logs" / "ui-train.log").write_text("the finished run's output\n")
    (tmp_path / "runs" / "mine").mkdir()
    (tmp_path / "runs" / "mine" / "notes.txt").write_text("mine\n")

    def sums() -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    before = sums()
    jobs = Jobs(tmp_path)
    for where, said in (("runs/done", "already holds a run"), ("runs/mine", "not an rlctl run")):
        with pytest.raises(UserError, match=said):
            jobs.start("train", ["--preset", "tiny-demo", "--run-dir", where], Path(where))
        assert jobs.get(Path(where)) is None
    assert sums() == before


def test_the_chat_reads_the_runs_prompt_format_and_an_example_from_its_task(tmp_path, monkeypatch):
    from rlctl.cli.app import resolve_config
    from rlctl.cli.web.trying import task_format
    from rlctl.config import dump

    monkeypatch.chdir(tmp_path)
    prompts = {"plain": "3+4=", "chat": [{"role": "user", "content": "What is 3+4?"}]}
    for name, prompt in prompts.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"prompt": prompt, "answer": "7"}) + "\n")
        sets = ["data.generate=null", f"data.rl={name}.jsonl", f"data.eval={name}.jsonl"]
        (tmp_path / "runs" / name).mkdir(parents=True)
        cfg = resolve_config("tiny-demo", None, None, None, sets, None, [])
        (tmp_path / "runs" / name / "config.yaml").write_text(dump(cfg))
    from rlctl.cli.web.trying import TaskFormat

    assert task_format(tmp_path, Path("runs/plain")) == TaskFormat(False, "3+4=", 4)
    assert task_format(tmp_path, Path("runs/chat")) == TaskFormat(True, "What is 3+4?", 4)


def test_a_saved_config_loads_into_the_editor(tmp_path):
    """The folder's YAML configs are listed (configs/ first, runs/ left out) and one loads into the editor; a
    path outside the folder or a file that is not YAML is refused."""
    from rlctl.cli.web.actions import Actions
    from rlctl.cli.web.jobs import Jobs
    from rlctl.cli.web.wiring import SAME

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("defaults: [tiny-demo]\nname: mine\n")
    (tmp_path / "other.yml").write_text("name: other\n")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "config.yaml").write_text("name: r\n")
    (tmp_path.parent / "outside.yaml").write_text("name: outside\n")
    act = Actions(tmp_path, Jobs(tmp_path))
    assert act.list_saved().saved.constructor_args["choices"] == ["configs/mine.yaml", "other.yml"]
    loaded = act.load_saved("configs/mine.yaml", "en")
    assert loaded.yaml.startswith("defaults: [tiny-demo]") and loaded.config_path == "configs/mine.yaml"
    for bad in ("../outside.yaml", str(tmp_path.parent / "outside.yaml"), "nothere.yaml"):
        refused = act.load_saved(bad, "en")
        assert "bad" in refused.check and refused.yaml is SAME
