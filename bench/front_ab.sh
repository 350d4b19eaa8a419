#!/usr/bin/env bash
# The external path with the engine as the front door against the gateway as
# the front door and a plain C HTTP server (the floor), all three running at
# once and called in turn, call by call (bench/ab-client/alternate.c), so the
# drift of a shared machine hits them alike. Then 16-connection throughput
# (wrk), the three in turn, ROUNDS times.
#
#   bench/front_ab.sh [pinned|default] [CALLS] [ROUNDS]
#
# pinned: everything (servers, client, wrk) on CPU 0. Prints the figures;
# BENCHMARKS.md ("The engine as the front door") quotes them.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
mode=${1:-default}
calls=${2:-20000}
rounds=${3:-3}
bin=target/release/staccato
work=$(mktemp -d /tmp/staccato-front-ab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work" /dev/shm/staccato-front-ab-*
}
trap cleanup EXIT
pin=()
[ "$mode" = pinned ] && pin=(taskset -c 0)
gcc -O2 -o "$work/alternate" bench/ab-client/alternate.c -lm
gcc -O2 -o "$work/plain" bench/ab-client/plain.c
declare -A ports upids
for fd in engine gateway; do
  p=$(free_port)
  ports[$fd]=$p
  STACCATO_STATE_DIR="$work/$fd" "${pin[@]}" "$bin" up --listen "127.0.0.1:$p" --state-dir "$work/$fd" \
    --ipc-dir "/dev/shm/staccato-front-ab-$p" --front-door "$fd" >"$work/$fd.log" 2>&1 &
  pids+=($!)
  upids[$fd]=$!
done
plain=$(free_port)
"${pin[@]}" "$work/plain" "$plain" &
pids+=($!)
for fd in engine gateway; do
  wait_up "${ports[$fd]}" "${upids[$fd]}" "$work/$fd" "$work/$fd.log"
  STACCATO_GATEWAY="http://127.0.0.1:${ports[$fd]}" STACCATO_TOKEN=$(cat "$work/$fd/token") \
    "$bin" deploy bench/functions/c >/dev/null
done
e=${ports[engine]}; g=${ports[gateway]}
echo "== $mode: closed loop, $calls calls each, in turn (engine front door, gateway front door, plain server)"
"${pin[@]}" "$work/alternate" "$calls" "$e:/function/bench-nop-c" "$g:/function/bench-nop-c" "$plain:/"
echo "== $mode: open loop, 1000 rounds at ~100 rounds/s (Poisson gaps)"
GAP_US=10000 "${pin[@]}" "$work/alternate" 1000 "$e:/function/bench-nop-c" "$g:/function/bench-nop-c" "$plain:/"
echo "== $mode: 16 connections, wrk -t2 -d3s, $rounds rounds in turn (requests/s)"
for r in $(seq "$rounds"); do
  line="round $r:"
  for target in "engine $e /function/bench-nop-c" "gateway $g /function/bench-nop-c" "plain $plain /"; do
    set -- $target
    rps=$("${pin[@]}" wrk -t2 -c16 -d3s -s <(printf 'wrk.method="POST"\nwrk.body="hi"\n') "http://127.0.0.1:$2$3" \
      | awk '/Requests\/sec/ {print $2}')
    line="$line $1 $rps"
  done
  echo "$line"
done
