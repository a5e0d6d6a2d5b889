"""The page of `rlctl ui` (Gradio Blocks): tabs for the recipe and config, the data, the plan, the live run, the
runs of a folder, trying and evaluating a model, and the export. Every check is the CLI's (`views`), every action
the real `rlctl` command (`jobs`); what a tab shows of a run is read from its run directory, so every browser tab
sees the same."""

from __future__ import annotations

import html
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr
import pandas as pd

from rlctl.cli.web import views
from rlctl.errors import UserError

if TYPE_CHECKING:
    from rlctl.cli.web.jobs import Jobs

STAGES = ["sft", "rm", "rl", "dpo", "kto"]
DATA_ROLES = ["sft", "preference", "rl", "eval"]
TICK_S = 2.0
PLOT_HEIGHT = 340
CSS = """
.mono textarea {font-family: ui-monospace, monospace; font-size: 12px}
.ok {color: #15803d; font-weight: 600}
.bad {color: #b91c1c; font-weight: 600; white-space: pre-wrap}
.note {color: #92400e}
"""


def said(ok: bool, text: str, notes: tuple[str, ...] = ()) -> str:
    """A message for an HTML box: green when all is well, red (the CLI's error) otherwise."""
    lines = [f'<div class="{"ok" if ok else "bad"}">{html.escape(text)}</div>']
    lines += [f'<div class="note">note: {html.escape(n)}</div>' for n in notes]
    return "\n".join(lines)


def text_of(content: object) -> str:
    """A chat message's text: Gradio hands content over as a string or a list of typed parts."""
    if isinstance(content, list):
        return "".join(text_of(part) for part in content)
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return str(content)


def frame(points: list[views.Point]) -> pd.DataFrame | None:
    """Curve points as the plots take them: numbers on both axes, a line per series; None for none (a plot first
    drawn from an empty table draws no line later)."""
    if not points:
        return None
    table = pd.DataFrame([asdict(p) for p in points], columns=["series", "step", "value"])
    return table.astype({"series": str, "step": int, "value": float})


def plot(title: str, elem_id: str) -> gr.LinePlot:
    """A line per series over steps, titled inside the chart (a label above it would crowd out the legend)."""
    return gr.LinePlot(
        x="step", y="value", color="series", title=title, show_label=False, elem_id=elem_id, height=PLOT_HEIGHT
    )


