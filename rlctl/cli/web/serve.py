"""The server behind `rlctl ui`: the Gradio page on a FastAPI app served by uvicorn, bound to localhost unless
--host says otherwise, and then behind a token that the printed URL carries (kept in a cookie once checked)."""

from __future__ import annotations

import hmac
import os
import secrets
import socket
from pathlib import Path

from rich.markup import escape

from rlctl.cli.app import make_console

COOKIE = "rlctl_ui_token"
LOCAL = ("127.0.0.1", "localhost", "::1")
REFUSED = "rlctl ui: open the URL rlctl ui printed (it carries the token)."


DEFAULT_PORT = 7860  # Gradio's and LlamaBoard's: a bookmark keeps working
PORTS_TRIED = 100  # without --port: 7860, else the next free one up to 7959


def listening(host: str, port: int | None) -> socket.socket:
    """A socket bound to `host`:`port` and listening, so the URL printed is reachable at once. `port` None: 7860,
    else the next free port after it; 0: any free port; another: that one or a UserError."""
    from rlctl.errors import UserError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tried = [port] if port is not None else list(range(DEFAULT_PORT, DEFAULT_PORT + PORTS_TRIED))
    error: OSError | None = None
    for candidate in tried:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError as e:
            sock.close()
            error = e
            continue
        sock.listen(128)
        return sock
    shown = f"{host}:{port}" if port is not None else f"{host}, ports {tried[0]}-{tried[-1]}"
    reason = (error.strerror or str(error)) if error else "no port"
    raise UserError(f"Cannot serve on {shown}: {reason}. Pick another --port (0: a free one).")


def token_ok(given: str | None, token: str) -> bool:
    """Whether `given` is the token: compared in constant time as UTF-8 bytes, so any text a client sends (non-ASCII
    included) is a plain mismatch, never an error."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


class Gate:
    """ASGI middleware that refuses every HTTP request and websocket without the token (403; a websocket closed with
    1008), the token taken from the URL's `?token=` (then kept in a cookie) or the cookie. Whatever the request
    carries, a fault while reading it refuses it: the gate never fails open, and never answers 500."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send) -> None:
        from starlette.datastructures import MutableHeaders
        from starlette.requests import HTTPConnection
        from starlette.responses import PlainTextResponse
        from starlette.websockets import WebSocketClose

        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            conn = HTTPConnection(scope)
            in_query = conn.query_params.get("token")
            allowed = token_ok(in_query, self.token) or token_ok(conn.cookies.get(COOKIE), self.token)
        except Exception:  # a malformed query, cookie or header: refused, as a wrong token is
            in_query, allowed = None, False
        if not allowed:
            if scope["type"] == "websocket":
                await WebSocketClose(code=1008)(scope, receive, send)
            else:
                await PlainTextResponse(REFUSED, 403)(scope, receive, send)
            return
        if not in_query:
            await self.app(scope, receive, send)
            return

        async def with_cookie(message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.append("set-cookie", f"{COOKIE}={self.token}; HttpOnly; Path=/; SameSite=strict")
            await send(message)

        await self.app(scope, receive, with_cookie)


def serve(host: str, port: int | None, lang: str = "en", open_browser: bool = False) -> None:
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
        app.add_middleware(Gate, token=token)
    blocks = page.build(root, jobs, lang)
    app = gr.mount_gradio_app(app, blocks, path="", ssr_mode=False, css=page.CSS, footer_links=[])
    sock = listening(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    console = make_console()
    console.print(f"rlctl ui serving {escape(str(root))} at [bold]{escape(url)}[/] (Ctrl-C stops it)", soft_wrap=True)
    console.file.flush()
    if open_browser:
        import webbrowser

        if not webbrowser.open(url):
            console.print("No browser could be opened here: open the URL above in one.")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        jobs.shutdown()
