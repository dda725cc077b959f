#!/usr/bin/env python3
"""A hostile MCP server: raw JSON-RPC over stdio, Python 3 stdlib only.

    server.py MODE [--pids FILE] [--count N] [--log FILE]

Every mode answers `initialize` (unless it is `silent`) and serves a tool
`ok` (echoes its arguments) beside its misbehaviour, so a test can tell the
hostile part from the rest. Modes:

  good          nothing hostile
  env           good, and tool `env` answers the server's environment
                (a JSON object) as text; tool `sh` runs `sh -c SCRIPT ARGS..`
                (arguments `script`, `args`) and answers its stdout
  endless       tools/list always has another page (a new cursor each time)
  fat           endless, each page's tool with a COUNT-byte description
  repeat        tools/list always answers with the same next cursor
  silent        never answers anything, initialize included
  silent_list   answers initialize, never answers tools/list
  deep          one tool's inputSchema nested 70 objects deep
  huge          tool `big` answers with COUNT bytes of text, id first;
                `big_tail` the same with the id after the result
  crash         tool `crash` forks a child that keeps stdout open, then exits
  fork          good, after forking a child that keeps stdout open
  crashloop     fork, and exits COUNT ms after answering tools/list
  pingflood     after initialized, sends COUNT ping requests and never
                reads stdin again (it sleeps)
  reqflood      after initialized, sends COUNT requests of a method cadre
                does not serve, each with a 2 KiB id, one after another
                (the next when the last is answered: never over the cap of
                waiting requests); cadre answers each with an error, which
                rmcp logs; --log FILE gets "answered COUNT" at the end
  flood         after initialized, sends COUNT tools/list_changed at once;
                each tools/list is appended to --log
  names         tools named "", "a.b", "a__b" beside `ok`
  many          COUNT tools, each with a small schema
  starting      the first tools/list (across restarts: --log FILE remembers)
                answers a JSON-RPC internal error, as a server still
                starting might; later ones answer normally

--pids FILE gets one line per process started: "server PID" or "child PID".
"""

import json
import os
import sys
import time

args = sys.argv[1:]
MODE = args[0]
opts = dict(zip(args[1::2], args[2::2]))
COUNT = int(opts.get("--count", "0"))
PIDS = opts.get("--pids")
LOG = opts.get("--log")

out = sys.stdout.buffer


def record(kind, pid):
    if PIDS:
        with open(PIDS, "a") as f:
            f.write(f"{kind} {pid}\n")


def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def answer(mid, result):
    send({"jsonrpc": "2.0", "id": mid, "result": result})


def fork_holding_stdout():
    """A child that inherits stdout and sleeps: the pipe stays open."""
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    record("child", pid)
    return pid


OK = {
    "name": "ok",
    "description": "Echoes its arguments",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def deep_schema(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def tools_page(params):
    cursor = (params or {}).get("cursor")
    if MODE == "endless":
        n = int(cursor or "0")
        return {"tools": [dict(OK, name=f"t{n}")], "nextCursor": str(n + 1)}
    if MODE == "fat":
        n = int(cursor or "0")
        tool = dict(OK, name=f"t{n}", description="x" * COUNT)
        return {"tools": [tool], "nextCursor": str(n + 1)}
    if MODE == "repeat":
        return {"tools": [OK], "nextCursor": "again"}
    tools = [OK]
    if MODE == "deep":
        tools.append({"name": "deep", "inputSchema": deep_schema(70)})
    if MODE == "huge":
        tools += [dict(OK, name="big"), dict(OK, name="big_tail")]
    if MODE == "crash":
        tools.append(dict(OK, name="crash"))
    if MODE == "env":
        tools += [dict(OK, name="env"), dict(OK, name="sh")]
    if MODE == "names":
        tools += [dict(OK, name=n) for n in ["", "a.b", "a__b"]]
    if MODE == "many":
        tools = [dict(OK, name=f"t{i}") for i in range(COUNT)]
    return {"tools": tools}


def call(mid, params):
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if name in ("big", "big_tail"):
        text = "x" * COUNT
        result = {"content": [{"type": "text", "text": text}]}
        if name == "big":
            send({"jsonrpc": "2.0", "id": mid, "result": result})
        else:
            send({"jsonrpc": "2.0", "result": result, "id": mid})
        return
    if name == "env":
        answer(mid, {"content": [{"type": "text", "text": json.dumps(dict(os.environ))}]})
        return
    if name == "sh":
        import subprocess
        run = subprocess.run(["sh", "-c", arguments["script"], "sh"] + arguments.get("args", []),
                             stdin=subprocess.DEVNULL, capture_output=True)
        answer(mid, {"content": [{"type": "text", "text": run.stdout.decode()}]})
        return
    if name == "crash":
        fork_holding_stdout()
        os._exit(3)
    answer(mid, {"content": [{"type": "text", "text": json.dumps(arguments)}]})


def send_request(n):
    send({"jsonrpc": "2.0", "id": "r" + "x" * 2048 + "-%d" % n,
          "method": "cadre/unknown", "params": {}})


def main():
    record("server", os.getpid())
    if MODE in ("fork", "crashloop"):
        fork_holding_stdout()
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method = msg.get("method")
        mid = msg.get("id")
        if MODE == "silent":
            continue
        if MODE == "reqflood" and method is None and str(mid).startswith("r"):
            n = int(str(mid).rsplit("-", 1)[1]) + 1
            if n < COUNT:
                send_request(n)
            elif LOG:
                with open(LOG, "a") as f:
                    f.write("answered %d\n" % COUNT)
            continue
        if method == "initialize":
            version = msg["params"].get("protocolVersion", "2025-06-18")
            answer(mid, {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "hostile-" + MODE, "version": "0"},
            })
        elif method == "notifications/initialized":
            if MODE == "pingflood":
                data = b"".join(
                    (json.dumps({"jsonrpc": "2.0", "id": "p%d" % i, "method": "ping"}) + "\n").encode()
                    for i in range(COUNT))
                out.write(data)
                out.flush()
                time.sleep(3600)
            if MODE == "reqflood" and COUNT > 0:
                send_request(0)
            if MODE == "flood":
                note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
                data = (json.dumps(note) + "\n").encode() * COUNT
                out.write(data)
                out.flush()
        elif method == "tools/list":
            first = LOG and not os.path.exists(LOG)
            if LOG:
                with open(LOG, "a") as f:
                    f.write("list\n")
            if MODE == "starting" and first:
                send({"jsonrpc": "2.0", "id": mid,
                      "error": {"code": -32603, "message": "still starting"}})
                continue
            if MODE == "silent_list":
                continue
            answer(mid, tools_page(msg.get("params")))
            if MODE == "crashloop":
                time.sleep(COUNT / 1000)
                os._exit(1)
        elif method == "tools/call":
            call(mid, msg.get("params") or {})
        elif method == "ping":
            answer(mid, {})
        elif mid is not None:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": "method not found"}})


main()