def build(root: Path, jobs: Jobs) -> gr.Blocks:
    """The page for the folder `root`, its runs started through `jobs`."""
    from rlctl.cli.prepare import recipe_rows
    from rlctl.cli.results import export_folder
    from rlctl.cli.run import default_run_dir
    from rlctl.config import presets

    recipes = {r.name: r for r in recipe_rows()}
    blocks = {
        kind: [n for n, p in presets.all_presets().items() if p.kind == kind] for kind in ("algorithms", "hardware")
    }

    written: set[Path] = set()  # the config files this server wrote: the only ones it may write again

    def draft(yaml_text, config_path, algorithm, hardware, stages, recipe_stages, sets) -> views.Draft:
        chosen = tuple(s for s in STAGES if s in (stages or []))
        return views.Draft(
            yaml_text or "",
            config_path or "",
            algorithm or "",
            hardware or "",
            () if list(chosen) == list(recipe_stages or []) else chosen,
            views.set_items(sets or ""),
        )

    def pick(name):
        """A recipe chosen: its shipped YAML (as `rlctl presets show NAME` prints it) and its defaults."""
        if not name:
            return [gr.update()] * 8
        r = recipes[name]
        about = (
            f"**{r.name}**: {r.description}\n\nmodel `{r.model}` · algorithm `{r.algorithm}` · stages "
            f"`{', '.join(r.stages)}` · hardware `{r.hardware}`"
        )
        run_dir = default_run_dir(None, name).as_posix()
        text = presets.get(name).path.read_text()
        return text, f"configs/{name}.yaml", about, r.stages, r.stages, run_dir, "", ""

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
                yaml_box = gr.Code(language="yaml", label="Config (YAML)", lines=18, elem_id="yaml")
                check = gr.HTML(elem_id="check")
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
                command = gr.Code(
                    label="The same run from a terminal (in this folder)",
                    language="shell",
                    interactive=False,
                    elem_id="command",
                    lines=2,
                    wrap_lines=True,
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

        def on_check(*values):
            checked = views.check(root, draft(*values))
            return said(checked.config is not None, checked.message, checked.notes)

        recipe.change(pick, recipe, [yaml_box, config_path, about, stages, recipe_stages, run_dir, algorithm, hardware])
        gr.on(
            [yaml_box.change, algorithm.change, hardware.change, stages.change, sets.change],
            on_check,
            draft_inputs,
            check,
            show_progress="hidden",
        )

        def planned(*values):
            *given, where = values
            d = draft(*given)
            try:
                rel = views.inside(root, where, "run directory").as_posix()
                views.save(root, d, written)
                checked = views.check(root, d)
                if checked.config is None:
                    raise UserError(checked.message)
                shown = views.plan(checked.config, Path(rel))
            except UserError as e:
                return str(e), [], str(e), None, ""
            errors = "\n".join(f"error: {e}" for e in shown.errors)
            rows = {k: v for k, v in shown.data_rows.items()}
            return shown.text + errors, shown.memory, shown.data_text + errors, rows, d.train_command(rel)

        plan_outputs = [plan_text, memory, data_text, data_rows, command]
        plan_btn.click(planned, [*draft_inputs, run_dir], plan_outputs)
        read_data.click(lambda *v: planned(*v)[2:4], [*draft_inputs, run_dir], [data_text, data_rows])

        def use_file(role_name, path, current):
            try:
                rel = views.inside(root, path, "data file").as_posix()
            except UserError as e:
                return current, said(False, str(e))
            own = (f"data.{role_name}=", "data.generate=")
            lines = [x for x in views.set_items(current) if not x.startswith(own)]
            text = "\n".join([*lines, "data.generate=null", f"data.{role_name}={rel}"])
            return text, said(True, f"data.{role_name}: {rel}")

        use_data.click(use_file, [role, data_path, sets], [sets, check])

        def started(*values):
            *given, where = values
            d = draft(*given)
            try:
                rel = views.inside(root, where, "run directory")
                views.save(root, d, written)
                checked = views.check(root, d)
                if checked.config is None:
                    raise UserError(checked.message)
                job = jobs.start("train", [*d.args(), "--run-dir", rel.as_posix()], rel)
            except UserError as e:
                return gr.update(), gr.update(), said(False, str(e))
            return rel.as_posix(), gr.Tabs(selected="run"), said(True, job.state())

        start.click(started, [*draft_inputs, run_dir], [watched, tabs, job_state])

        def act(where, what):
            try:
                rel = views.inside(root, where, "run directory")
                if what == "stop":
                    return said(True, jobs.stop(rel))
                return said(True, jobs.start("resume", [rel.as_posix()], rel).state())
            except UserError as e:
                return said(False, str(e))

        stop.click(lambda w: act(w, "stop"), watched, job_state)
        resume.click(lambda w: act(w, "resume"), watched, job_state)

        def refresh(where):
            """The watched run's state, read from its run directory and the command on it."""
            if not where:
                return "", "no run yet: start one from the Plan tab", None, None, None, "", "", "", ""
            try:
                rel = views.inside(root, where, "run directory")
            except UserError as e:
                return said(False, str(e)), "", None, None, None, "", "", "", ""
            job = jobs.get(rel)
            state = views.run_state(root / rel, job.log if job else None)
            if job is not None:
                running = said(job.proc.poll() in (None, 0, 130, 143), job.state())
            else:
                running = said(True, "finished" if state.finished else "not started from this page")
            alarm_html = "".join(f'<div class="bad">alarm: {html.escape(a)}</div>' for a in state.alarms)
            plots = frame(state.loss), frame(state.reward), frame(state.heldout)
            return running, state.headline, *plots, alarm_html, state.log_tail, running, running

        def tick(where, last):
            """Every TICK_S: only what changed goes to the browser (redrawing a plot costs a slow laptop)."""
            values = refresh(where)
            seen = [f"{len(v)} points" if isinstance(v, pd.DataFrame) else v for v in values]
            last = last or [None] * len(values)
            return [*(gr.skip() if a == b else v for v, a, b in zip(values, seen, last, strict=True)), seen]

        shown = gr.State([])
        watch_outputs = [job_state, headline, curves, rewards, heldout, alarms, log, eval_state, export_state]
        timer.tick(tick, [watched, shown], [*watch_outputs, shown], show_progress="hidden")

        def listed(where):
            try:
                rows = views.runs(root, where)
            except UserError as e:
                gr.Warning(str(e))
                return [], gr.update(), gr.update()
            paths = [r.path for r in rows]
            table = [list(asdict(r).values()) for r in rows]
            return table, gr.update(choices=paths), gr.update(choices=paths)

        list_btn.click(listed, folder, [runs_table, run_a, run_b])

        def compared(a, b):
            try:
                pa, pb = (root / views.inside(root, x or "", "run directory") for x in (a, b))
            except UserError as e:
                gr.Warning(str(e))
                return frame([]), []
            pts = views.points(views.records(pa), views.TRAINING_KEYS, "A: ")
            pts += views.points(views.records(pb), views.TRAINING_KEYS, "B: ")
            return frame(pts), views.config_diff(pa, pb)

        compare_btn.click(compared, [run_a, run_b], [compare_plot, diff])
        open_btn.click(lambda a: (a, gr.Tabs(selected="run")), run_a, [watched, tabs])

        def evaluate(where, rows):
            try:
                rel = views.inside(root, where, "run directory")
                return said(True, jobs.start("eval", [rel.as_posix(), "--limit", str(int(rows or 50))], rel).state())
            except UserError as e:
                return said(False, str(e))

        eval_btn.click(evaluate, [watched, limit], eval_state)

        loaded = views.Loaded()  # this server's chat model, one at a time

        def models_of(where):
            try:
                found = views.model_folders(root, views.inside(root, where, "run directory"))
            except UserError as e:
                gr.Warning(str(e))
                return gr.update()
            return gr.update(choices=found, value=found[0] if found else None)

        def answer(folder, history, text, tokens):
            history = [{"role": m["role"], "content": text_of(m["content"])} for m in history or []]
            history.append({"role": "user", "content": text})
            try:
                said_back = views.reply(root, loaded, folder or "", history, int(tokens or 32))
            except UserError as e:
                said_back = f"error: {e}"
            return [*history, {"role": "assistant", "content": said_back}], ""

        models_btn.click(models_of, watched, model_pick)
        send.click(answer, [model_pick, chat, prompt, max_new], [chat, prompt])
        prompt.submit(answer, [model_pick, chat, prompt, max_new], [chat, prompt])

        def card_of(where, fmt_name, folder_out, repo_id):
            try:
                rel = views.inside(root, where, "run directory")
                target = export_folder(
                    rel, fmt_name, views.inside(root, folder_out, "export folder") if folder_out else None
                )
                return views.card(root / rel, root / target, repo_id)
            except UserError as e:
                return str(e)

        def exported(where, fmt_name, folder_out, repo_id):
            shown = card_of(where, fmt_name, folder_out, repo_id)
            try:
                rel = views.inside(root, where, "run directory")
                target = export_folder(
                    rel, fmt_name, views.inside(root, folder_out, "export folder") if folder_out else None
                )
                args = [rel.as_posix(), "--out", target.as_posix(), "--format", fmt_name]
                args += ["--push", repo_id] if repo_id else []
                return shown, said(True, jobs.start("export", args, rel).state())
            except UserError as e:
                return shown, said(False, str(e))

        card_btn.click(card_of, [watched, fmt, out, repo], card)
        export_btn.click(exported, [watched, fmt, out, repo], [card, export_state])

        def opened():
            """A new tab shows the run the server's latest start is on: every tab sees the same runs."""
            return jobs.latest.as_posix() if jobs.latest else ""

        page.load(opened, None, watched)
    return page
