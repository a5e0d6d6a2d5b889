"""A local stand-in for the Hugging Face Hub endpoints that `create_repo`, `upload_folder` and `whoami` call,
recording what arrives. Point huggingface_hub at it with HF_ENDPOINT=stub.url."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Repo:
    repo_id: str
    private: bool | None
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None


class HubStub:
    """`with HubStub(token="hf_x") as hub:` serves on 127.0.0.1 until the block ends."""

    def __init__(self, token: str, user: str = "alice"):
        self.token = token
        self.user = user
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.unhandled: list[str] = []
        self.validated: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HubStub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------------------------ endpoints
    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: object = None, headers: dict | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _authorized(self) -> bool:
                return self.headers.get("Authorization") == f"Bearer {hub.token}"

            def _route(self, method: str) -> None:
                hub.requests.append(Request(method, self.path, self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                body = self._body() if method == "POST" else b""
                if not self._authorized():
                    return self._reply(
                        401, {"error": "Invalid credentials"}, {"X-Error-Message": "Invalid credentials"}
                    )
                parts = path.strip("/").split("/")
                if method == "GET" and path in ("/api/whoami-v2", "/api/whoami"):
                    return self._reply(200, {"type": "user", "name": hub.user, "auth": {"type": "access_token"}})
                if method == "POST" and path == "/api/validate-yaml":
                    return self._validate_yaml(json.loads(body)["content"])
                if method == "POST" and path == "/api/repos/create":
                    payload = json.loads(body)
                    repo_id = f"{payload.get('organization') or hub.user}/{payload['name']}"
                    if repo_id in hub.repos:
                        return self._reply(409, {"error": "You already created this model repo", "url": hub.url})
                    private = {"private": True, "public": False}.get(payload.get("visibility"), payload.get("private"))
                    hub.repos[repo_id] = Repo(repo_id, private)
                    return self._reply(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id, "id": repo_id})
                # /api/models/{ns}/{name}/{action}/{revision}
                if len(parts) >= 6 and parts[:2] == ["api", "models"]:
                    repo_id, action = f"{parts[2]}/{parts[3]}", parts[4]
                    repo = hub.repos.get(repo_id)
                    if repo is None:
                        return self._reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                    if method == "POST" and action == "preupload":
                        files = json.loads(body)["files"]
                        listed = [
                            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                            for f in files
                        ]
                        return self._reply(200, {"files": listed, "commitOid": "0" * 40})
                    if method == "POST" and action == "commit":
                        return self._commit(repo, body)
                    if method == "GET" and action == "revision":
                        return self._reply(200, {"id": repo_id, "sha": "0" * 40, "siblings": []})
                hub.unhandled.append(f"{method} {self.path}")
                return self._reply(404, {"error": f"stub has no {method} {path}"})

            def _validate_yaml(self, content: str) -> None:
                """The model card's front matter must be a YAML mapping, as the Hub requires."""
                import yaml

                hub.validated.append(content)
                if content.startswith("---"):
                    try:
                        meta = yaml.safe_load(content.split("---")[1])
                    except yaml.YAMLError as e:
                        return self._reply(400, {"errors": [{"message": str(e)}]})
                    if not isinstance(meta, dict):
                        return self._reply(400, {"errors": [{"message": "metadata must be a mapping"}]})
                return self._reply(200, {"errors": [], "warnings": []})

            def _commit(self, repo: Repo, body: bytes) -> None:
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                for item in lines:
                    if item["key"] == "file":
                        value = item["value"]
                        assert value.get("encoding") == "base64", value
                        repo.files[value["path"]] = base64.b64decode(value["content"])
                    elif item["key"] != "header":
                        hub.unhandled.append(f"commit operation {item['key']}")
                repo.commits.append(header)
                oid = hashlib.sha1(body).hexdigest()
                return self._reply(
                    200,
                    {
                        "success": True,
                        "commitOid": oid,
                        "commitUrl": f"{hub.url}/{repo.repo_id}/commit/{oid}",
                        "pullRequestUrl": None,
                    },
                )

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_HEAD(self):
                self._route("HEAD")

        return Handler
