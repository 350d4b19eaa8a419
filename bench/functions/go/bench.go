package bench

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"staccato.local/go/staccato"
)

func Nop(ctx *staccato.Context, in []byte) ([]byte, error) { return nil, nil }

// Caller takes "<n>:<function>": n sequential internal calls, each timed;
// returns the latencies as n little-endian u32 nanoseconds.
func Caller(ctx *staccato.Context, in []byte) ([]byte, error) {
	nText, target, ok := strings.Cut(string(in), ":")
	if !ok {
		return nil, fmt.Errorf("input must be <n>:<function>")
	}
	n, err := strconv.Atoi(nText)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("bad n %q", nText)
	}
	out := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := ctx.Call(target, nil); err != nil {
			return nil, err
		}
		binary.LittleEndian.PutUint32(out[4*i:], uint32(time.Since(t0).Nanoseconds()))
	}
	return out, nil
}
