#!/usr/bin/env bash
# Proof 5 of issue 17, the scaling benchmark: the same load on 1, 2 and 3
# nodes behind HAProxy, against single-node redb.
#
#   cargo build --release && benches/cluster.sh [SESSIONS=64] [TURNS=10] [NODE_COUNTS="1 2 3"]
#
# One command: it starts everything it measures on loopback ports and stops
# it at the end: a PostgreSQL server from the machine's binaries (initdb in
# a temp dir; as the `postgres` user when run as root, which PostgreSQL
# requires), a redis-server, HAProxy, the cadre nodes and a fake model
# (python3). Needs python3, haproxy, redis-server and PostgreSQL's server
# binaries (`/usr/lib/postgresql/<v>/bin` or on PATH); says which is missing.
#
# The workload, per turn: the model (MODEL_DELAY_MS, default 50 ms per call)
# asks for one call of `upstream`, a tool file whose HTTP entry POSTs to the
# fake model's `/upstream` (TOOL_DELAY_MS, default 50 ms), then answers
# once it has the tool's result: 2 model calls + 1 tool call, 150 ms of
# waiting. Every node has the same **per-node pool cap**: `max_concurrent`
# and `max_per_tenant` = POOL (default 4) tool calls at once, so one node
# serves at most POOL / 50 ms = 80 turns/s whatever its CPU: capacity a
# node brings, which more nodes should add up, and which the 2 cores of a
# small machine do not bound.
#
# Rows, each a fresh set of nodes and an empty database:
#   redb      one plain `cadre serve` on redb, reached directly (the baseline);
#   pg N      N nodes on one PostgreSQL (`--store`), behind HAProxy: the pool
#             caps stay per node, so capacity grows with N;
#   pg+redis N  the same plus `--redis`: `max_concurrent` becomes a
#             cluster-wide cap (docs/configuration.md), so the cluster as a
#             whole serves POOL calls at once however many nodes it has.
# Each row: SESSIONS closed-loop clients (one thread and connection each,
# TURNS turns back to back) → turns/s and latency p50/p99; then LIGHT
# sessions (default 2, under any cap) → p50 and the **added cost per turn**
# (mean latency minus the 150 ms the model and tool spend); and the CPU
# the nodes, and PostgreSQL + Redis, spent per turn over the whole row
# (from /proc, both phases).
#
# Environment: CADRE_BIN (default target/release/cadre if built, else
# target/debug/cadre), MODEL_DELAY_MS, TOOL_DELAY_MS, POOL, LIGHT, LIGHT_TURNS,
# ROWS (default "redb pg pg+redis"), RUST_LOG (default warn).
set -euo pipefail

SESSIONS=${1:-64}
TURNS=${2:-10}
read -r -a COUNTS <<<"${3:-1 2 3}"
MODEL_DELAY_MS=${MODEL_DELAY_MS:-50}
TOOL_DELAY_MS=${TOOL_DELAY_MS:-50}
POOL=${POOL:-4}
LIGHT=${LIGHT:-2}
LIGHT_TURNS=${LIGHT_TURNS:-40}
read -r -a ROWS <<<"${ROWS:-redb pg pg+redis}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${CADRE_BIN:-}" ]; then BIN=$CADRE_BIN
elif [ -x "$ROOT/target/release/cadre" ]; then BIN=$ROOT/target/release/cadre
else BIN=$ROOT/target/debug/cadre; fi
[ -x "$BIN" ] || { echo "no cadre binary at $BIN: run cargo build --release first"; exit 1; }

