#!/usr/bin/env python3
"""A hostile MCP server over streamable HTTP, Python 3 stdlib only.

    http_server.py PORTFILE [--count N]

Listens on 127.0.0.1 (a free port, written to PORTFILE once listening) at
`/mcp`. It answers `initialize` and `tools/list` (tools `ok` and `flood`);
`ok` echoes its arguments. Calling `flood` answers with an event stream
that carries COUNT `ping` requests of the server's own and never the
call's result, and the server never takes the client's answers to them
(each answering POST is read, then held open unanswered): the flood of
issue #29 (4) over HTTP.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
PORTFILE = args[0]
opts = dict(zip(args[1::2], args[2::2]))
COUNT = int(opts.get("--count", "100000"))

TOOLS = [
    {
        "name": "ok",
        "description": "echoes its arguments",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "flood",
        "description": "floods the caller with ping requests",
        "inputSchema": {"type": "object"},
    },
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def json_answer(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Mcp-Session-Id", "hostile")
        self.end_headers()
        self.wfile.write(body)

    def empty(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.empty(405)

    def do_DELETE(self):
        self.empty(200)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        msg = json.loads(self.rfile.read(length) or b"{}")
        method = msg.get("method")
        mid = msg.get("id")
        if method is None:
            # The client's answer to one of our pings: never taken.
            time.sleep(3600)
            return
        if mid is None:
            self.empty(202)
            return
        if method == "initialize":
            self.json_answer({
                "jsonrpc": "2.0",
                "id": mid,
                "result": {
                    "protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile-http", "version": "0"},
                },
            })
        elif method == "tools/list":
            self.json_answer({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call" and msg["params"]["name"] == "ok":
            text = json.dumps(msg["params"].get("arguments") or {})
            self.json_answer({
                "jsonrpc": "2.0",
                "id": mid,
                "result": {"content": [{"type": "text", "text": text}]},
            })
        elif method == "tools/call":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            try:
                for n in range(COUNT):
                    ping = {"jsonrpc": "2.0", "id": f"ping-{n}", "method": "ping"}
                    self.wfile.write(b"event: message\ndata: " + json.dumps(ping).encode() + b"\n\n")
                    if n % 100 == 0:
                        self.wfile.flush()
                self.wfile.flush()
                time.sleep(3600)
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            self.json_answer({
                "jsonrpc": "2.0",
                "id": mid,
                "error": {"code": -32601, "message": f"no method {method}"},
            })


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(PORTFILE + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.rename(PORTFILE + ".tmp", PORTFILE)
    server.serve_forever()


if __name__ == "__main__":
    main()
