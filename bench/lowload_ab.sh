#!/usr/bin/env bash
# The C nop at ~100 calls/s through the engine front door, two builds
# against each other, with the client pinned to vCPU 0, to vCPU 1, and left
# to the kernel: where the client sends from decides how many halted vCPUs
# a call wakes. Each round starts a fresh `staccato up` per build (default
# settings, containers), deploys bench/functions/c, and runs 1,000 rounds of
# bench/ab-client/alternate (Poisson gaps, 10 ms mean), calling the build
# and a plain C HTTP server (the floor, unpinned) in turn.
#
#   bench/lowload_ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Prints one line per round, build and client placement: p50/p90/p99/p99.9
# µs of the build, then of the plain server, and which vCPU the nop's
# worker is pinned to. BENCHMARKS.md ("A worker on the client's vCPU")
# quotes it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
old=$1
new=$2
rounds=${3:-3}
work=$(mktemp -d /tmp/staccato-lowload-ab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work" /dev/shm/staccato-lowload-ab-*
}
trap cleanup EXIT
gcc -O2 -o "$work/alternate" bench/ab-client/alternate.c -lm
gcc -O2 -o "$work/plain" bench/ab-client/plain.c
plain=$(free_port)
"$work/plain" "$plain" &
pids+=($!)
for r in $(seq "$rounds"); do
  for v in old new; do
    bin=$old
    [ "$v" = new ] && bin=$new
    p=$(free_port)
    "$bin" up --listen "127.0.0.1:$p" --state-dir "$work/$v-$r" --ipc-dir "/dev/shm/staccato-lowload-ab-$p" \
      >"$work/$v-$r.log" 2>&1 &
    up=$!
    pids+=("$up")
    wait_up "$p" "$up" "$work/$v-$r" "$work/$v-$r.log"
    STACCATO_GATEWAY="http://127.0.0.1:$p" STACCATO_TOKEN=$(cat "$work/$v-$r/token") \
      "$bin" deploy bench/functions/c >/dev/null
    for c in 0 1 any; do
      pin=()
      [ "$c" != any ] && pin=(taskset -c "$c")
      out=$(GAP_US=10000 "${pin[@]}" "$work/alternate" 1000 "$p:/function/bench-nop-c" "$plain:/" |
        awk '{printf "%s/%s/%s/%s  ", $3, $5, $7, $9}')
      echo "round $r $v client on CPU $c: staccato, plain: $out"
    done
    # Where the C host processes (launcher and workers) ran last: count, vCPU.
    echo "round $r $v C host processes by vCPU: $(ps -eo psr,comm | awk '$2 == "staccato-c-host" {print $1}' | sort | uniq -c | tr '\n' ' ')"
    kill "$up"
    wait "$up" 2>/dev/null || true
    unset 'pids[${#pids[@]}-1]'
  done
done
