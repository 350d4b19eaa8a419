# Shared by the bench shell scripts: source it (`. bench/lib.sh`).

# A free loopback port.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for the `staccato up` with PID, listening on PORT with
# state directory STATE, to have written its token and to answer /healthz;
# if it does not, prints the tail of LOG and exits the script.
wait_up() {
  local port=$1 pid=$2 state=$3 log=$4
  for _ in $(seq 100); do
    [ -s "$state/token" ] && curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "staccato up (pid $pid, port $port) did not start; its log:" >&2
  tail -20 "$log" >&2
  exit 1
}
