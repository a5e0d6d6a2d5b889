"""The PNG charts of `rlctl report`: a stage's training curves, the held-out bars of the policies and of the
preference pairs, and planned vs measured memory; one colour per stage in every chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rlctl.rundir import MeasuredPhase, StageSummary, Summary

# Plotted first, in this order; any other numeric metric a stage logs follows alphabetically.
PLOT_ORDER = (
    "reward",
    "accuracy",
    "token_accuracy",
    "kl",
    "loss",
    "policy_loss",
    "value_loss",
    "entropy",
    "response_length",
    "lr",
)
SCHEDULES = ("lr",)  # set by the trainer, not measured: a smoothed copy only lags behind it
LABELS = {
    "reward": "reward (mean)",
    "accuracy": "accuracy",
    "token_accuracy": "token accuracy",
    "kl": "KL to reference",
    "loss": "loss",
    "policy_loss": "policy loss",
    "value_loss": "value loss",
    "entropy": "entropy",
    "response_length": "response length (tokens)",
    "lr": "learning rate",
    "grad_norm": "gradient norm",
    "clip_ratio": "clipped fraction",
    "margin": "reward margin",
    "sync_logp_diff_mean": "weight sync: mean |log-prob diff| trainer vs vLLM",
    "sync_logp_diff_max": "weight sync: max |log-prob diff| trainer vs vLLM",
    "is_ratio_mean": "rollout correction: mean IS ratio",
    "staleness_mean": "async: policy versions behind (mean)",
    "staleness_max": "async: policy versions behind (max)",
    "eval_accuracy": "held-out accuracy (at checkpoints)",
    "eval_reward": "held-out reward (at checkpoints)",
    "eval_margin": "held-out reward margin (at checkpoints)",
}


def ordered(metrics: dict[str, Any]) -> list[str]:
    return [k for k in PLOT_ORDER if k in metrics] + sorted(k for k in metrics if k not in PLOT_ORDER)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ema(values: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], values[0]
    for v in values:
        acc = alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


# One colour per stage in every figure (matplotlib's tab10 colours); a stage not named here takes the next ones.
STAGE_COLOURS = {
    "base": "#7f7f7f",
    "sft": "#1f77b4",
    "rm": "#ff7f0e",
    "rl": "#2ca02c",
    "dpo": "#d62728",
    "kto": "#9467bd",
}
_SPARE_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf")


def stage_colour(stage: str) -> str:
    """The fixed colour of `stage` in every figure."""
    if stage in STAGE_COLOURS:
        return STAGE_COLOURS[stage]
    return _SPARE_COLOURS[sum(map(ord, stage)) % len(_SPARE_COLOURS)]


def constant(points: list[tuple[int, float]]) -> bool:
    """A curve of two or more points that never moves (an all-zero clip ratio, a fixed learning rate)."""
    values = [v for _, v in points]
    return len(values) > 1 and max(values) - min(values) <= 1e-12 * max(1.0, abs(values[0]))


def plotted(metrics: dict[str, list[tuple[int, float]]]) -> tuple[list[str], list[str]]:
    """(metrics drawn, constant metrics left out), in plot order."""
    names = ordered(metrics)
    return [n for n in names if not constant(metrics[n])], [n for n in names if constant(metrics[n])]


def _integer_steps(ax, steps: tuple[int, ...]) -> None:
    """Whole-number step ticks: every step over a short range (a single point sits between its neighbours),
    matplotlib's integer locator over a long one."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = min(steps), max(steps)
    if hi - lo < 2:
        ax.set_xlim(lo - 1, hi + 1)
        ax.set_xticks(range(lo - 1, hi + 2))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_stage(stage: str, metrics: dict[str, list[tuple[int, float]]], out: Path, title: str) -> Path | None:
    """One PNG: a panel per metric that moves, against the optimizer step, in the stage's colour (None when every
    metric is constant)."""
    names, _ = plotted(metrics)
    if not names:
        return None
    plt = _pyplot()
    colour = stage_colour(stage)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows + 0.4), squeeze=False, layout="constrained")
    for ax, name in zip(axes.flat, names, strict=False):
        steps, values = zip(*metrics[name], strict=True)
        few = len(steps) <= 30 or name in SCHEDULES  # a schedule is drawn as it is, never smoothed
        ax.plot(
            steps,
            values,
            color=colour,
            marker="o" if len(steps) <= 30 else None,
            markersize=4 if len(steps) == 1 else 3,
            linewidth=1.2,
            alpha=1 if few else 0.35,
        )
        if not few:
            ax.plot(steps, _ema(list(values)), linewidth=1.8, color=colour, label="smoothed")
        ax.set_title(LABELS.get(name, name.replace("_", " ")), fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        _integer_steps(ax, steps)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if name == "lr":  # 1.0e-03 on each tick: matplotlib's separate "1e-3" sat on the panel title
            from matplotlib.ticker import FormatStrFormatter

            ax.yaxis.set_major_formatter(FormatStrFormatter("%.1e"))
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)  # constrained layout keeps it clear of the panel titles
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _bars(out: Path, panels: list[tuple[str, dict[str, float]]]) -> Path | None:
    """One figure of bar panels, each (title, {stage: value}) with the stages in their colours."""
    panels = [(title, values) for title, values in panels if values]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.2), squeeze=False, layout="constrained")
    for ax, (title, values) in zip(axes.flat, panels, strict=True):
        bars = ax.bar(list(values), list(values.values()), color=[stage_colour(s) for s in values])
        ax.bar_label(bars, labels=[f"{v:.3f}" for v in values.values()], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-0.75, max(len(values), 3) - 0.25)  # one or two bars keep a bar's width
        if "accuracy" in title or "fraction" in title:
            ax.set_ylim(0, 1.08)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _values(held: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    return {s: m[key] for s, m in held.items() if isinstance(m.get(key), int | float) and not isinstance(m[key], bool)}


def policy_heldout(summary: Summary) -> dict[str, dict[str, Any]]:
    """summary.json's held-out task metrics of the policy stages (base, sft, rl, and dpo/kto when data.eval is
    set), stages without any left out."""
    held = {s: m.metrics for s, m in summary.stages.items() if s != "rm"}
    return {s: m for s, m in held.items() if any(k in m for k in ("eval_accuracy", "eval_reward"))}


def preference_heldout(summary: Summary, records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{stage: {"accuracy", "margin"}} on the held-out preference pairs: the reward model's from summary.json, DPO's
    and KTO's from their `heldout` records in metrics.jsonl (the last one of each stage)."""
    out: dict[str, dict[str, float]] = {}
    rm = summary.stages.get("rm", StageSummary())
    if isinstance(rm.eval_accuracy, int | float):
        out["rm"] = {"accuracy": rm.eval_accuracy, "margin": rm.metrics.get("eval_margin")}
    for rec in records:
        if rec.get("event") == "heldout" and rec.get("stage"):
            out[rec["stage"]] = {"accuracy": rec.get("preference_accuracy"), "margin": rec.get("preference_margin")}
    return out


def plot_summary(summary: Summary, out: Path) -> Path | None:
    """Bars of the policies' held-out task metrics (eval_accuracy, eval_reward), a colour per stage, in run order."""
    held = policy_heldout(summary)
    return _bars(
        out, [(f"held-out {k.removeprefix('eval_')}", _values(held, k)) for k in ("eval_accuracy", "eval_reward")]
    )


def plot_preference(pref: dict[str, dict[str, float]], out: Path) -> Path | None:
    """Bars of the pairwise accuracy and mean reward margin on the held-out preference pairs (rm, dpo, kto): its
    own chart, as a pairwise accuracy is not a task accuracy."""
    return _bars(
        out,
        [
            ("held-out pairs: chosen preferred (fraction)", _values(pref, "accuracy")),
            ("held-out pairs: mean reward margin", _values(pref, "margin")),
        ],
    )


def memory_rows(summary: Summary) -> list[tuple[str, MeasuredPhase]]:
    """(stage/phase, row) of summary.json's measured memory, in run order."""
    return [(f"{s}/{p}", r) for s, m in summary.memory.items() for p, r in m.phases.items()]


def plot_memory(summary: Summary, out: Path) -> Path | None:
    """Bars of the planned and the measured peak memory of every stage and phase (GiB per GPU or process)."""
    rows = [(name, r) for name, r in memory_rows(summary) if r.peak_gib is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 1.5), 3.6))
    xs = range(len(rows))
    planned = [r.planned_peak_gib or 0.0 for _, r in rows]
    measured = [r.peak_gib for _, r in rows]
    bars = ax.bar([x - 0.2 for x in xs], planned, width=0.4, label="planned", color="C0")
    ax.bar_label(bars, labels=[f"{v:.2f}" if v else "-" for v in planned], fontsize=7)
    bars = ax.bar([x + 0.2 for x in xs], measured, width=0.4, label="measured", color="C1")
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in measured], fontsize=7)
    ax.set_xticks(list(xs), [name for name, _ in rows], rotation=30, ha="right", fontsize=8)
    device = next(iter(summary.memory.values())).device
    ax.set_ylabel("GiB per " + ("GPU" if device == "gpu" else "process"), fontsize=8)
    ax.set_title("peak memory per phase: planned vs measured", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
