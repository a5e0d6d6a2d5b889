"""The server behind `rlctl ui`: the Gradio page on a FastAPI app served by uvicorn, bound to localhost unless
--host says otherwise, and then behind a token that the printed URL carries (kept in a cookie once checked)."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from rich.markup import escape

from rlctl.cli.app import make_console

COOKIE = "rlctl_ui_token"
LOCAL = ("127.0.0.1", "localhost", "::1")


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (0: a free port) and listening: the URL printed is reachable at once."""
    from rlctl.errors import UserError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(
            f"Cannot serve on {host}:{port}: {e.strerror or e}. Pick another --port (0: a free one)."
        ) from None
    sock.listen(128)
    return sock


def gate(app, token: str) -> None:
    """Refuse every request without the token: in the URL's `?token=` (then kept in a cookie) or the cookie."""
    from fastapi import Request
    from fastapi.responses import PlainTextResponse

    @app.middleware("http")
    async def _check(request: Request, call_next):
        given = request.query_params.get("token") or request.cookies.get(COOKIE) or ""
        if not secrets.compare_digest(given, token):
            return PlainTextResponse("rlctl ui: open the URL rlctl ui printed (it carries the token).", 403)
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response


def serve(host: str, port: int) -> None:
    """Serve the page for the current folder until Ctrl-C; then stop the runs it started, at a checkpoint."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home
    import gradio as gr
    import uvicorn
    from fastapi import FastAPI

    from rlctl.cli.web import page
    from rlctl.cli.web.jobs import Jobs

    root = Path.cwd()
    jobs = Jobs(root)
    app = FastAPI()
    token = None if host in LOCAL else secrets.token_urlsafe(16)
    if token is not None:
        gate(app, token)
    blocks = page.build(root, jobs)
    app = gr.mount_gradio_app(app, blocks, path="", ssr_mode=False, css=page.CSS, footer_links=[])
    sock = listening(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    console = make_console()
    console.print(f"rlctl ui serving {escape(str(root))} at [bold]{escape(url)}[/] (Ctrl-C stops it)", soft_wrap=True)
    console.file.flush()
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        jobs.shutdown()
