"""The page of `rlctl ui` (Gradio Blocks): tabs for the recipe and config, the data, the plan, the live run, the
runs of a folder, trying and evaluating a model, and the export, wired to what each control does (`actions`). What
a tab shows of a run is read from its run directory, so every browser tab sees the same."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr

from rlctl.cli.web import views
from rlctl.cli.web.actions import STAGES, Actions

if TYPE_CHECKING:
    from rlctl.cli.web.jobs import Jobs

DATA_ROLES = ["sft", "preference", "rl", "eval"]
TICK_S = 2.0
PLOT_HEIGHT = 340
CSS = """
.mono textarea {font-family: ui-monospace, monospace; font-size: 12px}
.ok {color: #15803d; font-weight: 600}
.bad {color: #b91c1c; font-weight: 600; white-space: pre-wrap}
.note {color: #92400e}
"""


def plot(title: str, elem_id: str) -> gr.LinePlot:
    """A line per series over steps, titled inside the chart (a label above it would crowd out the legend)."""
    return gr.LinePlot(
        x="step", y="value", color="series", title=title, show_label=False, elem_id=elem_id, height=PLOT_HEIGHT
    )


def build(root: Path, jobs: Jobs) -> gr.Blocks:
    """The page for the folder `root`, its runs started through `jobs`: the layout, then what each control does."""
    from rlctl.config import presets

    act = Actions(root, jobs)
    recipes = act.recipes
    blocks = {
        kind: [n for n, p in presets.all_presets().items() if p.kind == kind] for kind in ("algorithms", "hardware")
    }

    with gr.Blocks(title="rlctl", analytics_enabled=False) as page:
        gr.Markdown("## rlctl: post-training without code")
        recipe_stages = gr.State([])
        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("1 Recipe & config", id="config"):
                with gr.Row():
                    recipe = gr.Dropdown(
                        [(f"{r.name}: {r.description}", r.name) for r in recipes.values()],
                        value=None,
                        label="Recipe",
                        elem_id="recipe",
                        scale=3,
                    )
                    algorithm = gr.Dropdown(
                        ["", *blocks["algorithms"]], value="", label="Algorithm (--algorithm)", elem_id="algorithm"
                    )
                    hardware = gr.Dropdown(
                        ["", *blocks["hardware"]],
                        value="",
                        allow_custom_value=True,
                        label="Hardware (--hardware, e.g. 1xH100-80GB)",
                        elem_id="hardware",
                    )
                about = gr.Markdown(elem_id="about")
                stages = gr.CheckboxGroup(STAGES, label="Stages (--stages)", elem_id="stages")
                sets = gr.Textbox(
                    label="Overrides (--set KEY=VALUE, one a line)",
                    lines=3,
                    elem_id="sets",
                    placeholder="sft.max_steps=20",
                )
                config_path = gr.Textbox(label="Config file (saved when you plan or start)", elem_id="config-path")
                check = gr.HTML(elem_id="check")  # above the editor: in view while the YAML is typed
                yaml_box = gr.Code(language="yaml", label="Config (YAML)", lines=18, elem_id="yaml")
            with gr.Tab("2 Data", id="data"):
                gr.Markdown("The recipe's generated task, or your file: it is read as `rlctl plan` reads it.")
                with gr.Row():
                    role = gr.Dropdown(DATA_ROLES, value="sft", label="Role (data.ROLE)", elem_id="data-role")
                    data_path = gr.Textbox(label="File (in this folder)", elem_id="data-path", scale=3)
                    use_data = gr.Button("Use this file", elem_id="use-data")
                read_data = gr.Button("Read the data", elem_id="read-data")
                data_text = gr.Code(label="Formats, rows, lengths", interactive=False, elem_id="data-text")
                data_rows = gr.JSON(label="First rows", elem_id="data-rows")
            with gr.Tab("3 Plan", id="plan"):
                run_dir = gr.Textbox(label="Run directory (--run-dir)", elem_id="run-dir")
                with gr.Row():
                    plan_btn = gr.Button("Plan", elem_id="plan-btn")
                    start = gr.Button("Start training", variant="primary", elem_id="start")
                command = gr.Textbox(
                    label="The same run from a terminal (in this folder)",
                    interactive=False,
                    lines=1,
                    max_lines=4,
                    buttons=["copy"],
                    elem_id="command",
                    elem_classes="mono",
                )
                plan_text = gr.Code(label="rlctl plan", interactive=False, elem_id="plan-text")
                memory = gr.Dataframe(
                    headers=views.MEMORY_COLUMNS,
                    label="Memory per phase against the budget",
                    interactive=False,
                    elem_id="memory",
                )
            with gr.Tab("4 Run", id="run"):
                with gr.Row():
                    watched = gr.Textbox(label="Run directory", elem_id="watched", scale=3)
                    stop = gr.Button("Stop (checkpoint)", variant="stop", elem_id="stop")
                    resume = gr.Button("Resume", elem_id="resume")
                job_state = gr.HTML(elem_id="job-state")
                headline = gr.Textbox(label="Progress", interactive=False, elem_id="headline")
                with gr.Row():
                    curves = plot("Loss", "curves")
                    rewards = plot("Reward and KL (RL)", "rewards")
                    heldout = plot("Held-out scores", "heldout")
                alarms = gr.HTML(elem_id="alarms")
                log = gr.Textbox(
                    label="Output of the latest command on this run (its end)",
                    interactive=False,
                    lines=12,
                    max_lines=12,
                    autoscroll=True,
                    elem_id="log",
                    elem_classes="mono",
                )
            with gr.Tab("5 Runs", id="runs"):
                with gr.Row():
                    folder = gr.Textbox("runs", label="Runs folder", elem_id="runs-folder", scale=3)
                    list_btn = gr.Button("List", elem_id="list-runs")
                runs_table = gr.Dataframe(
                    headers=["path", "name", "stages", "completed", "latest"], interactive=False, elem_id="runs-table"
                )
                with gr.Row():
                    run_a = gr.Dropdown([], label="Run A", elem_id="run-a", allow_custom_value=True)
                    run_b = gr.Dropdown([], label="Run B", elem_id="run-b", allow_custom_value=True)
                    compare_btn = gr.Button("Compare", elem_id="compare")
                    open_btn = gr.Button("Watch A", elem_id="open-a")
                compare_plot = plot("Loss, reward and KL of A and B", "compare-plot")
                diff = gr.Dataframe(
                    headers=["key", "A", "B"], label="Config differences", interactive=False, elem_id="diff"
                )
            with gr.Tab("6 Try & eval", id="try"):
                with gr.Row():
                    model_pick = gr.Dropdown(
                        [],
                        label="Model (final folder, checkpoint or export of the run)",
                        elem_id="model-pick",
                        scale=3,
                        allow_custom_value=True,
                    )
                    models_btn = gr.Button("List the run's models", elem_id="list-models")
                    max_new = gr.Number(32, precision=0, minimum=1, label="Max new tokens", elem_id="max-new")
                chat = gr.Chatbot(label="Try it", elem_id="chat", height=260)
                with gr.Row():
                    prompt = gr.Textbox(label="Prompt", elem_id="prompt", scale=4, placeholder="12+34=")
                    send = gr.Button("Send", elem_id="send")
                gr.Markdown("Runs `rlctl eval RUN` on the run's held-out data (the Run tab's run).")
                with gr.Row():
                    limit = gr.Number(50, precision=0, minimum=1, label="Rows (--limit)", elem_id="eval-limit")
                    eval_btn = gr.Button("Evaluate", elem_id="eval")
                eval_state = gr.HTML(elem_id="eval-state")
            with gr.Tab("7 Export", id="export"):
                with gr.Row():
                    fmt = gr.Radio(["hf", "gguf"], value="hf", label="Format (--format)", elem_id="export-format")
                    out = gr.Textbox(label="Folder (--out; default RUN/export)", elem_id="export-out")
                    repo = gr.Textbox(label="Also push to Hub repo (--push namespace/name)", elem_id="export-repo")
                with gr.Row():
                    card_btn = gr.Button("Show the model card", elem_id="card-btn")
                    export_btn = gr.Button("Export", variant="primary", elem_id="export-btn")
                export_state = gr.HTML(elem_id="export-state")
                card = gr.Code(
                    label="Model card (README.md)",
                    language="markdown",
                    interactive=False,
                    wrap_lines=True,
                    elem_id="card",
                )
        timer = gr.Timer(TICK_S)

        draft_inputs = [yaml_box, config_path, algorithm, hardware, stages, recipe_stages, sets]
        picked = [yaml_box, config_path, about, stages, recipe_stages, run_dir, algorithm, hardware]
        recipe.change(act.pick, recipe, picked)
        edits = [yaml_box.change, algorithm.change, hardware.change, stages.change, sets.change]
        gr.on(edits, act.check, draft_inputs, check, show_progress="hidden")
        use_data.click(act.use_file, [role, data_path, sets], [sets, check])
        read_data.click(act.read_data, [*draft_inputs, run_dir], [data_text, data_rows])
        plan_btn.click(act.plan, [*draft_inputs, run_dir], [plan_text, memory, data_text, data_rows, command])
        start.click(act.start, [*draft_inputs, run_dir], [watched, tabs, job_state])

        stop.click(act.stop, watched, job_state)
        resume.click(act.resume, watched, job_state)
        shown = gr.State([])  # what this tab's last tick sent
        watch_outputs = [job_state, headline, curves, rewards, heldout, alarms, log, eval_state, export_state]
        timer.tick(act.tick, [watched, shown], [*watch_outputs, shown], show_progress="hidden")
        page.load(act.opened, None, watched)

        list_btn.click(act.list_runs, folder, [runs_table, run_a, run_b])
        compare_btn.click(act.compare, [run_a, run_b], [compare_plot, diff])
        open_btn.click(lambda a: (a, gr.Tabs(selected="run")), run_a, [watched, tabs])

        eval_btn.click(act.evaluate, [watched, limit], eval_state)
        models_btn.click(act.models, watched, model_pick)
        send.click(act.answer, [model_pick, chat, prompt, max_new], [chat, prompt])
        prompt.submit(act.answer, [model_pick, chat, prompt, max_new], [chat, prompt])

        card_btn.click(act.card, [watched, fmt, out, repo], card)
        export_btn.click(act.export, [watched, fmt, out, repo], [card, export_state])
    return page
