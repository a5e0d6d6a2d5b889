"""What each control of `rlctl ui` does: the page's handlers, which take the controls' values and return what the
page shows. Every rule is the CLI's (`views`), every action the real `rlctl` command (`jobs`)."""

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


def draft(yaml_text, config_path, algorithm, hardware, stages, recipe_stages, sets) -> views.Draft:
    """The config controls' values as a draft; the stages only when they differ from the recipe's."""
    chosen = tuple(s for s in STAGES if s in (stages or []))
    return views.Draft(
        yaml_text or "",
        config_path or "",
        algorithm or "",
        hardware or "",
        () if list(chosen) == list(recipe_stages or []) else chosen,
        views.set_items(sets or ""),
    )


class Actions:
    """The handlers for the folder `root`, its runs started through `jobs`; shared by every browser tab."""

    def __init__(self, root: Path, jobs: Jobs):
        from rlctl.cli.prepare import recipe_rows

        self.root, self.jobs = root, jobs
        self.recipes = {r.name: r for r in recipe_rows()}
        self.written: set[Path] = set()  # the config files this server wrote: the only ones it may write again
        self.loaded = views.Loaded()  # the chat box's model, one at a time

    def run_dir(self, where: str) -> Path:
        return views.inside(self.root, where or "", "run directory")

    # ------------------------------------------------------------------------------------------------ the config
    def pick(self, name):
        """A recipe chosen: its shipped YAML (as `rlctl presets show NAME` prints it) and its defaults."""
        from rlctl.cli.run import default_run_dir
        from rlctl.config import presets

        if not name:
            return [gr.update()] * 8
        r = self.recipes[name]
        about = (
            f"**{r.name}**: {r.description}\n\nmodel `{r.model}` · algorithm `{r.algorithm}` · stages "
            f"`{', '.join(r.stages)}` · hardware `{r.hardware}`"
        )
        text = presets.get(name).path.read_text()
        return text, f"configs/{name}.yaml", about, r.stages, r.stages, default_run_dir(None, name).as_posix(), "", ""

    def check(self, *values):
        checked = views.check(self.root, draft(*values))
        return said(checked.config is not None, checked.message, checked.notes)

    def use_file(self, role, path, current):
        """A data file wired into data.ROLE as --set items (the generated task off)."""
        try:
            rel = views.inside(self.root, path, "data file").as_posix()
        except UserError as e:
            return current, said(False, str(e))
        own = (f"data.{role}=", "data.generate=")
        lines = [x for x in views.set_items(current) if not x.startswith(own)]
        return "\n".join([*lines, "data.generate=null", f"data.{role}={rel}"]), said(True, f"data.{role}: {rel}")

    def _valid(self, given: list, where: str) -> tuple[views.Draft, Path, views.Checked]:
        """The draft saved where its command reads it, and checked; a UserError when it is not valid."""
        d = draft(*given)
        rel = self.run_dir(where)
        views.save(self.root, d, self.written)
        checked = views.check(self.root, d)
        if checked.config is None:
            raise UserError(checked.message)
        return d, rel, checked

    def plan(self, *values):
        """`rlctl plan` of the draft: its text, the memory table, the data, the first rows, the train command."""
        *given, where = values
        try:
            d, rel, checked = self._valid(given, where)
            shown = views.plan(checked.config, rel)
        except UserError as e:
            return str(e), [], str(e), None, ""
        errors = "\n".join(f"error: {e}" for e in shown.errors)
        command = d.train_command(rel.as_posix())
        return shown.text + errors, shown.memory, shown.data_text + errors, shown.data_rows, command

    def read_data(self, *values):
        return self.plan(*values)[2:4]

    # --------------------------------------------------------------------------------------------------- a run
    def start(self, *values):
        *given, where = values
        try:
            d, rel, _ = self._valid(given, where)
            job = self.jobs.start("train", [*d.args(), "--run-dir", rel.as_posix()], rel)
        except UserError as e:
            return gr.update(), gr.update(), said(False, str(e))
        return rel.as_posix(), gr.Tabs(selected="run"), said(True, job.state())

    def stop(self, where):
        try:
            return said(True, self.jobs.stop(self.run_dir(where)))
        except UserError as e:
            return said(False, str(e))

    def resume(self, where):
        try:
            rel = self.run_dir(where)
            return said(True, self.jobs.start("resume", [rel.as_posix()], rel).state())
        except UserError as e:
            return said(False, str(e))

    def watch(self, where):
        """The watched run's state, read from its run directory and the command on it: the job's state, the
        headline, three plots, alarms, the log, and the job's state again for the eval and export tabs."""
        if not where:
            return "", "no run yet: start one from the Plan tab", None, None, None, "", "", "", ""
        try:
            rel = self.run_dir(where)
        except UserError as e:
            return said(False, str(e)), "", None, None, None, "", "", "", ""
        job = self.jobs.get(rel)
        state = views.run_state(self.root / rel, job.log if job else None)
        if job is not None:
            running = said(job.proc.poll() in (None, 0, 130, 143), job.state())
        else:
            running = said(True, "finished" if state.finished else "not started from this page")
        alarm_html = "".join(f'<div class="bad">alarm: {html.escape(a)}</div>' for a in state.alarms)
        plots = frame(state.loss), frame(state.reward), frame(state.heldout)
        return running, state.headline, *plots, alarm_html, state.log_tail, running, running

    def tick(self, where, last):
        """`watch`, sending only what changed since this tab's last tick (redrawing a plot costs a slow laptop)."""
        values = self.watch(where)
        seen = [f"{len(v)} points" if isinstance(v, pd.DataFrame) else v for v in values]
        last = last or [None] * len(values)
        return [*(gr.skip() if a == b else v for v, a, b in zip(values, seen, last, strict=True)), seen]

    def opened(self):
        """A new tab shows the run the server's latest start is on: every tab sees the same runs."""
        return self.jobs.latest.as_posix() if self.jobs.latest else ""

    # ------------------------------------------------------------------------------------------- runs compared
    def list_runs(self, where):
        try:
            rows = views.runs(self.root, where)
        except UserError as e:
            gr.Warning(str(e))
            return [], gr.update(), gr.update()
        paths = [r.path for r in rows]
        table = [[r.path, r.name, r.stages, r.completed, r.latest] for r in rows]
        return table, gr.update(choices=paths), gr.update(choices=paths)

    def compare(self, a, b):
        try:
            pa, pb = (self.root / self.run_dir(x) for x in (a, b))
        except UserError as e:
            gr.Warning(str(e))
            return None, []
        pts = views.points(views.records(pa), views.TRAINING_KEYS, "A: ")
        pts += views.points(views.records(pb), views.TRAINING_KEYS, "B: ")
        return frame(pts), views.config_diff(pa, pb)

    # --------------------------------------------------------------------------------------------- try and eval
    def evaluate(self, where, rows):
        try:
            rel = self.run_dir(where)
            views.served_run_config(self.root, rel)
            return said(True, self.jobs.start("eval", [rel.as_posix(), "--limit", str(int(rows or 50))], rel).state())
        except UserError as e:
            return said(False, str(e))

    def models(self, where):
        try:
            found = views.model_folders(self.root, self.run_dir(where))
        except UserError as e:
            gr.Warning(str(e))
            return gr.update()
        return gr.update(choices=found, value=found[0] if found else None)

    def answer(self, folder, history, text, tokens):
        history = [{"role": m["role"], "content": text_of(m["content"])} for m in history or []]
        history.append({"role": "user", "content": text})
        try:
            said_back = views.reply(self.root, self.loaded, folder or "", history, int(tokens or 32))
        except UserError as e:
            said_back = f"error: {e}"
        return [*history, {"role": "assistant", "content": said_back}], ""

    # --------------------------------------------------------------------------------------------------- export
    def _export_target(self, where, fmt, folder_out) -> tuple[Path, Path]:
        from rlctl.cli.results import export_folder

        rel = self.run_dir(where)
        out = views.inside(self.root, folder_out, "export folder") if folder_out else None
        return rel, export_folder(rel, fmt, out)

    def card(self, where, fmt, folder_out, repo_id):
        try:
            rel, target = self._export_target(where, fmt, folder_out)
            return views.card(self.root / rel, self.root / target, repo_id)
        except UserError as e:
            return str(e)

    def export(self, where, fmt, folder_out, repo_id):
        """The card first, then `rlctl export` writing it."""
        shown = self.card(where, fmt, folder_out, repo_id)
        try:
            rel, target = self._export_target(where, fmt, folder_out)
            args = [rel.as_posix(), "--out", target.as_posix(), "--format", fmt]
            args += ["--push", repo_id] if repo_id else []
            return shown, said(True, self.jobs.start("export", args, rel).state())
        except UserError as e:
            return shown, said(False, str(e))
