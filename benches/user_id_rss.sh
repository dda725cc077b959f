#!/usr/bin/env bash
# The user_id attack of issue 15 against the real binary, with its RSS.
#
#   benches/user_id_rss.sh [N=500] [KB=800]
#
# Starts `cadre serve` (the debug binary unless CADRE_BIN is set) on a fresh
# data dir with the API rate limit opened wide, then sends N invokes of
# `echo` whose `user_id` is KB kilobytes long, one after another. Prints the
# server's VmRSS before and after, the answers' status codes and the data
# dir's size: a bounded `user_id` is refused (422) before any work, so RSS
# and disk stay where they were. Needs python3.
set -euo pipefail

N=${1:-500}
KB=${2:-800}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CADRE_BIN:-$ROOT/target/debug/cadre}
WORK=$(mktemp -d)
PORT=${PORT:-18934}
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

CADRE_API_LIMIT_PER_SECOND=1000000 CADRE_API_LIMIT_BURST=1000000 RUST_LOG=warn \
  "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$WORK/data" --agents "$ROOT/agents" \
  >"$WORK/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/healthz')" 2>/dev/null && break
  sleep 0.1
done
echo "before: $(grep VmRSS /proc/$PID/status) data $(du -sh "$WORK/data" | cut -f1)"
python3 - "$PORT" "$N" "$KB" <<'PY'
import collections, json, sys, urllib.error, urllib.request
port, n, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = json.dumps({"user_id": "u" * (kb * 1024), "params": {"message": "hi"}}).encode()
codes = collections.Counter()
for _ in range(n):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/tools/echo/invoke", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            codes[r.status] += 1
    except urllib.error.HTTPError as e:
        codes[e.code] += 1
print("answers:", dict(codes))
PY
echo "after:  $(grep VmRSS /proc/$PID/status) data $(du -sh "$WORK/data" | cut -f1)"
