#!/usr/bin/env bash
# The cluster demo (needs root): `staccato testbed` makes five "servers" out
# of network namespaces joined by a bridge (addresses 10.210.0.x, only
# inside them): two gateways sharing etcd, three engines running functions
# in runc containers, and a client host. It deploys the examples through one
# gateway, calls them through the other, places a function on one server and
# calls it from another, pulls a server's cable, and tears it all down.
#   make demo-cluster        (KEEP=1 leaves the testbed up: `staccato testbed down` removes it)
set -euo pipefail
cd "$(dirname "$0")/.."
B=$PWD/target/release/staccato
P=demo
run() { echo; echo "\$ $*"; "$@"; }
on_client() { echo; echo "[client host] \$ staccato $*"; $B testbed exec --prefix $P -- "$B" "$@"; }
on_client_b() {
  echo; echo "[client host, gateway gw1] \$ staccato $*"
  $B testbed exec --prefix $P -- env STACCATO_GATEWAY=http://10.210.0.2:8080 "$B" "$@"
}
[ "${KEEP:-}" = 1 ] || trap '$B testbed down --prefix $P' EXIT

run $B testbed up --prefix $P --gateways 2 --engines 3
on_client engines
on_client deploy examples/hello
on_client_b invoke greet --data cluster -v
cat > /tmp/staccato-demo-placed.yml <<YML
functions:
  upper-on-engine2:
    runtime: c
    source: $PWD/examples/hello
    handler: upper.c
    placement: {labels: {host: engine2}}
YML
on_client deploy /tmp/staccato-demo-placed.yml
on_client invoke upper-on-engine2 --data "placed on one server" -v
on_client ls
run $B testbed link --prefix $P engine0 down
sleep 1.5
for i in 1 2 3; do on_client invoke hello --data "engine0 is cut off" -v; done
run $B testbed link --prefix $P engine0 up
sleep 3
on_client engines
