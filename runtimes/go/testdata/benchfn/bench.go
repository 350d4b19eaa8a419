// Package benchfn is a Go function for runtimes/c/tests/bench_engine.c, the
// C runtime's minimal engine that measures internal-call latency with
// everything pinned to one CPU:
//
//	runtimes/go/build-function.sh runtimes/go/testdata/benchfn Bench /tmp/go-bench
//	runtimes/c/build/bench_engine /tmp/go-bench /dev/null 20000 0
//
// "!bench:N:NAME" makes N calls to NAME with empty input, timed one by one,
// and returns "calls=N p50_ns=.. p90_ns=.. p99_ns=.. max_ns=.." like
// runtimes/c/tests/test_handler.c; anything else is echoed.
package benchfn

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"time"

	"staccato.local/go/staccato"
)

func Bench(ctx *staccato.Context, in []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(in, []byte("!bench:"))
	if !ok {
		return in, nil
	}
	nStr, name, _ := bytes.Cut(rest, []byte(":"))
	n, err := strconv.Atoi(string(nStr))
	if err != nil || n < 1 || len(name) == 0 {
		return nil, fmt.Errorf("usage: !bench:N:NAME")
	}
	lat := make([]int64, n)
	callee := string(name)
	for i := range lat {
		t0 := time.Now()
		if _, err := ctx.Call(callee, nil); err != nil {
			return nil, fmt.Errorf("call %d: %w", i, err)
		}
		lat[i] = int64(time.Since(t0))
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	return []byte(fmt.Sprintf("calls=%d p50_ns=%d p90_ns=%d p99_ns=%d max_ns=%d",
		n, lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])), nil
}
