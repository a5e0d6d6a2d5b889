"""The page of `rlctl ui` (Gradio Blocks): one function per tab lays out its components, each registered by name
(`wiring.Components`); `wire` connects each control to its handler (`actions`) by those names. Every label and help
text comes from `text` in the page's language. What a tab shows of a run is read from its run directory, so every
browser tab sees the same."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr

from rlctl.cli.web import actions as views
from rlctl.cli.web import draft, shown, text
from rlctl.cli.web.actions import Actions
from rlctl.cli.web.wiring import Components

if TYPE_CHECKING:
    from rlctl.cli.web.jobs import Jobs

TICK_S = 2.0
PLOT_HEIGHT = 300
CSS = """
.mono textarea {font-family: ui-monospace, monospace; font-size: 12px}
.ok {color: #15803d; font-weight: 600}
.bad {color: #b91c1c; font-weight: 600; white-space: pre-wrap}
.note {color: #92400e}
"""
# the log box follows its end: scrolled down after each update (Gradio's autoscroll keeps the position a user left)
LOG_JS = """
() => { const box = document.querySelector('#log textarea'); if (box) { box.scrollTop = box.scrollHeight; } }
"""


def eid(name: str) -> str:
    """A component's element id: its name with dashes."""
    return name.replace("_", "-")


class Layout:
    """Builds components named and labelled in one language."""

    def __init__(self, ui: Components, lang: str):
        self.ui, self.lang = ui, lang

    def __call__(self, name: str, kind, **options):
        """`kind(**options)` named `name`, its label (or a button's text) and help text in the page's language."""
        said = text.label(self.lang, name)
        if kind in (gr.Button,) or kind in (gr.Markdown,):
            options.setdefault("value", said)
        elif said:
            options.setdefault("label", said)
        helped = text.info(self.lang, name)
        if helped:
            options.setdefault("info", helped)
        return self.ui.add(name, kind(elem_id=eid(name), **options))

    def tab(self, name: str, tab_id: str):
        return self.ui.add(name, gr.Tab(text.label(self.lang, name), id=tab_id, elem_id=eid(name)))

    def plot(self, name: str):
        """A line per series over the run's one step axis, titled inside the chart, its legend below it."""
        return self(
            name, gr.LinePlot, x="step", y="value", color="series", show_label=False, height=PLOT_HEIGHT,
            title=text.label(self.lang, name), x_title=text.label(self.lang, "axis_step"),
            y_title=text.label(self.lang, "axis_value"), color_title=" ",
        )  # fmt: skip

    def table(self, name: str, columns: list[str], **options):
        return self(name, gr.Dataframe, headers=text.columns(self.lang, columns), interactive=False, **options)


def header(lay: Layout) -> None:
    with gr.Row():
        lay("title", gr.Markdown)
        choices = [(name, code) for code, name in text.LANGUAGES.items()]
        lay("lang", gr.Radio, choices=choices, value=lay.lang, show_label=False, container=False, scale=0)


def config_tab(lay: Layout, act: Actions) -> None:
    from rlctl.config import STAGE_ORDER, presets

    blocks = {k: [n for n, p in presets.all_presets().items() if p.kind == k] for k in ("algorithms", "hardware")}
    with lay.tab("tab_config", "config"):
        with gr.Row():
            recipes = [(f"{r.name}: {r.description}", r.name) for r in act.recipes.values()]
            lay("recipe", gr.Dropdown, choices=recipes, value=None, scale=3)
            lay("algorithm", gr.Dropdown, choices=["", *blocks["algorithms"]], value="")
            lay("hardware", gr.Dropdown, choices=["", *blocks["hardware"]], value="", allow_custom_value=True)
        lay("about", gr.Markdown, value="")
        lay("stages", gr.CheckboxGroup, choices=list(STAGE_ORDER))
        with gr.Row():
            lay("saved", gr.Dropdown, choices=[], allow_custom_value=True, scale=3)
            lay("list_saved", gr.Button, scale=0)
            lay("load_saved", gr.Button, scale=0)
        with lay("form", gr.Accordion, open=True):
            form_fields(lay)
        lay("sets", gr.Textbox, lines=3, placeholder="sft.max_steps=20")
        lay("config_path", gr.Textbox)
        lay("check", gr.HTML)  # above the editor: in view while the YAML is typed
        lay("yaml", gr.Code, language="yaml", lines=18)
        lay.ui.add("recipe_stages", gr.State([]))


def form_fields(lay: Layout) -> None:
    """The common settings: one row per group (the model, then each stage in pipeline order), a widget per key as
    its type in the schema says; a stage's row shows while the stage is chosen."""
    for group, keys in draft.form_keys().items():
        with lay.ui.add(f"group_{group}", gr.Row(visible=group == "model", elem_id=f"group-{group}")):
            for key in keys:
                fld = draft.form_field(key)
                name = shown.form_name(key)
                label = f"{key}  ·  {text.label(lay.lang, 'form_' + key.split('.')[-1])}"
                common = {"label": label, "elem_id": eid(name)}
                if fld.kind == "choice":
                    lay.ui.add(name, gr.Dropdown(choices=list(fld.choices), **common))
                elif fld.kind == "switch":
                    lay.ui.add(name, gr.Checkbox(**common))
                elif fld.kind in ("integer", "number"):
                    lay.ui.add(name, gr.Number(precision=0 if fld.kind == "integer" else None, **common))
                else:
                    lay.ui.add(name, gr.Textbox(**common))


def data_tab(lay: Layout) -> None:
    from rlctl.config import presets

    with lay.tab("tab_data", "data"):
        lay("data_intro", gr.Markdown)
        with gr.Row():
            lay("data_role", gr.Dropdown, choices=list(presets.DATA_FILES), value=presets.DATA_FILES[0])
            lay("data_path", gr.Dropdown, choices=[], allow_custom_value=True, scale=3)
            lay("list_data", gr.Button, scale=0)
            lay("use_data", gr.Button, scale=0)
        lay("data_state", gr.HTML)
        with gr.Row():
            lay("preview_prev", gr.Button, scale=0)
            lay("data_page", gr.Number, value=1, precision=0, minimum=1, scale=0)
            lay("preview_next", gr.Button, scale=0)
            lay("preview_state", gr.Markdown, value="")
        lay("data_preview", gr.Dataframe, interactive=False, wrap=True)
        lay("read_data", gr.Button)
        lay("data_text", gr.Code, interactive=False)
        lay("data_rows", gr.JSON)


def plan_tab(lay: Layout) -> None:
    with lay.tab("tab_plan", "plan"):
        lay("run_dir", gr.Textbox)
        with gr.Row():
            lay("plan_btn", gr.Button)
            lay("start", gr.Button, variant="primary")
        lay("start_state", gr.HTML)  # beside Start: its refusals are read where it was clicked
        lay("command", gr.Textbox, interactive=False, lines=1, max_lines=4, buttons=["copy"], elem_classes="mono")
        lay("plan_text", gr.Code, interactive=False)
        lay.table("memory", draft.MEMORY_COLUMNS)


def run_tab(lay: Layout) -> None:
    from rlctl.cli.web.watch import DEVICE_COLUMNS, SAMPLE_COLUMNS

    with lay.tab("tab_run", "run"):
        with gr.Row():
            lay("watched", gr.Textbox, scale=3)
            lay("stop", gr.Button, variant="stop", interactive=False)
            lay("resume", gr.Button, interactive=False)
        lay("job_state", gr.HTML)
        lay("headline", gr.Textbox, interactive=False)
        with gr.Row():
            lay.plot("loss_plot")
            lay.plot("reward_plot")
        with gr.Row():
            lay.plot("accuracy_plot")
            lay.plot("scores_plot")
        lay("alarms", gr.HTML)
        lay.table("rl_samples", SAMPLE_COLUMNS, wrap=True)
        lay.table("device", DEVICE_COLUMNS)
        lay("log", gr.Textbox, interactive=False, lines=12, max_lines=12, elem_classes="mono")


def runs_tab(lay: Layout) -> None:
    from rlctl.cli.web.watch import FINAL_COLUMNS

    with lay.tab("tab_runs", "runs"):
        with gr.Row():
            lay("runs_folder", gr.Textbox, value="runs", scale=3)
            lay("list_runs", gr.Button)
        lay.table("runs_table", views.RUN_COLUMNS)
        with gr.Row():
            lay("run_a", gr.Dropdown, choices=[], allow_custom_value=True)
            lay("run_b", gr.Dropdown, choices=[], allow_custom_value=True)
            lay("compare", gr.Button)
            lay("open_a", gr.Button)
        lay.plot("compare_plot")
        lay.table("final_table", FINAL_COLUMNS)
        lay.table("diff", views.DIFF_COLUMNS)


def chat_tab(lay: Layout) -> None:
    with lay.tab("tab_chat", "chat"):
        with gr.Row():
            lay("model_pick", gr.Dropdown, choices=[], scale=3, allow_custom_value=True)
            lay("list_models", gr.Button, scale=0)
        with gr.Row():
            lay("system_prompt", gr.Textbox, scale=3)
            lay("temperature", gr.Number, value=0, minimum=0, maximum=2, step=0.1)
            lay("top_p", gr.Number, value=1.0, minimum=0.01, maximum=1.0, step=0.05)
            lay("max_new", gr.Number, value=32, precision=0, minimum=1)
        lay("chat_note", gr.Markdown, value="")
        lay("chat", gr.Chatbot, height=260)
        with gr.Row():
            lay("prompt", gr.Textbox, scale=4)
            lay("send", gr.Button)
            lay("clear_chat", gr.Button, scale=0)


def eval_tab(lay: Layout) -> None:
    from rlctl.cli.web.trying import SAMPLE_COLUMNS

    with lay.tab("tab_eval", "eval"):
        lay("eval_intro", gr.Markdown)
        with gr.Row():
            lay("eval_limit", gr.Number, value=50, precision=0, minimum=1)
            lay("eval_samples", gr.Number, value=1, precision=0, minimum=1)
            lay("eval_btn", gr.Button, variant="primary")
        lay("eval_state", gr.HTML)  # beside its button: the command's state, then its results
        lay.table("eval_table", views.EVAL_COLUMNS)
        lay.table("eval_rows", SAMPLE_COLUMNS, wrap=True)


def export_tab(lay: Layout) -> None:
    from rlctl.after.gguf_export import TYPES as GGUF_TYPES

    with lay.tab("tab_export", "export"):
        with gr.Row():
            lay("export_format", gr.Radio, choices=["hf", "gguf"], value="hf")
            lay("gguf_type", gr.Radio, choices=list(GGUF_TYPES), value=GGUF_TYPES[0])
            lay("export_out", gr.Textbox)
            lay("export_repo", gr.Textbox)
        with gr.Row():
            lay("card_btn", gr.Button)
            lay("export_btn", gr.Button, variant="primary")
        lay("export_state", gr.HTML)  # beside its button: the command's state and the end of its output
        lay("card", gr.Code, language="markdown", interactive=False, wrap_lines=True)


def build(root: Path, jobs: Jobs, lang: str = "en") -> gr.Blocks:
    """The page for the folder `root`, its runs started through `jobs`, in `lang`: the tabs, then the wiring."""
    return layout(root, jobs, lang)[0]


def layout(root: Path, jobs: Jobs, lang: str = "en") -> tuple[gr.Blocks, Components]:
    """`build`, with the page's components by name."""
    act = Actions(root, jobs)
    ui = Components()
    lay = Layout(ui, lang)
    with gr.Blocks(title="rlctl", analytics_enabled=False) as page:
        header(lay)
        with ui.add("tabs", gr.Tabs(elem_id="tabs")):
            config_tab(lay, act)
            data_tab(lay)
            plan_tab(lay)
            run_tab(lay)
            runs_tab(lay)
            chat_tab(lay)
            eval_tab(lay)
            export_tab(lay)
        ui.add("timer", gr.Timer(TICK_S))
        ui.add("seen", gr.State({}))  # what this browser tab's last refresh sent
        wire(ui, act, page)
    return page, ui


def wire(ui: Components, act: Actions, page: gr.Blocks) -> None:
    """Each control to its handler, by name (`Components.on`)."""
    from rlctl.cli.web import shown as a

    ui.on(ui["recipe"].change, act.pick, a.Picked)
    edits = [ui[n].change for n in ("yaml", "algorithm", "hardware", "stages", "sets")]
    ui.on(edits, act.check, a.CheckShown, show_progress="hidden")
    ui.on(ui["stages"].change, act.stage_rows, a.StageRows, show_progress="hidden")
    for key in (k for keys in draft.form_keys().values() for k in keys):
        name = a.form_name(key)
        setter = act.form_setter(key)
        ui.on(
            ui[name].input,
            setter,
            a.SetsShown,
            names=[name, "sets"],
            show_progress="hidden",
            trigger_mode="always_last",
        )
    ui.on([ui["list_saved"].click, page.load], act.list_saved, a.SavedList)
    ui.on(ui["load_saved"].click, act.load_saved, a.Loaded)

    ui.on([ui["list_data"].click, page.load], act.list_data, a.DataList)
    ui.on(ui["use_data"].click, act.use_file, a.UsedFile)
    ui.on(ui["data_path"].change, act.first_page, a.PreviewShown, show_progress="hidden")
    ui.on(ui["preview_prev"].click, act.page_before, a.PreviewShown)
    ui.on(ui["preview_next"].click, act.page_after, a.PreviewShown)
    ui.on(ui["read_data"].click, act.read_data, a.DataShown)
    ui.on(ui["plan_btn"].click, act.plan, a.PlanShown)
    ui.on(ui["start"].click, act.start, a.Started)

    ui.on(ui["stop"].click, act.stop, a.JobSaid)
    ui.on(ui["resume"].click, act.resume, a.JobSaid)
    ui.on(ui["timer"].tick, act.tick, a.RunShown, show_progress="hidden")
    ui["log"].change(None, None, None, js=LOG_JS)
    ui.on(page.load, act.opened, a.Opened)

    ui.on(ui["list_runs"].click, act.list_runs, a.RunsList)
    compared = ui.on(ui["compare"].click, act.compare, a.Compared)
    ui.then(compared, act.compare_legend, a.CompareLegend)
    ui.on(ui["open_a"].click, act.watch_a, a.Opened)

    ui.on(ui["list_models"].click, act.models, a.ModelList)
    ui.on([ui["send"].click, ui["prompt"].submit], act.answer, a.ChatShown)
    ui.on(ui["clear_chat"].click, act.clear_chat, a.ChatShown)
    ui.on(ui["eval_btn"].click, act.evaluate, a.EvalStarted)

    ui.on(ui["card_btn"].click, act.card, a.CardShown)
    ui.on(ui["export_btn"].click, act.export, a.ExportStarted)

    labelled = text.labelled(ui.named)
    gr.on([ui["lang"].change], lambda lang: text.relabel(ui.named, labelled, lang), ui["lang"], labelled)