missing=()
for tool in python3 haproxy redis-server; do command -v "$tool" >/dev/null || missing+=("$tool"); done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$PGBIN" ] || PGBIN=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
[ -x "$PGBIN/initdb" ] && [ -x "$PGBIN/postgres" ] || missing+=("PostgreSQL server binaries (initdb, postgres)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "benches/cluster.sh needs: ${missing[*]} (Debian: apt-get install haproxy redis-server postgresql)"
  exit 1
fi

WORK=$(mktemp -d)
chmod 755 "$WORK"
cleanup() {
  [ -n "${PG_PID:-}" ] && "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" stop -m immediate >/dev/null 2>&1 || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Ports below the kernel's ephemeral range, so no outgoing connection on the
# machine holds one (tests/support/ports.rs does the same).
read -r EPH_LOW _ </proc/sys/net/ipv4/ip_local_port_range
NEXT_PORT=$((EPH_LOW - 3000 - RANDOM % 5000))
free_port() {
  while :; do
    NEXT_PORT=$((NEXT_PORT + 1))
    python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',$NEXT_PORT))" 2>/dev/null && break
  done
  PORT=$NEXT_PORT
}

# ---- the fake model and the tool's upstream -------------------------------
cat >"$WORK/model.py" <<'EOF'
import json, sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
model_delay, tool_delay = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the body waits
    # for the client's delayed ACK (40 ms per call on Linux).
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def reply(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if self.path.endswith("/upstream"):
            time.sleep(tool_delay)
            return self.reply({"ok": True, "q": req.get("q")})
        time.sleep(model_delay)
        if req["messages"][-1]["role"] == "user":
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "upstream", "arguments": "{\"q\": \"2+2\"}"}}]}
            finish = "tool_calls"
        else:
            msg, finish = {"role": "assistant", "content": "4"}, "stop"
        self.reply({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": finish, "message": msg}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
s = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[3])), H)
print("ready", flush=True)
s.serve_forever()
EOF

