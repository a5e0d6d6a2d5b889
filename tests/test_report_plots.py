"""`rlctl report`'s charts on synthetic run directories (no training): integer step ticks, constant panels left
out and listed, a single point as a marker, the reward model's pairwise accuracy on its own chart, one colour per
stage in every figure, and a run without held-out prompts saying so in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.after import plots, report
from rlctl.config import dump, resolve


def _run(tmp_path: Path, sets: tuple[str, ...], records: list[dict], summary: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump(resolve("tiny-demo", sets=sets)))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def _records() -> list[dict]:
    records = [{"stage": "sft", "step": s, "loss": 2.0 / s, "lr": 1e-4} for s in range(1, 6)]
    records += [{"stage": "rm", "step": s, "loss": 0.7 - 0.1 * s, "accuracy": 0.5 + 0.1 * s} for s in (1, 2, 3)]
    records += [{"stage": "rl", "step": s, "reward": 0.1 * s, "clip_ratio": 0.0, "kl": 0.01 * s} for s in (1, 2, 3)]
    records.append({"stage": "rl", "step": 3, "event": "checkpoint", "eval_accuracy": 0.4})  # one point
    return records


SUMMARY = {
    "completed": ["sft", "rm", "rl"],
    "stages": {
        "base": {"eval_accuracy": 0.1, "eval_reward": 0.1},
        "sft": {"eval_accuracy": 0.2, "eval_reward": 0.2},
        "rm": {"eval_accuracy": 0.9, "eval_margin": 1.5},
        "rl": {"eval_accuracy": 0.4, "eval_reward": 0.4},
    },
}


@pytest.fixture
def figures(monkeypatch):
    """Every figure the report saves, by file stem, to read its axes back (savefig still writes the PNG)."""
    plt = plots._pyplot()
    kept: dict[str, object] = {}
    save = plt.Figure.savefig

    def keep(fig, out, *args, **kwargs):
        kept[Path(out).stem] = fig
        return save(fig, out, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    yield kept
    for fig in kept.values():
        plt.close(fig)


def _colours(fig) -> set[str]:
    from matplotlib.colors import to_hex

    out = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()}
    return out | {to_hex(p.get_facecolor()) for ax in fig.axes for p in ax.patches}


def _by_bar(fig) -> dict[str, str]:
    from matplotlib.colors import to_hex

    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    return dict(zip(names, (to_hex(p.get_facecolor()) for p in ax.patches), strict=True))


def test_report_charts(tmp_path, figures):
    run = _run(tmp_path, (), _records(), SUMMARY)
    rep = report.build(run)
    md = rep.markdown.read_text()

    # integer step ticks on every training panel (3 steps would otherwise tick at 1.0, 1.25, ...)
    for stage in ("sft", "rm", "rl"):
        for ax in figures[stage].axes:
            if ax.get_visible() and ax.axison:
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (stage, ticks)

    # constant panels left out and named in one line
    titles = {stage: {ax.get_title() for ax in figures[stage].axes} for stage in ("sft", "rl")}
    assert "learning rate" not in titles["sft"] and "clipped fraction" not in titles["rl"]
    assert {"loss"} <= titles["sft"] and {"reward (mean)", "KL to reference"} <= titles["rl"]
    assert "Constant, not plotted: learning rate = 0.0001." in md
    assert "Constant, not plotted: clipped fraction = 0." in md
    # a single point drawn as a marker
    (single,) = [ax for ax in figures["rl"].axes if ax.get_title() == "held-out accuracy (at checkpoints)"]
    assert single.get_lines()[0].get_marker() == "o"

    # the reward model's pairwise accuracy on its own chart, not among the policies' accuracies
    assert set(_by_bar(figures["summary"])) == {"base", "sft", "rl"}
    assert set(_by_bar(figures["preference"])) == {"rm"}
    assert "![held-out preference pairs](preference.png)" in md and "| rm | 0.9 | 1.5 |" in md

    # one colour per stage, the same in every figure
    for stage in ("sft", "rm", "rl"):
        assert _colours(figures[stage]) == {plots.stage_colour(stage)}, stage
    bars = _by_bar(figures["summary"]) | _by_bar(figures["preference"])
    assert bars == {s: plots.stage_colour(s) for s in ("base", "sft", "rm", "rl")}
    assert len({plots.stage_colour(s) for s in ("base", "sft", "rm", "rl", "dpo", "kto")}) == 6


def test_report_without_heldout_prompts_says_so(tmp_path):
    records = [{"stage": "sft", "step": s, "loss": 1.0 / s} for s in (1, 2)]
    records += [{"stage": "dpo", "step": s, "loss": 0.7 - 0.1 * s} for s in (1, 2)]
    records.append({"stage": "dpo", "event": "heldout", "preference_accuracy": 0.75, "preference_margin": 0.25})
    sets = ("data.generate=null", "data.sft=a.jsonl", "data.preference=p.jsonl", "stages=[sft,dpo]")
    run = _run(tmp_path, sets, records, {"completed": ["sft", "dpo"], "stages": {"sft": {}, "dpo": {}}})
    rep = report.build(run)
    md = rep.markdown.read_text()
    assert "No held-out prompts: set `data.eval` to score each policy stage after training." in md
    assert "| stage |" not in md.split("## Final metrics (held-out)")[1].split("Held-out preference pairs")[0]
    assert "| dpo | 0.75 | 0.25 |" in md and (rep.folder / "preference.png").is_file()
    assert not (rep.folder / "summary.png").exists()


def test_learning_rate_is_drawn_as_scheduled_not_smoothed(tmp_path, monkeypatch):
    """A noisy metric of many steps gets a smoothed line; the learning-rate schedule does not (its smoothed copy
    lagged behind the schedule it is)."""
    smoothed: list[list[float]] = []
    ema = plots._ema
    monkeypatch.setattr(plots, "_ema", lambda values: smoothed.append(values) or ema(values))
    lr = [(s, 1e-3 * (1 - s / 100)) for s in range(1, 100)]
    loss = [(s, 1.0 / s + 0.1 * (s % 3)) for s in range(1, 100)]
    assert plots.plot_stage("rm", {"lr": lr, "loss": loss}, tmp_path / "rm.png", "run: rm") is not None
    assert smoothed == [[v for _, v in loss]]
