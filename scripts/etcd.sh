#!/usr/bin/env bash
# A one-member etcd for gateways that share their functions
# (`staccato gateway --store etcd://127.0.0.1:PORT`), on loopback, its data
# under DIR. Runs in the foreground until stopped (Ctrl-C).
#   scripts/etcd.sh [DIR] [PORT]    (default: ./staccato-etcd, 2379)
set -euo pipefail
dir=${1:-./staccato-etcd}
port=${2:-2379}
peer=$((port + 1))
command -v etcd >/dev/null || { echo "error: etcd is not installed (scripts/setup.sh installs etcd-server)" >&2; exit 1; }
mkdir -p "$dir"
echo "==> etcd on 127.0.0.1:$port, data in $dir; gateways: --store etcd://127.0.0.1:$port"
exec etcd --name staccato --data-dir "$dir/data" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "staccato=http://127.0.0.1:$peer"
