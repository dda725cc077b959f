#!/usr/bin/env bash
# A map node over N elements against the real binary: how long the run takes
# and how big the data dir ends up, for each N given.
#
#   benches/workflow_map.sh [N ...]            (default: 1000 2000 4000)
#
# Starts `cadre serve` (the debug binary unless CADRE_BIN is set) on a copy
# of the shipped agents dir plus one workflow, `bench-map`: a map node over
# `input.items` calling `echo` with each element, `max_parallel` 8
# (MAX_PARALLEL), with the API rate limit opened wide and
# `CADRE_WORKFLOWS_MAX_MAP_ELEMENTS` raised to the largest N. For each N it
# POSTs one run with `wait: true` and prints the wall time of that request,
# the run's status and the data dir's size. Linear recording shows as a
# time per element that stays flat as N grows. Needs curl and python3.
set -euo pipefail

NS=("$@")
[ ${#NS[@]} -eq 0 ] && NS=(1000 2000 4000)
MAX=0
for n in "${NS[@]}"; do [ "$n" -gt "$MAX" ] && MAX=$n; done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CADRE_BIN:-$ROOT/target/debug/cadre}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

cp -r "$ROOT/agents" "$WORK/agents"
cat >"$WORK/agents/workflows/bench-map.toml" <<TOML
name = "bench-map"
on_error = "continue"
[input]
type = "object"
[input.properties.items]
type = "array"
[[nodes]]
id = "each"
map = "input.items"
max_parallel = ${MAX_PARALLEL:-8}
tool = "echo"
params = { message = "element {{item}}" }
TOML

CADRE_API_LIMIT_PER_SECOND=100000 CADRE_API_LIMIT_BURST=100000 \
CADRE_WORKFLOWS_MAX_MAP_ELEMENTS=$MAX RUST_LOG=${RUST_LOG:-warn} \
  "$BIN" serve --addr 127.0.0.1:0 --data-dir "$WORK/data" --agents "$WORK/agents" \
  >"$WORK/serve.out" 2>"$WORK/serve.log" &
until grep -q listening "$WORK/serve.out" 2>/dev/null; do sleep 0.05; done
BASE=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$WORK/serve.out")

echo "binary: $BIN; max_parallel ${MAX_PARALLEL:-8}; $(nproc) CPUs"
for n in "${NS[@]}"; do
  python3 -c "import json; print(json.dumps({'input': {'items': list(range($n))}, 'wait': True}))" >"$WORK/body.json"
  start=$(date +%s.%N)
  status=$(curl -s -X POST "$BASE/v1/workflows/bench-map/runs" -H 'content-type: application/json' \
    --data-binary @"$WORK/body.json" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r.get("status", r))')
  end=$(date +%s.%N)
  python3 -c "s=$end-$start; print(f'N={$n:>6}  {s:7.2f} s  {s/$n*1000:6.2f} ms/element  status={\"$status\"}  data dir $(du -sm "$WORK/data" | cut -f1) MB')"
done
