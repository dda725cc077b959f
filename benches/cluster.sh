#!/usr/bin/env bash
# Proof 5 of issue 17, the scaling benchmark: the same load on 1, 2 and 3
# nodes behind HAProxy, against single-node redb.
#
#   CLUSTER_ARGS='--store postgres://cadre@127.0.0.1/cadre --redis redis://127.0.0.1 --node-id n{i} --advertise http://{addr}' \
#   benches/cluster.sh [SESSIONS=64] [TURNS=5] [NODE_COUNTS="1 2 3"]
#
# Starts a fake model (python3; every chat completion waits MODEL_DELAY_MS,
# default 50; it asks for one `calculator` call when the last message is
# the user's and answers text once it is the tool's: two model calls per
# turn). First the baseline: one `cadre serve` on redb (no cluster flags),
# reached directly. Then, for each count in NODE_COUNTS, that many nodes on
# fixed loopback ports, each with CLUSTER_ARGS (`{i}`: the node's index,
# `{addr}`: its `127.0.0.1:PORT`) and NODE_ENV (extra `CADRE_*=...`
# assignments, e.g. the per-node pool caps), behind HAProxy with the
# routing of deploy/haproxy.cfg. Each run: SESSIONS sessions, one client
# thread each, TURNS turns back to back (closed loop). Prints turns/s,
# latency p50/p99 and the added cost per turn (mean latency minus the two
# model delays). The binary is the debug one unless CADRE_BIN is set (use
# a release build for figures: `cargo build --release`, CADRE_BIN=
# target/release/cadre). Plain redb nodes share nothing, so counts above 1
# need CLUSTER_ARGS; the database they name should be empty at the start.
# `CLUSTER_ARGS=" " benches/cluster.sh 32 5 1` (a plain node behind
# HAProxy) measures what HAProxy alone adds.
# Needs python3 and haproxy.
set -euo pipefail

SESSIONS=${1:-64}
TURNS=${2:-5}
read -r -a COUNTS <<<"${3:-1 2 3}"
MODEL_DELAY_MS=${MODEL_DELAY_MS:-50}
CLUSTER_ARGS=${CLUSTER_ARGS:-}
read -r -a NODE_ENV <<<"${NODE_ENV:-}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CADRE_BIN:-$ROOT/target/debug/cadre}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
command -v haproxy >/dev/null || { echo "needs haproxy (apt-get install haproxy)"; exit 1; }

cat >"$WORK/model.py" <<'EOF'
import json, sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
delay = float(sys.argv[1]) / 1000
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the body waits
    # for the client's delayed ACK (40 ms per model call on Linux).
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        time.sleep(delay)
        if req["messages"][-1]["role"] == "user":
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "calculator", "arguments": "{\"expression\": \"2+2\"}"}}]}
            finish = "tool_calls"
        else:
            msg, finish = {"role": "assistant", "content": "4"}, "stop"
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": finish, "message": msg}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer.daemon_threads = True
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF

