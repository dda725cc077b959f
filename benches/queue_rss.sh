#!/usr/bin/env bash
# The queue attack of issue 15 against the real binary, with its RSS.
#
#   benches/queue_rss.sh [N=400] [KB=200] [GIVE_UP_S=3]
#
# Starts a slow fake model (python3: every chat completion answers after
# MODEL_DELAY_S, default 2 s, and is counted), then `cadre serve` (the
# debug binary unless CADRE_BIN is set) with the API rate limit opened wide
# so that only the session queue is in play. One session; N clients each
# POST a KB-kilobyte message at once and give up after GIVE_UP_S seconds.
# Prints the server's VmRSS / VmHWM (from /proc/<pid>/status) before, right
# after the burst and once every turn ran, the answers' status codes, the
# model calls made and the messages stored. Needs curl and python3.
set -euo pipefail

N=${1:-400}
KB=${2:-200}
GIVE_UP_S=${3:-3}
MODEL_DELAY_S=${MODEL_DELAY_S:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CADRE_BIN:-$ROOT/target/debug/cadre}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP_LOG:-}" ] && cp "$WORK/serve.log" "$KEEP_LOG"; rm -rf "$WORK"' EXIT

cat >"$WORK/model.py" <<'EOF'
import json, sys, time, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
delay, count_file = float(sys.argv[1]), sys.argv[2]
lock, calls = threading.Lock(), [0]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with lock:
            calls[0] += 1
            open(count_file, "w").write(str(calls[0]))
        time.sleep(delay)
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF
echo 0 >"$WORK/calls"
python3 "$WORK/model.py" "$MODEL_DELAY_S" "$WORK/calls" >"$WORK/model.port" &
until [ -s "$WORK/model.port" ]; do sleep 0.05; done
MODEL_PORT=$(cat "$WORK/model.port")

CADRE_MODEL_BASE_URL="http://127.0.0.1:$MODEL_PORT/v1" CADRE_MODEL_API_KEY=x CADRE_MODEL=m \
CADRE_API_LIMIT_PER_SECOND=100000 CADRE_API_LIMIT_BURST=100000 RUST_LOG=${RUST_LOG:-warn} \
  "$BIN" serve --addr 127.0.0.1:0 --data-dir "$WORK/data" --agents "$ROOT/agents" \
  >"$WORK/serve.out" 2>"$WORK/serve.log" &
PID=$!
until grep -q listening "$WORK/serve.out" 2>/dev/null; do sleep 0.05; done
BASE=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$WORK/serve.out")
rss() { grep -E 'VmRSS|VmHWM' /proc/$PID/status | tr -s ' \t' ' ' | tr '\n' ' '; echo; }

SESSION=$(curl -s -X POST "$BASE/v1/sessions" -H 'content-type: application/json' \
  -d '{"agent":"assistant"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
python3 -c "import json; print(json.dumps({'content': 'x' * ($KB * 1024 - 16)}))" >"$WORK/body.json"

echo "binary: $BIN; N=$N messages of $KB KB, clients give up after ${GIVE_UP_S}s, model ${MODEL_DELAY_S}s per call"
echo "before:        $(rss)"
PIDS=()
for _ in $(seq "$N"); do
  curl -s -o /dev/null -w '%{http_code}\n' --max-time "$GIVE_UP_S" -X POST \
    "$BASE/v1/sessions/$SESSION/messages" -H 'content-type: application/json' \
    --data-binary @"$WORK/body.json" >>"$WORK/codes" || true &
  PIDS+=($!)
done
wait "${PIDS[@]}"
echo "after burst:   $(rss)"
echo "answers:       $(sort "$WORK/codes" | uniq -c | tr -s ' ' | tr '\n' ' ') (000 = the client gave up)"
# Let whatever was queued run: one model delay per turn that was left.
sleep $(( MODEL_DELAY_S * 10 ))
echo "settled:       $(rss)"
STORED=$(curl -s "$BASE/v1/sessions/$SESSION/messages?limit=1000" |
  python3 -c 'import json,sys; print(sum(1 for m in json.load(sys.stdin)["messages"] if "\"role\": \"user\"" in json.dumps(m)))')
echo "model calls:   $(cat "$WORK/calls"); user messages stored: $STORED"
