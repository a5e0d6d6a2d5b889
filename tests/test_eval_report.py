"""`rlctl eval` (accuracy, mean reward, pass@k; run directories and model folders) and `rlctl report` (real PNG
plots, report.md, TensorBoard event files) on the session's tiny demo run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rlctl.evaluation.evaluate import ks_for, pass_at_k
from tests.helpers import rlctl, summary


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_eval_run_dir_greedy_matches_the_runs_own_evaluation(demo_run: Path, tmp_path: Path):
    """Without --data a run is scored on its own held-out data, as summary.json was."""
    out = tmp_path / "eval.json"
    proc = rlctl("eval", str(demo_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads(out.read_text())
    assert Path(metrics["data"]) == demo_run / "data" / "eval.jsonl"
    assert metrics["stage"] == "rl" and metrics["decoding"] == "greedy" and metrics["prompts"] == 180
    assert metrics["accuracy_reward"] == "exact_match"
    assert abs(metrics["accuracy"] - summary(demo_run)["stages"]["rl"]["eval_accuracy"]) < 0.03
    assert metrics["mean_reward"] > metrics["reward/exact_match"], "the reward model's share (x0.1) is added"
    samples = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert len(samples) == 180 and all(len(s["completions"]) == 1 for s in samples)
    assert sum(s["correct"][0] for s in samples) / 180 == pytest.approx(metrics["accuracy"])
    for text in ("Evaluation", "accuracy", "mean_reward"):
        assert text in proc.stdout


@pytest.mark.slow
def test_eval_model_folder_sampled_pass_at_k(demo_run: Path, tmp_path: Path):
    out = tmp_path / "sft.json"
    proc = rlctl(
        "eval", str(demo_run / "sft" / "final"), "--data", str(demo_run / "data" / "eval.jsonl"),
        "--limit", "30", "--samples", "4", "--temperature", "1.0", "--max-new-tokens", "4", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = json.loads(out.read_text())
    assert m["samples_per_prompt"] == 4 and m["prompts"] == 30 and m["decoding"].startswith("sampled")
    assert m["accuracy"] == pytest.approx(m["pass@1"])
    assert m["pass@1"] <= m["pass@2"] <= m["pass@4"]
    samples = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    by_hand = sum(pass_at_k(4, sum(s["correct"]), 4) for s in samples) / 30
    assert m["pass@4"] == pytest.approx(by_hand)
    assert m["pass@4"] > m["pass@1"], "the SFT policy carries in some samples but not greedily"


def test_eval_bad_input_exits_2(tmp_path):
    (tmp_path / "e.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    proc = rlctl("eval", str(tmp_path / "no-model"), "--data", str(tmp_path / "e.jsonl"))
    assert proc.returncode == 2 and "Cannot load a model from" in proc.stderr.replace("\n", " ")
    proc = rlctl("eval", str(tmp_path), "--data", str(tmp_path / "e.jsonl"), "--greedy", "--samples", "2")
    assert proc.returncode == 2 and "--greedy" in proc.stderr
    proc = rlctl("eval", str(tmp_path), cwd=tmp_path)  # not a run: no held-out data to default to
    assert proc.returncode == 2 and "needs --data FILE" in proc.stderr.replace("\n", " "), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.jsonl"], "nothing written"


# -------------------------------------------------------------------------------------------- report
def _masked_crc(data: bytes) -> int:
    """CRC-32C computed bit by bit (independent of rlctl's table), masked as TFRecord does."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, object]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        out.append((number, value))
    return out


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Decode a TensorBoard event file, checking both CRCs of every record."""
    data, i, scalars = path.read_bytes(), 0, {}
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[i + 8 : i + 12])[0] == _masked_crc(header)
        payload = data[i + 12 : i + 12 + length]
        assert struct.unpack("<I", data[i + 12 + length : i + 16 + length])[0] == _masked_crc(payload)
        i += 16 + length
        event = dict(_fields(payload))
        if 5 not in event:
            assert event.get(3) == b"brain.Event:2"
            continue
        for number, value in _fields(event[5]):
            assert number == 1
            v = dict(_fields(value))
            scalars.setdefault(v[1].decode(), []).append((event[2], struct.unpack("<f", v[2])[0]))
    return scalars


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
def test_training_writes_tensorboard_events_by_default(demo_run: Path):
    files = list((demo_run / "tensorboard").glob("events.out.tfevents.*"))
    assert files, "rlctl train writes TensorBoard events without any configuration"
    scalars = {}
    for f in files:
        scalars.update(read_scalars(f))
    steps = [s for s, _ in scalars["rl/reward"]]
    assert steps == list(range(1, 61))
    assert {"sft/loss", "rm/accuracy", "rl/eval/accuracy", "base/eval/accuracy"} <= set(scalars)
    assert [s for s, _ in scalars["rl/eval/accuracy"]] == [10, 20, 30, 40, 50, 60, 60], "each checkpoint, then final"


@pytest.mark.slow
def test_report_writes_plots_markdown_and_events(demo_run: Path, tmp_path: Path):
    out = tmp_path / "report"
    proc = rlctl("report", str(demo_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\x1b[" not in proc.stdout, "no colour codes when stdout is not a terminal"
    for stage in ("sft", "rm", "rl", "summary"):
        width, height = _png_size(out / f"{stage}.png")
        assert width >= 400 and height >= 250, (stage, width, height)
    from PIL import Image

    pixels = Image.open(out / "rl.png").convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(pixels) > 50, "a real plot, not a blank image"
    md = (out / "report.md").read_text()
    s = summary(demo_run)
    for text in (
        "# tiny-demo: training report",
        "| stages | sft -> rm -> rl (grpo) |",
        "![rl training curves](rl.png)",
        "![sft training curves](sft.png)",
        "![held-out metrics per stage](summary.png)",
        f"| rl | {s['stages']['rl']['eval_accuracy']:.4g} |",
        "| reward (mean) |",
        "| learning rate |",
        "- **rewards**: `exact_match` x1, `reward_model` x0.1",
        "tensorboard --logdir",
        "## Layout: planned vs observed",
        "| rl | reference | cpu | cpu | ok |",
        "| sft | strategy | single | single | ok |",
    ):
        assert text in md, text
    scalars = read_scalars(next((demo_run / "tensorboard").glob("events.out.tfevents.*")))
    assert [s for s, _ in scalars["rl/reward"]] == list(range(1, 61))
    records = [json.loads(line) for line in (demo_run / "metrics.jsonl").read_text().splitlines()]
    last_rl = [r for r in records if r.get("stage") == "rl" and "reward" in r][-1]
    assert scalars["rl/reward"][-1][1] == pytest.approx(last_rl["reward"], rel=1e-6)

    quiet = rlctl("--quiet", "report", str(demo_run), "--out", str(tmp_path / "q"))
    assert quiet.returncode == 0 and quiet.stdout.strip().startswith("Wrote") and len(quiet.stdout.splitlines()) <= 2


def test_report_shows_the_layout_comparison_and_flags_a_mismatch():
    from rlctl.after.report import layout_section
    from rlctl.rundir import LayoutRecord

    record = {
        "planned": {"strategy": "fsdp2", "adapter": "lora"},
        "observed": {"strategy": "ddp", "adapter": "lora", "trainable_parameters": 10, "total_parameters": 100},
        "mismatches": ["strategy: planned fsdp2, observed ddp"],
        "processes_recorded": 2,
    }
    lines = layout_section({"sft": LayoutRecord.from_json(record)})
    assert "| sft | strategy | fsdp2 | ddp | **MISMATCH** |" in lines
    assert "| sft | adapter | lora | lora | ok |" in lines
    assert any(line.startswith("- **sft** (2 process(es) recorded): 10 of 100 parameters train") for line in lines)
    assert layout_section({}) == []


def test_report_needs_metrics(tmp_path):
    (tmp_path / "config.yaml").write_text("name: x\n")
    proc = rlctl("report", str(tmp_path))
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr
