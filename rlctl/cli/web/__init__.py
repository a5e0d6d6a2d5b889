"""`rlctl ui`: the toolkit as a local web page (Gradio), driving the same code as the CLI.

Package `rlctl.cli.web`: the command (this module, light: the UI library loads only when it runs), the server and
its access token (`serve`), the page's layout (`page`), how controls are wired to handlers by name (`wiring`), what
its controls do (`actions`) and the typed views they return (`shown`), what it shows as plain data (`draft` before a
run, `watch` of runs, `trying` a model), the one path check (`paths`), its words in each language (`text`) and the
rlctl commands it starts (`jobs`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl.cli.app import app
from rlctl.errors import UserError

INSTALL = "pip install 'rlctl[ui]'"


@app.command()
def ui(
    host: Annotated[
        str,
        typer.Option("--host", metavar="HOST", help="Address to serve on; any but localhost needs the printed token."),
    ] = "127.0.0.1",
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=0,
            max=65535,
            show_default=False,
            help="Port (default 7860, else the next free one; 0: any free one).",
        ),
    ] = None,
    lang: Annotated[
        str, typer.Option("--lang", metavar="en|zh", help="The page's language (a switch on the page too).")
    ] = "en",
    open_browser: Annotated[bool, typer.Option("--open", help="Open the page in the default browser.")] = False,
) -> None:
    """A local web page for everything the CLI does: pick a recipe, edit and validate the config, see the data and
    the plan, start, watch, stop and resume runs, compare runs, chat with a model, evaluate and export. Serves the
    current folder (configs/ and runs/ in it) on http://127.0.0.1:7860/ (the next free port if that one is taken);
    the URL is printed. Another --host gets a token the URL carries. Runs started from the page are `rlctl train`
    processes: closing the page stops none; stopping the server stops them at a checkpoint. Needs the UI extra:
    pip install 'rlctl\\[ui]'."""
    import importlib.util

    if lang not in ("en", "zh"):
        raise UserError(f"--lang {lang}: the page speaks en (English) and zh (Chinese).")
    if importlib.util.find_spec("gradio") is None:
        raise UserError(f"rlctl ui needs the UI extra, which is not installed: {INSTALL}")
    from rlctl.cli.web import serve

    serve.serve(host, port, lang, open_browser)
