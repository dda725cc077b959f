#!/usr/bin/env python3
"""The one mock model every row of benches/peers talks to.

An OpenAI-compatible `POST /v1/chat/completions` (also `/chat/completions`)
on asyncio streams, stdlib only, in its own process so that its CPU is
charged to no row. The script is the same for every framework:

- the last message is a user message (no tool result yet): the reply asks for
  one `calculator` call with `{"expression": "2+3"}`;
- the last message is a tool result: the reply is the text `2+3 = 5`.

Streaming (`"stream": true`) is answered too, as Server-Sent Events in one
body (role chunk, content or tool-call chunk, finish chunk, optional usage
chunk, `[DONE]`), for a client that insists on it.

The mock's own time: every request is timed from the moment its whole body
has been read to the moment its reply has been handed to the socket (JSON
parse, reply built, `write`; not the drain). Each user message carries its
session's id as a tag `[s:ID]`; the time and the count of calls are charged to that
session. `GET /stats` returns `{"sessions": {ID: [calls, seconds]}, ...}`,
`POST /reset` forgets everything. The harness subtracts a session's mock
time from the wall time its client saw: what is left is what the framework
(plus loopback) added. Keep-alive HTTP/1.1; one request at a time per
connection, as OpenAI clients do.
"""

import argparse
import asyncio
import json
import os
import re
import sys
import time

SID = re.compile(rb"\[s:([A-Za-z0-9_.:-]+)\]")
EXPRESSION = "2+3"
ANSWER = "2+3 = 5"


class Stats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.sessions = {}
        self.requests = 0
        self.streamed = 0
        self.untagged = 0
        self.time_s = 0.0
        self.started = time.time()

    def charge(self, sid, seconds):
        self.requests += 1
        self.time_s += seconds
        if sid is None:
            self.untagged += 1
            return
        entry = self.sessions.get(sid)
        if entry is None:
            self.sessions[sid] = [1, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds


STATS = Stats()
COUNTER = [0]


def tool_name(request):
    for tool in request.get("tools") or ():
        name = (tool.get("function") or {}).get("name") or tool.get("name")
        if name and "calculator" in name:
            return name
    return "calculator"


def wants_tool_call(messages):
    if not messages:
        return True
    role = messages[-1].get("role")
    if role == "user":
        return True
    if role == "tool":
        return False
    return not any(m.get("role") == "tool" for m in messages)


def completion(request):
    COUNTER[0] += 1
    n = COUNTER[0]
    model = request.get("model") or "mock-model"
    created = int(time.time())
    if wants_tool_call(request.get("messages") or []):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {
                "name": tool_name(request),
                "arguments": json.dumps({"expression": EXPRESSION}),
            },
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        call = None
        message = {"role": "assistant", "content": ANSWER}
        finish = "stop"
    usage = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    return n, model, created, message, call, finish, usage


def json_reply(request):
    n, model, created, message, _call, finish, usage = completion(request)
    body = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage,
    }
    return "application/json", json.dumps(body).encode()


def sse_reply(request):
    n, model, created, message, call, finish, usage = completion(request)
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta, finish_reason=None, **extra):
        c = dict(base)
        c["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
        c.update(extra)
        return "data: " + json.dumps(c) + "\n\n"

    parts = [chunk({"role": "assistant", "content": None if call else ""})]
    if call:
        parts.append(chunk({"tool_calls": [{"index": 0, **call}]}))
    else:
        parts.append(chunk({"content": message["content"]}))
    parts.append(chunk({}, finish))
    if (request.get("stream_options") or {}).get("include_usage"):
        c = dict(base)
        c["choices"] = []
        c["usage"] = usage
        parts.append("data: " + json.dumps(c) + "\n\n")
    parts.append("data: [DONE]\n\n")
    return "text/event-stream", "".join(parts).encode()


def response(status, ctype, body, keep_alive):
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
        f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def read_body(reader, headers):
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        out = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(headers.get(b"content-length", b"0"))
    return await reader.readexactly(length) if length else b""


async def handle(reader, writer):
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.split(b"\r\n")
            method, path, version = lines[0].split(b" ", 2)
            headers = {}
            for line in lines[1:]:
                if line:
                    k, _, v = line.partition(b":")
                    headers[k.strip().lower()] = v.strip()
            if headers.get(b"expect", b"").lower() == b"100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await read_body(reader, headers)
            t0 = time.perf_counter()
            conn = headers.get(b"connection", b"").lower()
            keep_alive = conn != b"close" and not (version == b"HTTP/1.0" and conn != b"keep-alive")
            path = path.split(b"?")[0]
            sid = None
            if method == b"POST" and path.endswith(b"/chat/completions"):
                m = SID.search(body)
                sid = m.group(1).decode() if m else None
                request = json.loads(body)
                if request.get("stream"):
                    STATS.streamed += 1
                    ctype, out = sse_reply(request)
                else:
                    ctype, out = json_reply(request)
                writer.write(response("200 OK", ctype, out, keep_alive))
                # Stop the clock once the reply is handed to the kernel (write
                # sends at once while the socket has room): past this point the
                # client may already hold it, and a preemption of this process
                # would charge the session time it did not wait.
                STATS.charge(sid, time.perf_counter() - t0)
                await writer.drain()
            elif path == b"/stats":
                out = json.dumps(
                    {
                        "sessions": STATS.sessions,
                        "requests": STATS.requests,
                        "streamed": STATS.streamed,
                        "untagged": STATS.untagged,
                        "time_s": STATS.time_s,
                    }
                ).encode()
                writer.write(response("200 OK", "application/json", out, keep_alive))
                await writer.drain()
            elif path == b"/reset" and method == b"POST":
                STATS.reset()
                writer.write(response("200 OK", "application/json", b"{}", keep_alive))
                await writer.drain()
            elif path in (b"/healthz", b"/v1/models", b"/models"):
                out = b'{"object":"list","data":[{"id":"mock-model","object":"model","owned_by":"peers"}]}'
                writer.write(response("200 OK", "application/json", out, keep_alive))
                await writer.drain()
            else:
                writer.write(response("404 Not Found", "application/json", b'{"error":"not found"}', keep_alive))
                await writer.drain()
            if not keep_alive:
                return
    except Exception as e:  # a broken client must not stop the mock
        print(f"mock: connection error: {e!r}", file=sys.stderr)
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the bound port here once listening")
    args = ap.parse_args()
    server = await asyncio.start_server(handle, "127.0.0.1", args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"mock model on http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
