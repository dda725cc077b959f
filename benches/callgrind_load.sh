#!/usr/bin/env bash
# Instructions per turn of the load bench's N = 1 phase, under callgrind
# (docs/performance.md): counts do not move with the machine's other load.
#
#   cargo bench --bench load --no-run      # prints the binary's path
#   benches/callgrind_load.sh target/release/deps/load-<hash> target/callgrind
#
# Instrumentation is switched on when the bench prints that the load
# phases start, and the profile dumped when the N = 1 phase's line comes
# (its warm-up turn and its 400 turns); the totals line divided by 401 is
# instructions per turn, the whole process (cadre, the mock, the client).
set -u
bin=$1; out=$2
mkdir -p "$out"; rm -f "$out"/callgrind.out.*
export CADRE_BENCH_SESSIONS=1 CADRE_BENCH_DELAYS_MS=0 CADRE_BENCH_IDLE=100 CADRE_BENCH_DIR="$out/data"
rm -rf "$out/data"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out.%p" "$bin" --bench > "$out/stdout.txt" 2> "$out/stderr.txt" &
vg=$!
on=0
while kill -0 $vg 2>/dev/null; do
  if [ $on = 0 ] && grep -q "load average before the load phases" "$out/stdout.txt"; then
    callgrind_control -i on $vg >/dev/null; on=1; echo "instrumentation on"
  fi
  if [ $on = 1 ] && grep -q "^  mock" "$out/stdout.txt"; then
    callgrind_control -d $vg >/dev/null; echo "dumped"; kill $vg; break
  fi
  sleep 0.5
done
wait $vg 2>/dev/null
grep "^  mock" "$out/stdout.txt"
for f in "$out"/callgrind.out.*; do grep -h "^summary:\|^totals:" "$f"; done
