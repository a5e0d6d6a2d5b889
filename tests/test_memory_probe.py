"""Measured memory per stage and phase (rlctl.monitors.memory_probe): the per-phase resident-set peak on CPU, the
sampler, summary.json's measured beside planned numbers, the out-of-memory text, and the tiny demo's record."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from rlctl.monitors import memory_probe
from rlctl.plan.parts import DiskSpace, HostMemory, MemoryTable, PhaseMemory

MiB = 2**20

PLAN = MemoryTable(  # a plan's memory table, two stages
    device="gpu",
    total_gib=8.0,
    budget_gib=7.6,
    peak_gib=5.0,
    peak_phase="rl/training",
    headroom_gib=2.6,
    fits=True,
    phases=tuple(
        PhaseMemory(stage, phase, {"policy weights": peak}, peak, 7.6, round(7.6 - peak, 3), True)
        for stage, phase, peak in (("sft", "training", 2.0), ("rl", "generation", 3.0), ("rl", "training", 5.0))
    ),
    host=HostMemory({}, 0.0, 100.0, False),
    disk=DiskSpace(1.0, 10.0),
)


def test_clear_refs_resets_the_peak_resident_set_here():
    """The CPU measure relies on it: Linux resets VmHWM to VmRSS when 5 is written to /proc/self/clear_refs."""
    big = b"\x01" * (200 * MiB)
    del big
    assert memory_probe.status_kib("VmHWM") - memory_probe.status_kib("VmRSS") > 150 * 1024
    assert memory_probe.reset_hwm()
    assert memory_probe.status_kib("VmHWM") - memory_probe.status_kib("VmRSS") < 20 * 1024


def test_each_phase_gets_its_own_resident_set_peak(tmp_path: Path):
    probe = memory_probe.Probe("rl", tmp_path / "rank0.json")
    big = b"\x01" * (300 * MiB)  # allocated and freed inside the generation phase
    del big
    probe.lap("generation")
    small = b"\x01" * (10 * MiB)
    del small
    probe.lap("training")
    probe.close()
    phases = json.loads((tmp_path / "rank0.json").read_text())["phases"]
    gen, train = phases["generation"]["rss_gib"], phases["training"]["rss_gib"]
    assert gen - train > 0.25, (gen, train)  # the 300 MiB peak did not leak into the next phase
    assert json.loads((tmp_path / "rank0.json").read_text())["device"] == "cpu"


def test_sampler_keeps_the_peak_between_takes():
    value = {"now": 10}
    sampler = memory_probe.Sampler(lambda: value["now"], interval=0.005)
    value["now"] = 500
    deadline = time.time() + 5
    while sampler.high < 500 and time.time() < deadline:
        time.sleep(0.005)
    value["now"] = 20
    assert sampler.take() == 500  # the peak of a value that came and went between two takes
    assert sampler.take() == 20  # the next interval starts from the current value
    sampler.stop()
    assert not sampler.thread.is_alive() and threading.active_count() >= 1


def test_summary_puts_measured_beside_planned(tmp_path: Path):
    folder = tmp_path / "rl" / "memory"
    folder.mkdir(parents=True)
    for rank, gen in ((0, 2.5), (1, 2.9)):
        phases = {
            "generation": {"reserved_gib": gen - 0.5, "allocated_gib": gen - 1, "device_used_gib": gen, "rss_gib": 3.0},
            "training": {"reserved_gib": 5.2, "allocated_gib": 4.1, "device_used_gib": 5.5, "rss_gib": 3.1},
            "optimizer step": {"reserved_gib": 5.2, "allocated_gib": 3.0, "device_used_gib": 5.4, "rss_gib": 3.1},
            "evaluation": {"reserved_gib": 6.0, "allocated_gib": 1.0, "device_used_gib": 6.2, "rss_gib": 3.1},
        }
        (folder / f"rank{rank}.json").write_text(json.dumps({"device": "gpu", "source": "nvml", "phases": phases}))
    s = memory_probe.summary(tmp_path, "rl", PLAN)
    assert s.processes_recorded == 2 and s.measured_source == "nvml"
    gen = s.phases["generation"]
    # the maximum over processes; the headline is the device memory in use (what nvidia-smi shows)
    assert gen.measured["device_used_gib"] == gen.peak_gib == 2.9 and gen.measured["reserved_gib"] == 2.4
    assert gen.planned_peak_gib == 3.0 and gen.planned_phase == "rl/generation"
    assert gen.error_pct == round((3.0 - 2.9) / 2.9 * 100, 1)  # +3.4: positive = the plan over-predicts
    # the plan counts the optimizer step inside its training phase; the evaluation after the stage is not planned
    assert s.phases["optimizer step"].planned_phase == "rl/training"
    assert s.phases["evaluation"].planned_peak_gib is None
    # the stage's peak leaves the unplanned evaluation out
    assert (s.measured_peak_gib, s.measured_peak_phase) == (5.5, "training")
    assert (s.planned_peak_gib, s.planned_peak_phase, s.error_pct) == (5.0, "training", -9.1)
    # summary.json's keys, as rlctl has always written them
    assert s.to_json()["phases"]["generation"] == {
        "measured_reserved_gib": 2.4,
        "measured_allocated_gib": 1.9,
        "measured_device_used_gib": 2.9,
        "measured_rss_gib": 3.0,
        "measured_peak_gib": 2.9,
        "planned_peak_gib": 3.0,
        "planned_phase": "rl/generation",
        "error_pct": 3.4,
    }
    assert memory_probe.summary(tmp_path, "sft", PLAN) is None  # no process recorded that stage


def test_out_of_memory_text_has_the_peaks_so_far(tmp_path: Path):
    probe = memory_probe.start("rl", tmp_path)
    try:
        probe.lap("generate")  # the RL loop's lap names map to memory phases
        text = memory_probe.so_far(probe, "rl", PLAN)
        assert "; measured peaks of this process (resident set): rl/generation " in text
        assert "GiB, planned 3.0" in text and "GiB in the phase that failed" in text
        assert memory_probe.so_far(probe, "sft", PLAN) == "", "the probe measures another stage"
    finally:
        probe.close()
    assert memory_probe.so_far(None, "rl", PLAN) == ""  # nothing measured
    assert "generation" in json.loads((tmp_path / "rl" / "memory" / "rank0.json").read_text())["phases"]


def test_tiny_demo_records_measured_and_planned_memory(demo_run: Path, tmp_path: Path):
    from rlctl.after import report

    memory = json.loads((demo_run / "summary.json").read_text())["memory"]
    plan = json.loads((demo_run / "plan.json").read_text())["memory"]
    for stage in ("sft", "rm", "rl"):
        m = memory[stage]
        assert m["device"] == "cpu" and m["measured_source"] == "rss" and m["processes_recorded"] == 1
        train = m["phases"]["training"]
        assert 0.1 < train["measured_peak_gib"] == train["measured_rss_gib"] < 8, m
        planned = next(p for p in plan["phases"] if p["stage"] == stage and p["phase"] == "training")
        assert train["planned_peak_gib"] == planned["peak_gib"] and train["error_pct"] is not None
        assert m["measured_peak_gib"] > 0 and m["planned_peak_gib"] > 0
        assert {"optimizer step", "evaluation"} <= set(m["phases"])
    assert memory["rl"]["phases"]["generation"]["planned_phase"] == "rl/generation"
    records = [json.loads(line) for line in (demo_run / "metrics.jsonl").read_text().splitlines()]
    logged = {r["stage"] for r in records if r.get("event") == "memory" and r["phases"]}
    assert logged == {"sft", "rm", "rl"}
    built = report.build(demo_run, tmp_path / "report")
    assert built.plots["memory"].exists()
    text = built.markdown.read_text()
    assert "## Memory: planned vs measured" in text and "| rl/generation |" in text
