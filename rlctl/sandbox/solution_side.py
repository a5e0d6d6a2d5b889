"""Runs inside the solution's jail (stdlib only, passed to `python -I -c`): execute the model's code read from
stdin, then, given two pipe fds, answer the tests process's requests (names, calls, attributes, iteration) with
plain data. Nothing here is trusted: the model's code shares this process and may rewrite all of it; all it can
ever send the tests process is data, which is why the verdict is not decided here.

Usage: python -I -c SOURCE run            (the python tool: run the program, its exit code is the answer)
       python -I -c SOURCE serve IN OUT   (code_tests: then answer requests read from fd IN on fd OUT)
"""

import json
import os
import sys
import traceback

MAX_ITEMS = 100_000


def encode(value, handles, depth=0):
    """Plain data as tagged JSON (exact built-in types only: a subclass could carry its own __eq__); anything
    else as a handle the tests process can only call or ask about."""
    if depth > 100:
        raise ValueError("nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple, set, frozenset):
        items = list(value)
        if len(items) > MAX_ITEMS:
            raise ValueError("too many items")
        tag = {list: "L", tuple: "T", set: "S", frozenset: "F"}[kind]
        return {tag: [encode(v, handles, depth + 1) for v in items]}
    if kind is dict:
        return {"D": [[encode(k, handles, depth + 1), encode(v, handles, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"B": value.decode("latin-1")}
    handles.append(value)
    return {"H": len(handles) - 1}


def decode(value, handles):
    """The tests process's arguments: plain data, or handles of this process's objects."""
    if isinstance(value, dict):
        ((tag, inner),) = value.items()
        if tag == "H":
            return handles[inner]
        if tag == "D":
            return {decode(k, handles): decode(v, handles) for k, v in inner}
        if tag == "B":
            return inner.encode("latin-1")
        items = [decode(v, handles) for v in inner]
        return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](items)
    return value


def answer(request, handles):
    """One request's reply: {"ok": data} or {"err": exception type name, "msg": text}."""
    op = request["op"]
    try:
        target = handles[request["h"]] if "h" in request else None
        if op == "names":
            scope = handles[0]
            return {"ok": encode({k: v for k, v in scope.items() if not k.startswith("__")}, handles)}
        if op == "call":
            args = [decode(a, handles) for a in request["args"]]
            kwargs = {k: decode(v, handles) for k, v in request["kwargs"].items()}
            result = target(*args, **kwargs)
            after = [encode(a, handles) for a in args]  # arguments changed in place, sent back
            return {"ok": encode(result, handles), "args": after}
        if op == "getattr":
            return {"ok": encode(getattr(target, request["name"]), handles)}
        if op == "iter":
            return {"ok": encode(iter(target), handles)}
        if op == "next":
            return {"ok": encode(next(target), handles)}
        if op == "bool":
            return {"ok": bool(target)}
        if op == "len":
            return {"ok": len(target)}
        if op == "getitem":
            return {"ok": encode(target[decode(request["key"], handles)], handles)}
        return {"err": "ValueError", "msg": f"unknown request {op}"}
    except Exception as e:
        return {"err": type(e).__name__, "msg": str(e)[:500]}


def main():
    code = sys.stdin.read()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the program's own stdin from here on
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "solution.py", "exec"), scope)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc(limit=-5)
        sys.exit(1)
    if sys.argv[1] != "serve":
        return
    handles = [scope]
    requests = os.fdopen(int(sys.argv[2]), "r")
    replies = os.fdopen(int(sys.argv[3]), "w")
    for line in requests:
        replies.write(json.dumps(answer(json.loads(line), handles)) + "\n")
        replies.flush()


if __name__ == "__main__":  # `python -c` runs it as __main__; an import runs nothing
    main()