# ---- the load client ------------------------------------------------------
cat >"$WORK/load.py" <<'EOF'
import json, socket, sys, threading, time, http.client, urllib.parse
base, sessions, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = urllib.parse.urlparse(base)
def connect():
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    conn.connect()
    # http.client sends a request's head and body in two writes: under
    # Nagle the body waits for the server's delayed ACK of the head (40 ms
    # once the connection leaves quick-ACK mode, after a dozen requests).
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn
def call(conn, method, path, body):
    conn.request(method, path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()
lat, errors, lock = [], [], threading.Lock()
def run():
    conn = connect()
    try:
        status, data = call(conn, "POST", "/v1/sessions", {"agent": "scaling"})
    except (OSError, http.client.HTTPException) as e:
        status, data = 0, repr(e).encode()
    if status != 201:
        with lock: errors.append(f"create {status} {data[:200]!r}")
        return
    sid = json.loads(data)["id"]
    start.wait()
    for _ in range(turns):
        t = time.perf_counter()
        try:
            status, data = call(conn, "POST", f"/v1/sessions/{sid}/messages", {"content": "what is 2+2?"})
        except (OSError, http.client.HTTPException) as e:
            status, data = 0, repr(e).encode()
            conn.close()
            conn = connect()
        with lock:
            if status == 200: lat.append(time.perf_counter() - t)
            else: errors.append(f"{status} {data[:200]!r}")
start = threading.Event()
threads = [threading.Thread(target=run) for _ in range(sessions)]
for th in threads: th.start()
time.sleep(0.3)
t0 = time.perf_counter(); start.set()
for th in threads: th.join()
wall = time.perf_counter() - t0
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")
print(json.dumps({"turns": len(lat), "errors": len(errors), "first_error": errors[0] if errors else None,
                  "turns_per_s": len(lat) / wall, "p50_ms": q(0.5), "p99_ms": q(0.99),
                  "mean_ms": sum(lat) / len(lat) * 1000 if lat else float("nan")}))
EOF

# cpu_ms PID...: user+system CPU of these processes and all their
# descendants (PostgreSQL's backends are the postmaster's children), in ms.
cpu_ms() {
  python3 - "$@" <<'EOF'
import os, sys
hz, stats = os.sysconf("SC_CLK_TCK"), {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            stats[int(d)] = (int(f[1]), int(f[11]) + int(f[12]))
        except OSError:
            pass
todo, seen = [int(p) for p in sys.argv[1:]], set()
while todo:
    pid = todo.pop()
    if pid in seen: continue
    seen.add(pid)
    todo += [c for c, (ppid, _) in stats.items() if ppid == pid]
print(sum(stats[p][1] for p in seen if p in stats) * 1000 // hz)
EOF
}

# ---- PostgreSQL and Redis, started here -----------------------------------
RUNAS=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "running as root needs the postgres user (Debian's postgresql package creates it)"; exit 1; }
  RUNAS=(runuser -u postgres --)
fi
mkdir "$WORK/pg"
[ ${#RUNAS[@]} -gt 0 ] && chown postgres "$WORK/pg"
"${RUNAS[@]}" "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$WORK/initdb.log" 2>&1 \
  || { echo "initdb failed:"; tail "$WORK/initdb.log"; exit 1; }
free_port; PG_PORT=$PORT
"${RUNAS[@]}" "$PGBIN/postgres" -D "$WORK/pg/data" -p "$PG_PORT" -c listen_addresses=127.0.0.1 \
  -c "unix_socket_directories=$WORK/pg" -c max_connections=300 >"$WORK/pg.log" 2>&1 &
PG_PID=$!
until "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; do
  kill -0 $PG_PID 2>/dev/null || { echo "PostgreSQL did not start:"; tail "$WORK/pg.log"; exit 1; }
  sleep 0.1
done
psql_c() { "$PGBIN/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -c "$1"; }

free_port; REDIS_PORT=$PORT
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
redis_cmd() { python3 -c "import socket; s=socket.create_connection(('127.0.0.1',$REDIS_PORT)); s.sendall(b'$1\r\n'); assert s.recv(64).startswith(b'+')"; }
until redis_cmd PING 2>/dev/null; do
  kill -0 $REDIS_PID 2>/dev/null || { echo "redis-server did not start:"; tail "$WORK/redis.log"; exit 1; }
  sleep 0.05
done

free_port; MODEL_PORT=$PORT
python3 "$WORK/model.py" "$MODEL_DELAY_MS" "$TOOL_DELAY_MS" "$MODEL_PORT" >"$WORK/model.out" 2>&1 &
until grep -q ready "$WORK/model.out" 2>/dev/null; do sleep 0.05; done

# ---- the agent and its tool -----------------------------------------------
mkdir -p "$WORK/agents/tools"
cat >"$WORK/agents/scaling.toml" <<EOF
name = "scaling"
description = "One upstream call per turn (benches/cluster.sh)."
system_prompt = "Use the upstream tool, then answer."
tools = ["upstream"]
max_iterations = 3
# Larger than a run's history: no rolling-summary model call between turns
# (the next turn of the session would wait for it).
history_window = 1000
EOF
cat >"$WORK/agents/tools/upstream.yaml" <<EOF
name: upstream
version: "1.0.0"
description: Ask the upstream service (answers after ${TOOL_DELAY_MS} ms)
category: custom
parameters:
  - name: q
    type: string
    required: true
    description: The question
entry:
  type: external
  url: "http://127.0.0.1:$MODEL_PORT/upstream"
  allowlist: ["127.0.0.1:$MODEL_PORT"]
side_effects: none
EOF

# start_node NAME ADDR ARGS...: a node in the background; waits until it listens.
NODE_PIDS=()
start_node() {
  local name=$1 addr=$2; shift 2
  env CADRE_MODEL_BASE_URL="http://127.0.0.1:$MODEL_PORT/v1" CADRE_MODEL_API_KEY=x CADRE_MODEL=m \
    CADRE_API_LIMIT_PER_SECOND=100000 CADRE_API_LIMIT_BURST=100000 \
    CADRE_CONCURRENCY_MAX_CONCURRENT="$POOL" CADRE_CONCURRENCY_MAX_PER_TENANT="$POOL" \
    CADRE_CONCURRENCY_QUEUE_SIZE=10000 CADRE_CONCURRENCY_DEFAULT_TIMEOUT_S=300 \
    RUST_LOG=${RUST_LOG:-warn} RUST_LIB_BACKTRACE=0 \
    "$BIN" serve --addr "$addr" --data-dir "$WORK/$name" --agents "$WORK/agents" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.log" &
  local pid=$!
  NODE_PIDS+=("$pid")
  until grep -q listening "$WORK/$name.out" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "$name did not start:"; tail "$WORK/$name.log"; exit 1; }
    sleep 0.05
  done
}
stop_nodes() {
  for p in "${NODE_PIDS[@]}" ${HA_PID:-}; do kill "$p" 2>/dev/null || true; done
  for p in "${NODE_PIDS[@]}" ${HA_PID:-}; do wait "$p" 2>/dev/null || true; done
  NODE_PIDS=(); HA_PID=
}

# haproxy_for N SERVERS: HAProxy in front, with deploy/haproxy.cfg's routing; waits until all N are up.
haproxy_for() {
  local n=$1 servers=$2 tag=$3
  free_port; HA_PORT=$PORT
  cat >"$WORK/haproxy-$tag.cfg" <<CFG
global
    stats socket $WORK/admin-$tag.sock mode 600 level admin
    maxconn 2000
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
$servers
CFG
  haproxy -db -f "$WORK/haproxy-$tag.cfg" >"$WORK/haproxy-$tag.log" 2>&1 &
  HA_PID=$!
  until [ -S "$WORK/admin-$tag.sock" ] && [ "$(python3 -c "
import socket
s = socket.socket(socket.AF_UNIX); s.connect('$WORK/admin-$tag.sock'); s.sendall(b'show stat\n')
out = b''.join(iter(lambda: s.recv(65536), b'')).decode()
print(sum(1 for l in out.splitlines() if l.startswith('nodes,node') and ',UP,' in l))")" = "$n" ]; do
    kill -0 $HA_PID 2>/dev/null || { echo "haproxy did not start:"; tail "$WORK/haproxy-$tag.log"; exit 1; }
    sleep 0.1
  done
}

# measure LABEL URL: the saturating phase, the light phase, CPU per turn.
measure() {
  local label=$1 url=$2 nodes0 back0 heavy light nodes1 back1
  nodes0=$(cpu_ms "${NODE_PIDS[@]}"); back0=$(cpu_ms $PG_PID $REDIS_PID)
  heavy=$(python3 "$WORK/load.py" "$url" "$SESSIONS" "$TURNS")
  light=$(python3 "$WORK/load.py" "$url" "$LIGHT" "$LIGHT_TURNS")
  nodes1=$(cpu_ms "${NODE_PIDS[@]}"); back1=$(cpu_ms $PG_PID $REDIS_PID)
  python3 - "$label" "$heavy" "$light" $((nodes1 - nodes0)) $((back1 - back0)) \
    "$((2 * MODEL_DELAY_MS + TOOL_DELAY_MS))" <<'EOF'
import json, sys
label, heavy, light = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
nodes_ms, back_ms, wait_ms = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
turns = heavy["turns"] + light["turns"]
errs = heavy["errors"] + light["errors"]
print(f"| {label:<19} | {heavy['turns_per_s']:8.1f} | {heavy['p50_ms']:7.1f} | {heavy['p99_ms']:7.1f} "
      f"| {light['p50_ms']:7.1f} | {light['mean_ms'] - wait_ms:6.2f} "
      f"| {nodes_ms * 1000 / max(turns, 1):7.0f} | {back_ms * 1000 / max(turns, 1):7.0f} | {turns:6} | {errs} |")
for name, r in (("load", heavy), ("light", light)):
    if r["errors"]:
        print(f"  {label} {name}: {r['errors']} failed turns, the first: {r['first_error']}")
EOF
}

echo "binary: $BIN; $(nproc) CPUs; $SESSIONS sessions x $TURNS turns (light: $LIGHT sessions x $LIGHT_TURNS turns)"
echo "model ${MODEL_DELAY_MS} ms per call (2 per turn), tool upstream ${TOOL_DELAY_MS} ms; pool cap per node: $POOL calls"
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), $(redis-server --version | awk '{print $1, $3}'), $(haproxy -v | head -n 1 | awk '{print $1, $3}')"
echo
echo "| row                 |  turns/s | p50 ms  | p99 ms  | light p50 | added ms | node CPU µs/turn | PG+Redis µs/turn | turns | failed |"
echo "|---------------------|----------|---------|---------|-----------|----------|------------------|------------------|-------|--------|"

for row in "${ROWS[@]}"; do
  case $row in
    redb)
      free_port; addr="127.0.0.1:$PORT"
      start_node redb "$addr"
      measure "redb, 1 node" "http://$addr"
      stop_nodes
      ;;
    pg|pg+redis)
      for n in "${COUNTS[@]}"; do
        db="cadre_${row/+/_}_$n"
        psql_c "CREATE DATABASE $db"
        servers=""
        for i in $(seq 0 $((n - 1))); do
          free_port; addr="127.0.0.1:$PORT"
          args=(--store "postgres://postgres@127.0.0.1:$PG_PORT/$db" --node-id "n$i" --advertise "http://$addr")
          [ "$row" = pg+redis ] && args+=(--redis "redis://127.0.0.1:$REDIS_PORT")
          start_node "$db-$i" "$addr" "${args[@]}"
          servers+="    server node$i $addr check"$'\n'
        done
        haproxy_for "$n" "$servers" "$db"
        measure "$row, $n node(s)" "http://127.0.0.1:$HA_PORT"
        stop_nodes
        redis_cmd FLUSHALL # permits and windows of this row's nodes
      done
      ;;
    *) echo "unknown row $row (redb, pg, pg+redis)"; exit 1 ;;
  esac
done
echo
echo "turns/s, p50, p99: $SESSIONS sessions at once; light p50 and added ms (mean latency minus the"
echo "$((2 * MODEL_DELAY_MS + TOOL_DELAY_MS)) ms the model and the tool wait): $LIGHT sessions; CPU per turn over both phases."
