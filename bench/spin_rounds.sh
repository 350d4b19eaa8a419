#!/usr/bin/env bash
# The C nop through the engine front door in default placement, with the
# client pinned to vCPU 0, to vCPU 1, and left to the kernel, then 16
# connections: a fresh `staccato up` per round (default settings plus the
# arguments given, containers), bench/functions/c deployed, 20,000 calls
# of bench/ab-client/alternate per client placement, `wrk -t2 -c16 -d2s`.
# It shows whether the engine's and the workers' spins keep a client that
# shares their vCPU waiting (BENCHMARKS.md, "Two spinners on one vCPU").
#
#   bench/spin_rounds.sh ROUNDS [UP_ARG...]
#   e.g. bench/spin_rounds.sh 3 --engine-spin-us=0 --worker-spin-us=0
#   STACCATO_BIN=target/release/other bench/spin_rounds.sh 3   (another build)
#
# Prints one line per round: p50/p99.9 µs per client placement, req/s.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
rounds=${1:-3}
shift || true
bin=${STACCATO_BIN:-target/release/staccato}
work=$(mktemp -d /tmp/staccato-spin-rounds.XXXXXX)
up=
ipc=
cleanup() {
  if [ -n "$up" ]; then kill "$up" 2>/dev/null || true; wait "$up" 2>/dev/null || true; fi
  [ -n "$ipc" ] && rm -rf "$ipc" "$ipc.lock"
  rm -rf "$work"
}
trap cleanup EXIT
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 1; }
gcc -O2 -o "$work/alternate" bench/ab-client/alternate.c -lm
echo 'wrk.method = "POST"' >"$work/post.lua"
for r in $(seq "$rounds"); do
  p=$(free_port)
  ipc=/dev/shm/staccato-spin-rounds-$p
  "$bin" up --listen "127.0.0.1:$p" --state-dir "$work/$r" --ipc-dir "$ipc" "$@" >"$work/$r.log" 2>&1 &
  up=$!
  wait_up "$p" "$up" "$work/$r" "$work/$r.log"
  STACCATO_GATEWAY="http://127.0.0.1:$p" STACCATO_TOKEN=$(cat "$work/$r/token") "$bin" deploy bench/functions/c >/dev/null
  line="round $r:"
  for c in 0 1 free; do
    pin=()
    [ "$c" != free ] && pin=(taskset -c "$c")
    line="$line client $c $(${pin[@]+"${pin[@]}"} "$work/alternate" 20000 "$p:/function/bench-nop-c" | awk '{print $3 "/" $9}')"
  done
  rps=$(wrk -t2 -c16 -d2s -s "$work/post.lua" "http://127.0.0.1:$p/function/bench-nop-c" | awk '/Requests\/sec/ {print $2}')
  echo "$line  16 connections $rps req/s"
  kill "$up" 2>/dev/null || true
  wait "$up" 2>/dev/null || true
  up=
  rm -rf "$ipc" "$ipc.lock"
  ipc=
done
