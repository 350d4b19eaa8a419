#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 15), starting
# from fuzz/seeds/<target> and a scratch corpus (the repository is not
# written). A crash stops the run, leaves its input in
# fuzz/artifacts/<target>/ and fails. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$HOME/.cargo/bin"
seconds=${1:-15}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
echo "==> building ${#targets[@]} fuzz targets (nightly, AddressSanitizer)"
cargo +nightly fuzz build 2>&1 | grep -E "^(error|warning)" || true
cargo +nightly fuzz build >/dev/null 2>&1 || { cargo +nightly fuzz build; exit 1; }
scratch=$(mktemp -d /tmp/staccato-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  seeds=fuzz/seeds/$t
  [ -d "$seeds" ] || seeds=
  printf '==> %-16s %ss: ' "$t" "$seconds"
  if ! cargo +nightly fuzz run "$t" "$scratch/$t" $seeds -- -max_total_time="$seconds" -rss_limit_mb=2048 \
      >"$scratch/$t.log" 2>&1; then
    echo "FAILED"
    grep -E "panicked|ERROR|SUMMARY|Test unit written|artifact_prefix" "$scratch/$t.log" | head -20
    exit 1
  fi
  grep -Eo "Done [0-9]+ runs" "$scratch/$t.log" | tail -1
done
