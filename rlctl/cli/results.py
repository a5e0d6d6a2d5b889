"""After training: `rlctl export`, `eval`, `report`, `verify` and `doctor`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.errors import UserError
from rlctl.rundir import RunDir

if TYPE_CHECKING:  # the config schema and planner load on demand, keeping `rlctl --help` fast
    pass

from rlctl.cli.app import (
    ColumnOpt,
    RewardOpt,
    _ui,
    app,
)


@app.command()
def export(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="Run directory to export from.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write the model to (default RUN_DIR/export).")
    ] = None,
    push: Annotated[
        str | None, typer.Option("--push", help="Also upload to this Hub repo id (namespace/name).")
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repo as private.")] = False,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="Export the LoRA adapter alone instead of merged full weights.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Write into a folder that holds other files (only files rlctl wrote are replaced)."
        ),
    ] = False,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", metavar="hf|gguf", help="hf: a Hugging Face folder; gguf: one GGUF file (rlctl\\[gguf])."
        ),
    ] = "hf",
    gguf_type: Annotated[
        str, typer.Option("--gguf-type", metavar="f16|q8_0", help="With --format gguf: the weights' type.")
    ] = "f16",
) -> None:
    """Write the final policy as a Hugging Face folder (safetensors, tokenizer, model card), LoRA merged or as an
    adapter; with --push, create the Hub repo and upload it (token from HF_TOKEN or `hf auth login`).

    --format gguf writes one GGUF file (f16 or q8_0) with llama.cpp's converter (`pip install 'rlctl\\[gguf]'`),
    loads it back with transformers and checks its greedy completions against the Hugging Face export.
    A folder holding files rlctl did not write is refused unless --force; an earlier export there is replaced."""
    from rich.markup import escape

    from rlctl.after import export as export_mod
    from rlctl.after import gguf_export

    ui = _ui(ctx)
    console = ui.console
    gguf_export.check_options(fmt, gguf_type)
    if fmt == "gguf" and adapter:
        raise UserError("--format gguf writes merged full weights; leave out --adapter (or export it with hf).")
    verified = None
    if fmt == "gguf":
        out = export_folder(run_dir, fmt, out)
        with console.status(f"Exporting the model as GGUF ({gguf_type}) and loading it back..."):
            try:
                folder, note, verified = gguf_export.export(run_dir, out, gguf_type, repo_id=push, force=force)
            except gguf_export.VerificationFailed as e:
                console.print(f"[bold red]error:[/] {escape(str(e))}")
                raise typer.Exit(1) from None
    else:
        out = export_folder(run_dir, fmt, out)
        with console.status("Exporting the model..."):
            folder, note = export_mod.export(run_dir, out, adapter=adapter, repo_id=push, force=force)
    if note:
        console.print(f"[yellow]warning:[/] {escape(note)}")
    ui.results().print(f"[green]Exported[/] {folder}")
    if verified is not None:
        ui.results().print(escape(verified.line()))
        for warning in verified.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
    if push:
        console.print(f"Pushing to {push}{' (private)' if private else ''}...")
        url = export_mod.push(folder, push, private=private, quiet=console.quiet)
        ui.results().print(f"[green]Pushed[/] {url}")


def export_folder(run_dir: Path, fmt: str, out: Path | None) -> Path:
    """Where `rlctl export` writes: --out, else RUN_DIR/export (RUN_DIR/export-gguf for --format gguf)."""
    return out or RunDir(run_dir).export(fmt)


@app.command("eval")
def eval_(
    ctx: typer.Context,
    target: Annotated[Path, typer.Argument(help="Run directory, exported model folder, or Hub model id.")],
    data_file: Annotated[
        str | None,
        typer.Option(
            "--data", "-d", help="Held-out prompts with ground truth (any format); a run defaults to its own."
        ),
    ] = None,
    stage: Annotated[str | None, typer.Option("--stage", help="For a run: evaluate this stage's model.")] = None,
    samples: Annotated[int, typer.Option("--samples", "-k", min=1, help="Completions per prompt (pass@k).")] = 1,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", "-t", min=0.01, max=10.0, help="Sample at this temperature (0.01 to 10)."),
    ] = None,
    top_p: Annotated[
        float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (above 0, at most 1).")
    ] = 1.0,
    greedy: Annotated[bool, typer.Option("--greedy", help="Greedy decoding (the default with one sample).")] = False,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens", min=1, help="Default: the run's rl.max_new_tokens, else fitted to the answers (shown)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Evaluate the first N rows.")] = None,
    reward: RewardOpt = None,
    accuracy: Annotated[
        str | None, typer.Option("--accuracy", help="Reward that decides correctness (exact_match, gsm8k, boxed, ...).")
    ] = None,
    column: ColumnOpt = None,
    answer_field: Annotated[str | None, typer.Option("--answer-field", help="Ground-truth column.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per generation batch.")] = 16,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="JSON file (default RUN_DIR/eval/<data>.json).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the metrics as JSON on stdout (the table goes to stderr).")
    ] = False,
) -> None:
    """Accuracy, mean reward and pass@k of a model on held-out data; a table, a JSON file and every sample.

    One greedy completion per prompt by default; --samples K draws K at --temperature (default: the run's
    rl.temperature, else 1.0) and adds pass@1..pass@K. A sample is correct when the --accuracy reward gives it
    more than 0.5 (default: the run's first correctness reward, else exact_match)."""
    from rlctl.cli import cockpit
    from rlctl.cli.cockpit import evaluation

    options = evaluation.EvalOptions(
        stage=stage,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        max_new_tokens=max_new_tokens,
        limit=limit,
        reward=reward,
        accuracy=accuracy,
        columns=cockpit.columns_opt(column),
        answer_field=answer_field,
        batch_size=batch_size,
        out=out,
    )
    metrics = evaluation.evaluate_command(_ui(ctx, stderr=as_json), target, data_file, options)
    if as_json:
        from rlctl import strictjson

        sys.stdout.write(strictjson.dumps(metrics, indent=2) + "\n")


@app.command()
def report(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="Run directory (finished, running, or interrupted).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder for the report (default RUN_DIR/report).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Write into a folder that holds other files (only files rlctl wrote are replaced)."
        ),
    ] = False,
) -> None:
    """PNG plots of every stage's curves against steps, a report.md with the config and final metrics, and
    TensorBoard event files (RUN_DIR/tensorboard)."""
    from rlctl.cli.cockpit import report as report_body

    report_body.report_command(_ui(ctx), run_dir, out, force)


@app.command()
def doctor(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Do not contact the Hub to verify the token.")] = False,
) -> None:
    """Check this machine: Python, torch/CUDA, GPUs, library versions against the supported matrix (with the
    exact fix command for each mismatch), free disk, and the Hub login (the token is never printed).
    Exits 1 when something needs fixing."""
    from rlctl.cli.cockpit import doctor as doctor_body

    raise typer.Exit(doctor_body.doctor_command(_ui(ctx), online=not offline, as_json=as_json))


@app.command()
def verify(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="Run directory, or a folder written by `rlctl export`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check a run's checkpoints (every file's size and checksum against its completion marker), final folders
    and exports (safetensors headers against file sizes, archives, JSON) without loading a model; or an export
    folder anywhere (every file against the manifest rlctl_files.json written with it).
    Exits 1 when something is damaged."""
    from rlctl.cli.cockpit import verify as verify_body

    raise typer.Exit(verify_body.verify_command(_ui(ctx), run_dir, as_json))
