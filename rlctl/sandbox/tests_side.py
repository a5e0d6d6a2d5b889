"""Runs inside the tests' jail (stdlib only, passed to `python -I -c`), a process the model's code never enters:
read the row's tests from stdin, bind the names the solution defines (functions and objects as proxies that ask
the solution's process, plain values as copies), run the tests, and write `passed` on the verdict fd only when
every statement ran. The solution's process only ever sends tagged plain data back, decoded here into exact
built-in types, so every comparison the tests make runs on values whose __eq__ is Python's own.

Usage: python -I -c SOURCE REPLIES REQUESTS VERDICT   (three pipe fds)
"""

import builtins
import json
import os
import sys

MAX_REPLY = 16 << 20  # bytes of one reply line


class RemoteError(Exception):
    """An exception raised by the solution that has no built-in exception of its name."""


class Remote:
    """A callable or an object living in the solution's process. Compared by identity only."""

    __slots__ = ("_handle", "_link")

    def __init__(self, link, handle):
        self._link, self._handle = link, handle

    def __call__(self, *args, **kwargs):
        return self._link.call(self._handle, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.ask({"op": "getattr", "h": self._handle, "name": name})

    def __iter__(self):
        it = self._link.ask({"op": "iter", "h": self._handle})
        while True:
            try:
                yield self._link.ask({"op": "next", "h": it._handle})
            except StopIteration:
                return

    def __bool__(self):
        return self._link.ask({"op": "bool", "h": self._handle}) is True

    def __len__(self):
        return self._link.ask({"op": "len", "h": self._handle})

    def __getitem__(self, key):
        return self._link.ask({"op": "getitem", "h": self._handle, "key": self._link.encode(key)})

    def __repr__(self):
        return f"<solution object {self._handle}>"


class Link:
    """Requests to the solution's process and the decoding of its replies."""

    def __init__(self, replies, requests):
        self.replies, self.requests = replies, requests

    def encode(self, value):
        kind = type(value)
        if value is None or kind in (bool, int, float, str):
            return value
        if kind is Remote:
            return {"H": value._handle}
        if kind in (list, tuple, set, frozenset):
            return {{list: "L", tuple: "T", set: "S", frozenset: "F"}[kind]: [self.encode(v) for v in value]}
        if kind is dict:
            return {"D": [[self.encode(k), self.encode(v)] for k, v in value.items()]}
        if kind is bytes:
            return {"B": value.decode("latin-1")}
        raise TypeError(f"the tests pass a {kind.__name__} to the solution; only plain data crosses")

    def decode(self, value):
        kind = type(value)
        if value is None or kind in (bool, int, float, str):
            return value
        if kind is not dict or len(value) != 1:
            raise ValueError("malformed reply from the solution")
        ((tag, inner),) = value.items()
        if tag == "H" and type(inner) is int:
            return Remote(self, inner)
        if tag == "B" and type(inner) is str:
            return inner.encode("latin-1")
        if type(inner) is not list:
            raise ValueError("malformed reply from the solution")
        if tag == "D":
            return {self.decode(k): self.decode(v) for k, v in inner}
        items = [self.decode(v) for v in inner]
        if tag not in ("L", "T", "S", "F"):
            raise ValueError("malformed reply from the solution")
        return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](items)

    def send(self, request):
        self.requests.write(json.dumps(request) + "\n")
        self.requests.flush()
        line = self.replies.readline(MAX_REPLY)
        if not line.endswith("\n"):
            raise RuntimeError("the solution's process ended or sent an over-long reply")
        reply = json.loads(line)
        if type(reply) is not dict:
            raise ValueError("malformed reply from the solution")
        if "err" in reply:
            name, msg = str(reply["err"]), str(reply.get("msg", ""))
            cls = getattr(builtins, name, None)
            safe = isinstance(cls, type) and issubclass(cls, Exception)
            raise cls(msg) if safe else RemoteError(f"{name}: {msg}")
        return reply

    def ask(self, request):
        return self.decode(self.send(request)["ok"])

    def call(self, handle, args, kwargs):
        reply = self.send(
            {"op": "call", "h": handle, "args": [self.encode(a) for a in args],
             "kwargs": {str(k): self.encode(v) for k, v in kwargs.items()}}
        )  # fmt: skip
        for mine, theirs in zip(args, reply.get("args") or [], strict=False):
            _update(mine, self.decode(theirs))
        return self.decode(reply["ok"])


def _update(mine, theirs):
    """An argument the solution changed in place changes here too (lists, dicts, sets)."""
    if type(mine) is list and type(theirs) is list:
        mine[:] = theirs
    elif type(mine) in (dict, set) and type(theirs) is type(mine):
        mine.clear()
        mine.update(theirs)


def main():
    tests = sys.stdin.read()
    replies = os.fdopen(int(sys.argv[1]), "r")
    requests = os.fdopen(int(sys.argv[2]), "w")
    verdict = os.fdopen(int(sys.argv[3]), "w")
    link = Link(replies, requests)
    scope = {"__name__": "__main__", "__builtins__": builtins}
    # the solution's names, except those shadowing a built-in the tests may call (`abs = lambda x: 0`)
    names = link.ask({"op": "names"})
    if type(names) is not dict:
        raise ValueError("malformed reply from the solution")
    scope.update({k: v for k, v in names.items() if type(k) is str and k.isidentifier() and k not in vars(builtins)})
    exec(compile(tests, "tests.py", "exec"), scope)
    verdict.write("passed")
    verdict.close()


if __name__ == "__main__":  # `python -c` runs it as __main__; an import runs nothing
    main()
