#!/usr/bin/env bash
# FaaSProfiler-style runtime monitoring script, started at test start.
# Samples the aggregate CPU line of /proc/stat (jiffies: user nice system idle
# iowait irq softirq steal) and the context-switch count once per second into
# ./monitoring.log, for at most the test duration + 5 s, then exits.
#
#   MonitoringScript.sh [DURATION_S]   (default: $STACCATO_TEST_DURATION_S, else 60)
set -u
dur="${1:-${STACCATO_TEST_DURATION_S:-60}}"
dur="${dur%.*}"
case "$dur" in ''|*[!0-9]*) dur=60 ;; esac
limit=$((dur + 5))
log="monitoring.log"
echo "# duration_s $dur" >"$log"
echo "# unix_s cpu user nice system idle iowait irq softirq steal ctxt" >>"$log"
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt "$limit" ]; do
    cpu=$(grep -m1 '^cpu ' /proc/stat)
    ctxt=$(awk '/^ctxt /{print $2}' /proc/stat)
    echo "$(date +%s.%N) ${cpu} ${ctxt}" >>"$log"
    sleep 1
done
