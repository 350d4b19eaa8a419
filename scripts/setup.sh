#!/usr/bin/env bash
# Installs what Staccato needs on a fresh Debian 12 machine and builds it.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
dpkg -s libcjson-dev >/dev/null 2>&1 || need_apt+=(libcjson-dev)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
# The C runtime's tests build against its installed pkg-config files.
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# Function containers (issue 4): runc, the static C library for the
# container init, and iproute2 + nftables for isolated networks.
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# Several gateways share their functions through etcd (issue 11); the tests
# and scripts/etcd.sh start it on loopback.
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
# The SocialNetwork example's stores (issue 12): its tests and
# `make bench-socialnet` start them on loopback (examples/socialnet/snlib/stores.py).
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
# bench/front_ab.sh's throughput runs.
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
# The Python runtime's hot path in C (staccato._fast, built below) needs the
# headers of the python3 the engine runs; Debian's come with python3-dev.
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
  || { [ "$(command -v python3)" = /usr/bin/python3 ] && need_apt+=(python3-dev); } || true
# The dashboard's test drives a real headless browser (tests/test_dashboard.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> apt-get install ${need_apt[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; else
    echo "error: Rust (cargo) is required: https://rustup.rs" >&2; exit 1; fi
fi
python3 -c 'import sys; assert sys.version_info >= (3, 9)' || { echo "error: Python >= 3.9 is required" >&2; exit 1; }
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || { echo "error: Go >= 1.22 is required for Go functions (https://go.dev/dl)" >&2; exit 1; }
command -v node >/dev/null 2>&1 || { echo "error: Node.js >= 18 is required for Node.js functions" >&2; exit 1; }
python3 -m pytest --version >/dev/null 2>&1 || { echo "==> pip install pytest"; python3 -m pip install -q pytest; }
python3 -c 'import kubernetes_validate, yaml' >/dev/null 2>&1 || { echo "==> pip install kubernetes-validate (offline checks of deploy/kubernetes)"; python3 -m pip install -q kubernetes-validate pyyaml; }
# The workload analyzer (staccato bench analyze/compare) plots with matplotlib.
# gRPC ingress tests: a real gRPC client (grpcio) and raw HTTP/2 frames (h2).
python3 -c 'import grpc, h2' >/dev/null 2>&1 || { echo "==> pip install grpcio h2"; python3 -m pip install -q grpcio h2; }
python3 -c 'import opentelemetry.proto' >/dev/null 2>&1 || { echo "==> pip install opentelemetry-proto (the OTLP receiver in tests/test_tracing.py)"; python3 -m pip install -q opentelemetry-proto; }
python3 -c 'import playwright' >/dev/null 2>&1 || { echo "==> pip install playwright (drives Debian's chromium in tests/test_dashboard.py)"; python3 -m pip install -q playwright; }
python3 -c 'import numpy, matplotlib' >/dev/null 2>&1 || { echo "==> pip install numpy matplotlib"; python3 -m pip install -q numpy matplotlib; }
# uvloop makes the Python runtime's event loop ~5-20 us faster per internal
# call (BENCHMARKS.md); the runtime falls back to asyncio without it.
python3 -c 'import uvloop' >/dev/null 2>&1 || { echo "==> pip install uvloop"; python3 -m pip install -q uvloop || echo "warning: uvloop not installed; Python functions use plain asyncio"; }

# `make lint` (run by `make test`): formatting and clippy with -D warnings.
for c in rustfmt clippy; do
  cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1 || { echo "==> rustup component add $c"; rustup component add "$c" >/dev/null; }
done

# `make lint` also checks the workspace with the oldest Rust it declares.
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  echo "==> rustup toolchain install $msrv (rust-version)"; rustup toolchain install "$msrv" --profile minimal >/dev/null
fi

# The fuzzers (fuzz/, `make fuzz` and a short run in `make test`) build
# with nightly Rust and cargo-fuzz.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "==> rustup toolchain install nightly"; rustup toolchain install nightly --profile minimal >/dev/null
fi
command -v cargo-fuzz >/dev/null 2>&1 || { echo "==> cargo install cargo-fuzz"; cargo install -q --locked cargo-fuzz; }

echo "==> building the Rust workspace (release)"
cargo build --release --quiet
echo "==> building the C runtime"
make -s -C runtimes/c
# The Python runtime's hot path in C, for the python3 the engine runs
# (runtimes/python/staccato/_fast.c); without it the runtime is pure Python.
py_ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
py_inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
py_fast=runtimes/python/staccato/_fast$py_ext
if [ ! -f "$py_inc/Python.h" ]; then
  echo "warning: no Python.h in $py_inc (the headers of $(python3 -V 2>&1)): staccato._fast not built;" \
       "Python functions use the pure-Python runtime, and make test fails (it expects the module)"
elif [ runtimes/python/staccato/_fast.c -nt "$py_fast" ]; then
  echo "==> building the Python runtime's hot path (staccato._fast)"
  # Built to a new name and renamed: launchers running map the old file.
  cc -O2 -g -std=c11 -Wall -Wextra -Wno-missing-field-initializers -shared -fPIC -I"$py_inc" \
     -o "$py_fast.new" runtimes/python/staccato/_fast.c && mv -f "$py_fast.new" "$py_fast" \
    || { rm -f "$py_fast" "$py_fast.new"; echo "warning: staccato._fast not built (above); Python functions use the pure-Python runtime"; }
fi
mkdir -p runtimes/container/build
if [ runtimes/container/init.c -nt runtimes/container/build/staccato-init ]; then
  cc -O2 -Wall -Wextra -static -o runtimes/container/build/staccato-init runtimes/container/init.c
fi
echo "==> ready: target/release/staccato"