cat >"$WORK/load.py" <<'EOF'
import json, sys, threading, time, http.client, urllib.parse
base, sessions, turns, delay_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
u = urllib.parse.urlparse(base)
def call(conn, method, path, body):
    conn.request(method, path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    return r.status, data
lat, errors, lock = [], [], threading.Lock()
def run():
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    status, data = call(conn, "POST", "/v1/sessions", {"agent": "assistant"})
    if status != 201:
        with lock: errors.append(status)
        return
    sid = json.loads(data)["id"]
    start.wait()
    for _ in range(turns):
        t = time.perf_counter()
        status, _ = call(conn, "POST", f"/v1/sessions/{sid}/messages", {"content": "what is 2+2?"})
        with lock:
            (lat.append(time.perf_counter() - t) if status == 200 else errors.append(status))
start = threading.Event()
threads = [threading.Thread(target=run) for _ in range(sessions)]
for th in threads: th.start()
time.sleep(0.5)
t0 = time.perf_counter(); start.set()
for th in threads: th.join()
wall = time.perf_counter() - t0
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")
mean = sum(lat) / len(lat) * 1000 if lat else float("nan")
print(f"turns {len(lat)} errors {len(errors)} {sorted(set(errors))} | {len(lat) / wall:.1f} turns/s | "
      f"p50 {q(0.5):.1f} ms p99 {q(0.99):.1f} ms | added per turn {mean - 2 * delay_ms:.1f} ms")
EOF

python3 "$WORK/model.py" "$MODEL_DELAY_MS" >"$WORK/model.port" &
until [ -s "$WORK/model.port" ]; do sleep 0.05; done
MODEL="http://127.0.0.1:$(cat "$WORK/model.port")/v1"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_node NAME ADDR ARGS...: a node in the background; waits for its address.
start_node() {
  local name=$1 addr=$2; shift 2
  env CADRE_MODEL_BASE_URL="$MODEL" CADRE_MODEL_API_KEY=x CADRE_MODEL=m \
    CADRE_API_LIMIT_PER_SECOND=100000 CADRE_API_LIMIT_BURST=100000 RUST_LOG=${RUST_LOG:-warn} \
    "${NODE_ENV[@]}" \
    "$BIN" serve --addr "$addr" --data-dir "$WORK/$name" --agents "$ROOT/agents" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.log" &
  until grep -q listening "$WORK/$name.out" 2>/dev/null; do
    kill -0 $! 2>/dev/null || { echo "$name did not start:"; tail "$WORK/$name.log"; exit 1; }
    sleep 0.05
  done
}
stop_all() { kill $(jobs -p | tail -n +2) 2>/dev/null || true; wait $(jobs -p | tail -n +2) 2>/dev/null || true; }

echo "binary: $BIN; $SESSIONS sessions x $TURNS turns; model ${MODEL_DELAY_MS} ms per call, 2 calls per turn; $(nproc) CPUs"
ADDR="127.0.0.1:$(free_port)"
start_node redb "$ADDR"
printf '%-22s' "redb, 1 node, direct:"
python3 "$WORK/load.py" "http://$ADDR" "$SESSIONS" "$TURNS" "$MODEL_DELAY_MS"
stop_all

for n in "${COUNTS[@]}"; do
  [ -z "$CLUSTER_ARGS" ] && { echo "cluster runs need CLUSTER_ARGS (plain nodes share nothing)"; exit 1; }
  SERVERS=""
  for i in $(seq 0 $((n - 1))); do
    addr="127.0.0.1:$(free_port)"
    args=${CLUSTER_ARGS//\{i\}/$i}
    read -r -a ARGV <<<"${args//\{addr\}/$addr}"
    start_node "n$n-$i" "$addr" "${ARGV[@]}"
    SERVERS+="    server node$i $addr check"$'\n'
  done
  HA_PORT=$(free_port)
  cat >"$WORK/haproxy-$n.cfg" <<CFG
global
    stats socket $WORK/admin-$n.sock mode 600 level admin
defaults
    mode http
    timeout connect 1s
    timeout client 5m
    timeout server 5m
frontend cadre
    bind 127.0.0.1:$HA_PORT
    default_backend nodes
backend nodes
    balance uri path-only depth 3
    hash-type consistent
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server inter 200ms fall 2 rise 1
$SERVERS
CFG
  haproxy -db -f "$WORK/haproxy-$n.cfg" >"$WORK/haproxy-$n.log" 2>&1 &
  until [ -S "$WORK/admin-$n.sock" ] && [ "$(echo 'show stat' | python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect('$WORK/admin-$n.sock'); s.sendall(b'show stat\n')
out = b''.join(iter(lambda: s.recv(65536), b'')).decode()
print(sum(1 for l in out.splitlines() if l.startswith('nodes,node') and ',UP,' in l))")" = "$n" ]; do
    sleep 0.1
  done
  printf '%-22s' "cluster, $n node(s):"
  python3 "$WORK/load.py" "http://127.0.0.1:$HA_PORT" "$SESSIONS" "$TURNS" "$MODEL_DELAY_MS"
  stop_all
done
