"""What each control of `rlctl ui` does: the page's handlers. Each takes the values of the components its parameters
name and returns a typed view whose fields name the components it updates (`wiring`); a field left at SAME leaves
its component as it is. Every rule is the CLI's (`draft`, `watch`, `trying`), every action the real `rlctl` command
(`jobs`), every word of the page's own in its language (`text`)."""

from __future__ import annotations

import dataclasses
import html
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from rlctl.cli.web import draft, text, trying, watch
from rlctl.cli.web.paths import inside
from rlctl.cli.web.shown import (
    CardShown,
    ChatShown,
    CheckShown,
    Compared,
    CompareLegend,
    DataList,
    DataShown,
    EvalStarted,
    ExportStarted,
    JobSaid,
    Loaded,
    ModelList,
    Opened,
    Picked,
    PlanShown,
    PreviewShown,
    RunShown,
    RunsList,
    SavedList,
    SetsShown,
    StageRows,
    Started,
    UsedFile,
    fingerprint,
    form_name,
    frame,
    legend,
    plotted,
)
from rlctl.cli.web.wiring import SAME
from rlctl.errors import UserError

if TYPE_CHECKING:
    from rlctl.cli.web.jobs import Job, Jobs

RUN_COLUMNS = ["path", "name", "stages", "completed", "latest"]
DIFF_COLUMNS = ["key", "A", "B"]
EVAL_COLUMNS = ["metric", "value"]


def said(ok: bool, message: str, notes: tuple[str, ...] = (), lang: str = "en") -> str:
    """A message for an HTML box: green when all is well, red (the CLI's error) otherwise."""
    lines = [f'<div class="{"ok" if ok else "bad"}">{html.escape(message)}</div>']
    lines += [f'<div class="note">{html.escape(text.say(lang, "note", text=n))}</div>' for n in notes]
    return "\n".join(lines)


def job_said(job: Job, lang: str) -> str:
    key, values = job.status()
    return said(key != "job_failed", text.say(lang, key, **values))


def text_of(content: object) -> str:
    """A chat message's text: Gradio hands content over as a string or a list of typed parts."""
    if isinstance(content, list):
        return "".join(text_of(part) for part in content)
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return str(content)


def table(rows: Sequence[Sequence[object]], names: list[str], lang: str) -> pd.DataFrame:
    """Rows as a table with its columns named in the page's language."""
    return pd.DataFrame(rows, columns=text.columns(lang, names))


def draft_of(yaml, config_path, algorithm, hardware, stages, recipe_stages, sets) -> draft.Draft:
    """The config controls' values as a draft; the stages only when they differ from the recipe's."""
    from rlctl.config import STAGE_ORDER

    chosen = tuple(s for s in STAGE_ORDER if s in (stages or []))
    return draft.Draft(
        yaml or "",
        config_path or "",
        algorithm or "",
        hardware or "",
        () if list(chosen) == list(recipe_stages or []) else chosen,
        draft.set_items(sets or ""),
    )


