#!/usr/bin/env bash
# Issue 21's huge model replies against the real binary, with its peak RSS.
#
#   benches/hostile_model_rss.sh [N=4] [MB=100] [STREAM=0]
#
# Starts a hostile OpenAI-compatible endpoint (python3) whose every reply
# is MB MiB of text (streamed in 64 KiB deltas when STREAM=1), and
# `cadre serve` (the debug binary unless CADRE_BIN is set) on a fresh data
# dir pointed at it. Sends N turns at once, to N sessions. Prints the
# answers, the server's peak RSS (VmHWM) and the data dir's size. With
# the default `[model] max_reply_bytes` (4 MiB) every turn is a 502
# MODEL_BAD_RESPONSE and nothing is stored; set
# CADRE_MODEL_MAX_REPLY_BYTES=1000000000 to see the unbounded behaviour.
set -euo pipefail

N=${1:-4}
MB=${2:-100}
STREAM=${3:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CADRE_BIN:-$ROOT/target/debug/cadre}
WORK=$(mktemp -d)
PORT=${PORT:-18935}
MODEL_PORT=${MODEL_PORT:-18936}
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

python3 - "$MODEL_PORT" "$MB" <<'PY' &
import http.server, json, sys
port, mb = int(sys.argv[1]), int(sys.argv[2])
piece = "x" * 65536
class Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        try:
            if request.get("stream"):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]})
                for _ in range(mb * 16):
                    self.wfile.write(f"data: {chunk}\n\n".encode())
                done = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                self.wfile.write(f"data: {done}\n\ndata: [DONE]\n\n".encode())
            else:
                head = b'{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"'
                tail = b'"}}]}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(head) + mb * 16 * 65536 + len(tail)))
                self.end_headers()
                self.wfile.write(head)
                for _ in range(mb * 16):
                    self.wfile.write(piece.encode())
                self.wfile.write(tail)
        except (BrokenPipeError, ConnectionResetError):
            pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Hostile).serve_forever()
PY

CADRE_MODEL_BASE_URL="http://127.0.0.1:$MODEL_PORT/v1" CADRE_MODEL_API_KEY=k \
  CADRE_API_LIMIT_PER_SECOND=1000000 CADRE_API_LIMIT_BURST=1000000 RUST_LOG=warn \
  "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$WORK/data" --agents "$ROOT/agents" \
  >"$WORK/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/healthz')" 2>/dev/null && break
  sleep 0.1
done
echo "before: $(grep VmRSS /proc/$PID/status)"
python3 - "$PORT" "$N" "$STREAM" <<'PY'
import collections, json, sys, threading, urllib.error, urllib.request
port, n, stream = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
base = f"http://127.0.0.1:{port}"
def post(path, body, accept="application/json"):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
sessions = [json.loads(post("/v1/sessions", {"agent": "assistant"})[1])["id"] for _ in range(n)]
codes = collections.Counter()
def turn(s):
    status, body = post(f"/v1/sessions/{s}/messages", {"content": "hello"},
                        "text/event-stream" if stream else "application/json")
    if stream:
        status = "turn_failed" if b"event: turn_failed" in body else "turn_completed" if b"event: turn_completed" in body else status
    else:
        try:
            status = f"{status} {json.loads(body)['error']['code']}"
        except Exception:
            pass
    codes[status] += 1
threads = [threading.Thread(target=turn, args=(s,)) for s in sessions]
for t in threads: t.start()
for t in threads: t.join()
print("answers:", dict(codes))
PY
echo "after:  $(grep -E 'VmRSS|VmHWM' /proc/$PID/status | tr -s ' \n' ' ') data $(du -sh "$WORK/data" | cut -f1)"
