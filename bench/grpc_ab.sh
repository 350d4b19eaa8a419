#!/usr/bin/env bash
# External nop calls over gRPC against HTTP/1.1, one staccato (`up` with
# --grpc-listen), one client program (bench/grpc-client, Go: grpc-go and
# net/http), the two protocols called in turn, call by call.
#
#   bench/grpc_ab.sh [CALLS] [ROUNDS]
#
# The client's modules come from the Go module proxy on its first build.
# BENCHMARKS.md ("gRPC ingress") quotes the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
calls=${1:-20000}
rounds=${2:-3}
bin=target/release/staccato
work=$(mktemp -d /tmp/staccato-grpc-ab.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work" /dev/shm/staccato-grpc-ab-*
}
trap cleanup EXIT
(cd bench/grpc-client && go build -o "$work/grpc-client" .)
http=$(free_port)
grpc=$(free_port)
"$bin" up --listen "127.0.0.1:$http" --grpc-listen "127.0.0.1:$grpc" --state-dir "$work/state" \
  --ipc-dir "/dev/shm/staccato-grpc-ab-$http" >"$work/up.log" 2>&1 &
pid=$!
wait_up "$http" "$pid" "$work/state" "$work/up.log"
STACCATO_GATEWAY="http://127.0.0.1:$http" STACCATO_TOKEN=$(cat "$work/state/token") \
  "$bin" deploy bench/functions/c >/dev/null
for r in $(seq "$rounds"); do
  echo "== round $r: $calls calls each, in turn"
  "$work/grpc-client" "$calls" "127.0.0.1:$grpc" bench.Nop/Call "http://127.0.0.1:$http/function/bench-nop-c"
done
