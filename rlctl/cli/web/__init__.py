"""`rlctl ui`: the toolkit as a local web page (Gradio), driving the same code as the CLI.

Package `rlctl.cli.web`: the command (this module, light: the UI library loads only when it runs), the server and
its access token (`serve`), the page's layout (`page`) and what its controls do (`actions`), what it shows as plain
data (`views`) and the rlctl commands it starts as subprocesses (`jobs`).
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
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: a free one).")] = 0,
) -> None:
    """A local web page for everything the CLI does: pick a recipe, edit and validate the config, see the data and
    the plan, start, watch, stop and resume runs, compare runs, try a model, evaluate and export. Serves the
    current folder (configs/ and runs/ in it); the URL is printed. Another --host gets a token the URL carries.
    Runs started from the page are `rlctl train` processes: closing the page stops none; stopping the server
    stops them at a checkpoint. Needs the UI extra: pip install 'rlctl\\[ui]'."""
    import importlib.util

    if importlib.util.find_spec("gradio") is None:
        raise UserError(f"rlctl ui needs the UI extra, which is not installed: {INSTALL}")
    from rlctl.cli.web import serve

    serve.serve(host, port)
