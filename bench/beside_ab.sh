#!/usr/bin/env bash
# Two builds against each other where a call may cross vCPUs, default
# placement, containers: per round and build, a fresh `staccato up`, then
#  - a C nop allowed one worker (`max_workers: 1`), called by a C client
#    pinned to vCPU 0, to vCPU 1, and free (10,000 calls each,
#    bench/ab-client/alternate): one of the pinned clients shares the
#    worker's vCPU, the other calls across;
#  - internal calls from the C caller to the Python nop and to the C nop
#    (bench/functions, 10,000 each, timed by the caller).
#
#   bench/beside_ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Prints one line per round and build: p50/p99 µs of each. BENCHMARKS.md
# ("Spinning only where the next message comes from another vCPU") quotes it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
old=$1
new=$2
rounds=${3:-3}
work=$(mktemp -d /tmp/staccato-beside-ab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work" /dev/shm/staccato-beside-ab-"$$"-*
}
trap cleanup EXIT
gcc -O2 -o "$work/alternate" bench/ab-client/alternate.c -lm
mkdir -p "$work/one"
cp bench/functions/c/nop.c "$work/one/"
cat >"$work/one/staccato.yml" <<'EOF'
version: 1
functions:
  nop-one:
    runtime: c
    handler: nop.c
    min_workers: 1
    max_workers: 1
EOF
samples() {
  python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read()
if not d or len(d) % 4:
    sys.exit(f"the caller answered {d[:200]!r}")
v = sorted(x[0] / 1000 for x in struct.iter_unpack("<I", d))
print(f"{v[len(v) // 2]:.1f}/{v[int(len(v) * 0.99)]:.1f}")' "$1"
}
for r in $(seq "$rounds"); do
  for build in old new; do
    bin=$old
    [ "$build" = new ] && bin=$new
    p=$(free_port)
    state=$work/$build-$r
    "$bin" up --listen "127.0.0.1:$p" --state-dir "$state" --ipc-dir "/dev/shm/staccato-beside-ab-$$-$p" \
      >"$work/$build-$r.log" 2>&1 &
    up=$!
    pids+=("$up")
    wait_up "$p" "$up" "$state" "$work/$build-$r.log"
    for f in "$work/one" bench/functions/c bench/functions/python; do
      STACCATO_GATEWAY="http://127.0.0.1:$p" STACCATO_TOKEN=$(cat "$state/token") "$bin" deploy "$f" >/dev/null
    done
    line="round $r $build: one worker,"
    for c in 0 1 0,1; do
      line="$line client on $c $(taskset -c "$c" "$work/alternate" 10000 "$p:/function/nop-one" | awk '{print $3 "/" $7}')"
    done
    for callee in bench-nop-python bench-nop-c; do
      curl -s -XPOST --data "10000:$callee" "http://127.0.0.1:$p/function/bench-caller-c" -o "$work/samples"
      line="$line; C -> ${callee#bench-nop-} $(samples "$work/samples")"
    done
    echo "$line"
    kill "$up"
    wait "$up" 2>/dev/null || true
  done
done
