"""The typed views of `rlctl ui`: what each handler (`actions`) returns, one dataclass per answer, each field
named after the component it updates (`wiring`); a field left at SAME leaves its component as it is. The config
check's view and the form's rows are made from the schema's form keys (`draft.form_keys`); a plot's table and legend
are sent as `plotted` says."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from rlctl.cli.web import draft, watch
from rlctl.cli.web.wiring import SAME, Same

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569")


def frame(points: list[watch.Point]) -> pd.DataFrame:
    """Curve points as a plot takes them: a table, empty too (a plot keeps drawing what comes later)."""
    table = pd.DataFrame([dataclasses.asdict(p) for p in points], columns=["series", "step", "value"])
    return table.astype({"series": str, "step": int, "value": float})


def series_of(table: pd.DataFrame) -> list[str]:
    return sorted(set(table["series"]))


def legend(series: list[str]) -> gr.LinePlot:
    """A plot's colours and legend for `series`. Gradio's plot redraws itself when they change, from the table it
    held before this update: so the legend of a series is sent only once the browser holds a table with it (one
    refresh after its points), and the series that appear later (the RM's, RL's) are drawn as they come."""
    return gr.LinePlot(color_map={s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}, colors_in_legend=series)


def plotted(name: str, table: pd.DataFrame, seen: dict) -> gr.LinePlot | Same:
    """A plot's update for this refresh: its new table (when it changed), else its legend for the series of the
    table the browser holds (when it lacks them), else nothing. `seen` keeps what was sent, per browser tab."""
    held = seen.get(f"{name}:series", [])
    if seen.get(f"{name}:legend") != held:
        seen[f"{name}:legend"] = held
        return legend(held)
    key = fingerprint(table)
    if seen.get(name) == key:
        return SAME
    seen[name], seen[f"{name}:series"] = key, series_of(table)
    return gr.LinePlot(value=table)


def fingerprint(value: object) -> str:
    """What a refresh compares with the last one it sent: a table by all its cells, a component (a plot, a button)
    by the arguments it was made with."""

    def stable(v: object) -> object:
        if isinstance(v, pd.DataFrame):
            return list(v.columns), pd.util.hash_pandas_object(v, index=False).values.tobytes()
        if isinstance(v, gr.components.Component):
            return type(v).__name__, stable(getattr(v, "constructor_args", None) or {})
        if isinstance(v, dict):
            return sorted((str(k), stable(x)) for k, x in v.items())
        if isinstance(v, list | tuple):
            return [stable(x) for x in v]
        return v

    return hashlib.sha1(repr(stable(value)).encode()).hexdigest()


def form_name(key: str) -> str:
    """The component name of a form key: `form__rl__max_steps` for rl.max_steps."""
    return "form__" + key.replace(".", "__")


FORM_NAMES = [form_name(k) for keys in draft.form_keys().values() for k in keys]


@dataclass
class Picked:
    yaml: str | Same = SAME
    config_path: str | Same = SAME
    about: str | Same = SAME
    stages: list[str] | Same = SAME
    recipe_stages: list[str] | Same = SAME
    run_dir: str | Same = SAME
    algorithm: str | Same = SAME
    hardware: str | Same = SAME


# the check's line and the form's values, one field per form key
CheckShown = dataclasses.make_dataclass(
    "CheckShown", [("check", str | Same, SAME)] + [(n, Any, SAME) for n in FORM_NAMES]
)
StageRows = dataclasses.make_dataclass(
    "StageRows", [(f"group_{g}", Any, SAME) for g in draft.form_keys() if g != "model"]
)


@dataclass
class SetsShown:
    sets: str | Same = SAME


@dataclass
class SavedList:
    saved: gr.Dropdown | Same = SAME


@dataclass
class Loaded:
    yaml: str | Same = SAME
    config_path: str | Same = SAME
    check: str | Same = SAME


@dataclass
class DataList:
    data_path: gr.Dropdown | Same = SAME


@dataclass
class UsedFile:
    sets: str | Same = SAME
    data_state: str | Same = SAME


@dataclass
class PreviewShown:
    data_preview: pd.DataFrame | Same | None = SAME
    data_page: int | Same = SAME
    preview_state: str | Same = SAME


@dataclass
class DataShown:
    data_text: str | Same = SAME
    data_rows: dict | Same | None = SAME


@dataclass
class PlanShown:
    plan_text: str | Same = SAME
    memory: pd.DataFrame | Same = SAME
    data_text: str | Same = SAME
    data_rows: dict | Same | None = SAME
    command: str | Same = SAME
    start_state: str | Same = SAME


@dataclass
class Started:
    watched: str | Same = SAME
    tabs: gr.Tabs | Same = SAME
    start_state: str | Same = SAME
    job_state: str | Same = SAME


@dataclass
class JobSaid:
    job_state: str | Same = SAME


@dataclass
class RunShown:
    """The Run tab as a refresh shows it, and the state of the commands beside their buttons."""

    job_state: str | Same = SAME
    headline: str | Same = SAME
    loss_plot: pd.DataFrame | gr.LinePlot | Same = SAME  # a table from `watch`, an update from `tick`
    reward_plot: pd.DataFrame | gr.LinePlot | Same = SAME
    accuracy_plot: pd.DataFrame | gr.LinePlot | Same = SAME
    scores_plot: pd.DataFrame | gr.LinePlot | Same = SAME
    alarms: str | Same = SAME
    rl_samples: pd.DataFrame | Same = SAME
    device: pd.DataFrame | Same = SAME
    log: str | Same = SAME
    stop: gr.Button | Same = SAME
    resume: gr.Button | Same = SAME
    eval_state: str | Same = SAME
    eval_table: pd.DataFrame | Same = SAME
    eval_rows: pd.DataFrame | Same = SAME
    export_state: str | Same = SAME
    seen: dict | Same = SAME


@dataclass
class Opened:
    watched: str | Same = SAME
    tabs: gr.Tabs | Same = SAME


@dataclass
class RunsList:
    runs_table: pd.DataFrame | Same = SAME
    run_a: gr.Dropdown | Same = SAME
    run_b: gr.Dropdown | Same = SAME


@dataclass
class Compared:
    compare_plot: gr.LinePlot | Same = SAME
    final_table: pd.DataFrame | Same = SAME
    diff: pd.DataFrame | Same = SAME


@dataclass
class CompareLegend:
    compare_plot: gr.LinePlot | Same = SAME


@dataclass
class ModelList:
    model_pick: gr.Dropdown | Same = SAME
    chat_note: str | Same = SAME
    prompt: gr.Textbox | Same = SAME
    max_new: int | Same = SAME


@dataclass
class ChatShown:
    chat: list[dict] | Same = SAME
    prompt: str | Same = SAME


@dataclass
class EvalStarted:
    eval_state: str | Same = SAME


@dataclass
class CardShown:
    card: str | Same = SAME


@dataclass
class ExportStarted:
    card: str | Same = SAME
    export_state: str | Same = SAME