# --------------------------------------------------------------------------------------------------- handlers
class Actions:
    """The handlers for the folder `root`, its runs started through `jobs`; shared by every browser tab."""

    def __init__(self, root: Path, jobs: Jobs):
        from rlctl.cli.prepare import recipe_rows

        self.root, self.jobs = root, jobs
        self.recipes = {r.name: r for r in recipe_rows()}
        self.written: set[Path] = set()  # the config files this server wrote: the only ones it may write again
        self.loaded = trying.Loaded()  # the chat box's model, one at a time
        self.watched: dict[Path, watch.Watched] = {}  # each run's metrics as read so far, shared by every tab
        self.use = watch.ProcessUse()
        self.previews: dict[tuple[str, float], list[dict]] = {}  # the data file shown in the picker
        self._lock = threading.Lock()

    def run_dir(self, where: str) -> Path:
        return inside(self.root, where or "", "run directory")

    # -------------------------------------------------------------------------------------------- the config
    def pick(self, recipe: str) -> Picked:
        """A recipe chosen: its shipped YAML (as `rlctl presets show NAME` prints it) and its defaults."""
        from rlctl.cli.run import default_run_dir
        from rlctl.config import presets

        if not recipe:
            return Picked()
        r = self.recipes[recipe]
        about = (
            f"**{r.name}**: {r.description}\n\nmodel `{r.model}` · algorithm `{r.algorithm}` · stages "
            f"`{', '.join(r.stages)}` · hardware `{r.hardware}`"
        )
        yaml = presets.get(recipe).path.read_text()
        run = default_run_dir(None, recipe).as_posix()
        return Picked(yaml, f"configs/{recipe}.yaml", about, r.stages, r.stages, run, "", "")

    def check(self, yaml, config_path, algorithm, hardware, stages, recipe_stages, sets, lang) -> Any:
        """The draft checked as `rlctl train` checks it, and the form showing its values."""
        if not (yaml or "").strip():
            return CheckShown(check="")
        checked = draft.check(self.root, draft_of(yaml, config_path, algorithm, hardware, stages, recipe_stages, sets))
        shown = CheckShown(check=said(checked.config is not None, checked.message, checked.notes, lang))
        if checked.config is not None:
            for key, value in draft.form_values(checked.config).items():
                setattr(shown, form_name(key), value)
        return shown

    def stage_rows(self, stages) -> Any:
        """The form's row of each chosen stage shows; the others hide."""
        rows = StageRows()
        for f in dataclasses.fields(rows):
            setattr(rows, f.name, gr.Row(visible=f.name.removeprefix("group_") in (stages or [])))
        return rows

    def form_setter(self, key: str):
        """The handler of one form field: its value as the `--set` item of `key` in the overrides box."""

        def setter(value, sets) -> SetsShown:
            if value is None or value == "":
                return SetsShown()
            return SetsShown(draft.with_set(sets or "", key, value))

        return setter

    def list_saved(self) -> SavedList:
        return SavedList(gr.Dropdown(choices=draft.saved_configs(self.root)))

    def load_saved(self, saved, lang) -> Loaded:
        """A saved config into the editor, as the file the page plans and starts with."""
        try:
            yaml = draft.read_saved(self.root, saved or "")
        except UserError as e:
            return Loaded(check=said(False, str(e)))
        rel = inside(self.root, saved, "config file")
        self.written.discard(self.root / rel)  # never rewritten with another text: an edit is saved under a new name
        return Loaded(yaml, rel.as_posix(), said(True, text.say(lang, "saved_loaded", path=rel.as_posix())))

    # ----------------------------------------------------------------------------------------------- the data
    def list_data(self) -> DataList:
        return DataList(gr.Dropdown(choices=draft.data_files(self.root)))

    def use_file(self, data_role, data_path, sets, lang) -> UsedFile:
        """A data file wired into data.ROLE as --set items (the generated task off), once it is read as the CLI
        reads it: a file that is missing or unreadable is refused in red, the overrides left as they were."""
        try:
            rel = inside(self.root, data_path or "", "data file").as_posix()
            rows = self._rows(rel)
        except UserError as e:
            return UsedFile(data_state=said(False, str(e)))
        own = (f"data.{data_role}=", "data.generate=")
        lines = [x for x in draft.set_items(sets or "") if not x.startswith(own)]
        new = "\n".join([*lines, "data.generate=null", f"data.{data_role}={rel}"])
        return UsedFile(new, said(True, text.say(lang, "file_used", role=data_role, path=rel, rows=len(rows))))

    def _rows(self, rel: str) -> list[dict]:
        path = self.root / rel
        if not path.is_file() and not path.is_dir():
            raise UserError(f"{rel}: no such file in {self.root}; nothing was changed.")
        key = (rel, path.stat().st_mtime)
        with self._lock:
            if key not in self.previews:
                self.previews = {key: draft.file_rows(self.root, rel)}  # one file kept: the one shown
            return self.previews[key]

    def _preview(self, data_path, page: int, lang: str) -> PreviewShown:
        try:
            rows = self._rows(inside(self.root, data_path or "", "data file").as_posix())
        except UserError as e:
            return PreviewShown(None, 1, said(False, str(e)))
        shown = draft.preview(rows, page)
        last = shown.first + len(shown.rows) - 1
        state = text.say(lang, "preview_state", first=shown.first, last=last, total=shown.total,
                         page=(shown.first - 1) // draft.PAGE_ROWS + 1, pages=shown.pages)  # fmt: skip
        return PreviewShown(pd.DataFrame(shown.rows, columns=shown.columns), (shown.first - 1) // draft.PAGE_ROWS + 1,
                            state)  # fmt: skip

    def first_page(self, data_path, lang) -> PreviewShown:
        return self._preview(data_path, 1, lang) if data_path else PreviewShown()

    def page_before(self, data_path, data_page, lang) -> PreviewShown:
        return self._preview(data_path, int(data_page or 1) - 1, lang)

    def page_after(self, data_path, data_page, lang) -> PreviewShown:
        return self._preview(data_path, int(data_page or 1) + 1, lang)

    def _valid(self, given: draft.Draft, where: str, lang: str) -> tuple[Path, draft.Checked]:
        """The draft saved where its command reads it, and checked; a UserError when it is not valid."""
        if not given.yaml_text.strip():
            raise UserError(text.say(lang, "pick_first"))
        rel = self.run_dir(where)
        checked = draft.check(self.root, given)
        if checked.config is None:
            raise UserError(checked.message)
        draft.save(self.root, given, self.written)
        return rel, checked

    def plan(self, yaml, config_path, algorithm, hardware, stages, recipe_stages, sets, run_dir, lang) -> PlanShown:
        """`rlctl plan` of the draft: its text, the memory table, the data, the first rows, the train command."""
        given = draft_of(yaml, config_path, algorithm, hardware, stages, recipe_stages, sets)
        empty = table([], draft.MEMORY_COLUMNS, lang)
        try:
            rel, checked = self._valid(given, run_dir, lang)
            shown = draft.plan(checked.config, rel)
        except UserError as e:
            return PlanShown(str(e), empty, str(e), None, "", said(False, str(e)))
        errors = "\n".join(f"error: {e}" for e in shown.errors)
        memory = table(shown.memory, draft.MEMORY_COLUMNS, lang)
        command = given.train_command(rel.as_posix())
        state = said(not errors, errors) if errors else ""
        return PlanShown(shown.text + errors, memory, shown.data_text + errors, shown.data_rows, command, state)

    def read_data(self, yaml, config_path, algorithm, hardware, stages, recipe_stages, sets, run_dir, lang):
        shown = self.plan(yaml, config_path, algorithm, hardware, stages, recipe_stages, sets, run_dir, lang)
        return DataShown(shown.data_text, shown.data_rows)

    # ---------------------------------------------------------------------------------------------------- a run
    def start(self, yaml, config_path, algorithm, hardware, stages, recipe_stages, sets, run_dir, lang) -> Started:
        """`rlctl train` of the draft; the page moves to the Run tab, or the refusal is said beside Start."""
        given = draft_of(yaml, config_path, algorithm, hardware, stages, recipe_stages, sets)
        try:
            rel, _ = self._valid(given, run_dir, lang)
            job = self.jobs.start("train", [*given.args(), "--run-dir", rel.as_posix()], rel)
        except UserError as e:
            return Started(start_state=said(False, str(e)))
        state = job_said(job, lang)
        return Started(rel.as_posix(), gr.Tabs(selected="run"), state, state)

    def stop(self, watched, lang) -> JobSaid:
        try:
            key, values = self.jobs.stop(self.run_dir(watched))
        except UserError as e:
            return JobSaid(said(False, str(e)))
        return JobSaid(said(key != "nothing_to_stop", text.say(lang, key, **values)))

    def resume(self, watched, lang) -> JobSaid:
        try:
            rel = self.run_dir(watched)
            return JobSaid(job_said(self.jobs.start("resume", [rel.as_posix()], rel), lang))
        except UserError as e:
            return JobSaid(said(False, str(e)))

    def _watched(self, rel: Path) -> watch.Watched:
        with self._lock:
            found = self.watched.get(rel)
            if found is None:
                found = self.watched[rel] = watch.Watched(self.root / rel)
        found.refresh()
        return found

    def watch(self, watched: str, lang: str) -> RunShown:
        """The watched run's state, read from its run directory and the commands on it."""
        if not watched:
            return RunShown(job_state="", headline=text.say(lang, "no_run"))
        try:
            rel = self.run_dir(watched)
        except UserError as e:
            return RunShown(job_state=said(False, str(e)))
        base = self.root / rel
        job = self.jobs.get(rel)
        seen = self._watched(rel)
        done = watch.finished(base)
        pid = self.jobs.training(rel)
        if job is not None:
            state = job_said(job, lang)
        else:
            state = said(True, text.say(lang, "finished" if done else "not_from_page"))
        panels = seen.panels()
        alarms = "".join(f'<div class="bad">{html.escape(text.say(lang, "alarm", text=a))}</div>' for a in seen.alarms)
        log = watch.tail(job.log) if job is not None else watch.tail(watch.RunDir(base).log())
        budget = watch.plan_budget(base)
        devices = watch.gpu_rows(budget) or self.use.row(pid, budget)
        words = text.say(lang, "best"), text.say(lang, "worst")
        shown = RunShown(
            job_state=state,
            headline=seen.headline(),
            loss_plot=frame(panels["loss"]),
            reward_plot=frame(panels["reward"]),
            accuracy_plot=frame(panels["accuracy"]),
            scores_plot=frame(panels["scores"]),
            alarms=alarms,
            rl_samples=table(watch.sample_rows(seen.samples, *words), watch.SAMPLE_COLUMNS, lang),
            device=table(devices, watch.DEVICE_COLUMNS, lang),
            log=log,
            stop=gr.Button(interactive=pid is not None),
            resume=gr.Button(interactive=pid is None and not done and watch.RunDir(base).is_run()),
        )
        self._beside_buttons(shown, rel, lang)
        return shown

    def _beside_buttons(self, shown: RunShown, rel: Path, lang: str) -> None:
        """Evaluate's and Export's state beside their buttons: the command's state, then its results (the eval
        table) or the end of its output (the export)."""
        evaluating = self.jobs.get(rel, "eval")
        results = trying.latest_eval(self.root, rel)
        state = job_said(evaluating, lang) if evaluating is not None else ""
        if results.path and (evaluating is None or not evaluating.running()):
            state += said(True, text.say(lang, "eval_result", path=results.path))
        shown.eval_state = state or said(True, text.say(lang, "eval_none"))
        shown.eval_table = table(results.metrics, EVAL_COLUMNS, lang)
        shown.eval_rows = table(results.samples, trying.SAMPLE_COLUMNS, lang)
        exporting = self.jobs.get(rel, "export")
        if exporting is None:
            shown.export_state = ""
            return
        end = html.escape(watch.tail(exporting.log, 6))
        shown.export_state = job_said(exporting, lang) + f"<pre>{end}</pre>"

    def tick(self, watched, seen, lang) -> RunShown:
        """`watch`, sending only what changed since this browser tab's last refresh (a plot: `plotted`)."""
        shown = self.watch(watched, lang)
        sent = dict(seen or {})
        for f in dataclasses.fields(shown):
            value = getattr(shown, f.name)
            if f.name == "seen" or value is SAME:
                continue
            if f.name.endswith("_plot"):
                setattr(shown, f.name, plotted(f.name, value, sent))
                continue
            key = fingerprint(value)
            if sent.get(f.name) == key:
                setattr(shown, f.name, SAME)
            sent[f.name] = key
        shown.seen = sent
        return shown

    def opened(self) -> Opened:
        """A new browser tab shows the run the server's latest start is on: every tab sees the same runs."""
        return Opened(self.jobs.latest.as_posix() if self.jobs.latest else "")

    def watch_a(self, run_a) -> Opened:
        return Opened(run_a or "", gr.Tabs(selected="run"))

    # ------------------------------------------------------------------------------------------- runs compared
    def list_runs(self, runs_folder, lang) -> RunsList:
        try:
            rows = watch.runs(self.root, runs_folder or "")
        except UserError as e:
            gr.Warning(str(e))
            return RunsList()
        paths = [r.path for r in rows]
        shown = [[r.path, r.name, r.stages, r.completed, r.latest] for r in rows]
        return RunsList(table(shown, RUN_COLUMNS, lang), gr.Dropdown(choices=paths), gr.Dropdown(choices=paths))

    def compare(self, run_a, run_b, lang) -> Compared:
        try:
            pa, pb = (self.root / self.run_dir(x) for x in (run_a, run_b))
        except UserError as e:
            gr.Warning(str(e))
            return Compared()
        points = []
        for run, prefix in ((pa, "A: "), (pb, "B: ")):
            seen = watch.Watched(run)
            seen.refresh()
            points += [p for panel in ("loss", "reward") for p in seen.panels(prefix)[panel]]
        final = table(watch.final_metrics(pa, pb), watch.FINAL_COLUMNS, lang)
        return Compared(gr.LinePlot(value=frame(points)), final, table(watch.config_diff(pa, pb), DIFF_COLUMNS, lang))

    def compare_legend(self, run_a, run_b) -> CompareLegend:
        """The compared plot's legend, once the browser holds its table (`legend`)."""
        series: list[str] = []
        for where, prefix in ((run_a, "A: "), (run_b, "B: ")):
            try:
                seen = watch.Watched(self.root / self.run_dir(where))
            except UserError:
                return CompareLegend()
            seen.refresh()
            series += [p.series for panel in ("loss", "reward") for p in seen.panels(prefix)[panel]]
        return CompareLegend(legend(sorted(set(series))))

    # ----------------------------------------------------------------------------------------------- the chat
    def models(self, watched, lang) -> ModelList:
        """The run's models, the first loaded; what its prompts look like and an example from its task."""
        try:
            rel = self.run_dir(watched)
            found = trying.model_folders(self.root, rel)
            task = trying.task_format(self.root, rel)
        except UserError as e:
            return ModelList(chat_note=str(e))
        if not found:
            return ModelList(gr.Dropdown(choices=[]), text.say(lang, "no_models", run=rel.as_posix()))
        note = text.say(lang, "chat_chat" if task.chat else "chat_plain", example=task.example)
        return ModelList(
            gr.Dropdown(choices=found, value=found[0]),
            note,
            gr.Textbox(placeholder=task.example),
            task.max_new_tokens or SAME,
        )

    def answer(self, model_pick, chat, prompt, system_prompt, temperature, top_p, max_new) -> ChatShown:
        """The model's answer, generated as `rlctl eval` generates for the run's prompt format."""
        history = [{"role": m["role"], "content": text_of(m["content"])} for m in chat or []]
        how = trying.Sampling(system_prompt or "", float(temperature or 0), float(top_p or 1), int(max_new or 32))
        try:
            answer = trying.reply(self.root, self.loaded, model_pick or "", history, prompt or "", how)
        except UserError as e:
            answer = f"error: {e}"
        said_now = [{"role": "user", "content": prompt or ""}, {"role": "assistant", "content": answer}]
        return ChatShown([*history, *said_now], "")

    def clear_chat(self) -> ChatShown:
        return ChatShown([], "")

    def evaluate(self, watched, eval_limit, eval_samples, lang) -> EvalStarted:
        try:
            rel = self.run_dir(watched)
            watch.served_run_config(self.root, rel)
            args = [rel.as_posix(), "--limit", str(int(eval_limit or 50))]
            args += ["--samples", str(int(eval_samples))] if int(eval_samples or 1) > 1 else []
            return EvalStarted(job_said(self.jobs.start("eval", args, rel), lang))
        except UserError as e:
            return EvalStarted(said(False, str(e)))

    # --------------------------------------------------------------------------------------------------- export
    def _export_target(self, watched, export_format, export_out) -> tuple[Path, Path]:
        from rlctl.cli.results import export_folder

        rel = self.run_dir(watched)
        out = inside(self.root, export_out, "export folder") if export_out else None
        return rel, export_folder(rel, export_format, out)

    def card(self, watched, export_format, export_out, export_repo) -> CardShown:
        try:
            rel, target = self._export_target(watched, export_format, export_out)
            return CardShown(trying.card(self.root / rel, self.root / target, export_repo))
        except UserError as e:
            return CardShown(str(e))

    def export(self, watched, export_format, gguf_type, export_out, export_repo, lang) -> ExportStarted:
        """The card first, then `rlctl export` writing it."""
        shown = self.card(watched, export_format, export_out, export_repo).card
        try:
            rel, target = self._export_target(watched, export_format, export_out)
            args = [rel.as_posix(), "--out", target.as_posix(), "--format", export_format]
            args += ["--gguf-type", gguf_type] if export_format == "gguf" and gguf_type else []
            args += ["--push", export_repo] if export_repo else []
            return ExportStarted(shown, job_said(self.jobs.start("export", args, rel), lang))
        except UserError as e:
            return ExportStarted(shown, said(False, str(e)))
