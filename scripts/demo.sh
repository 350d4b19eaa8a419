#!/usr/bin/env bash
# The demo: start Staccato on loopback in the background, deploy the example
# functions, call them, and show what happened. Leaves Staccato running.
set -euo pipefail
cd "$(dirname "$0")/.."
B=target/release/staccato
export STACCATO_GATEWAY=${STACCATO_GATEWAY:-http://127.0.0.1:8080}
addr=${STACCATO_GATEWAY#http://}

if curl -sf "$STACCATO_GATEWAY/healthz" >/dev/null 2>&1; then
  echo "==> Staccato is already running at $STACCATO_GATEWAY"
else
  echo "==> staccato up --detach --listen $addr"
  $B up --detach --listen "$addr"
fi
echo "==> staccato deploy examples/hello"
$B deploy examples/hello
echo
echo "==> staccato invoke hello --data world"
$B invoke hello --data world -v
echo
echo "==> curl -d Staccato $STACCATO_GATEWAY/function/greet   (Python -> Python -> C, internal calls)"
curl -s -i -d Staccato "$STACCATO_GATEWAY/function/greet" | grep -iE '^(HTTP|x-call-id|x-staccato-timing)|^[A-Z]' || true
echo
echo "==> staccato deploy examples/polyglot   (Python, Go, Node.js, C++)"
$B deploy examples/polyglot
echo "==> staccato invoke poly-python --data x   (Python -> Go -> Node.js -> C++ and back)"
$B invoke poly-python --data x -v
echo
echo "==> an error: curl -d x $STACCATO_GATEWAY/function/nope"
curl -s -w '  (HTTP %{http_code})\n' -d x "$STACCATO_GATEWAY/function/nope"
echo
echo "==> staccato ls"
$B ls
echo
echo "==> staccato trace --limit 5"
$B trace --limit 5
echo
echo "Staccato keeps running. Try: $B invoke greet --data you;  stop it with: $B down"
