package staccato_test

import (
	"os"
	"sort"
	"testing"
	"time"

	"staccato.local/go/internal/fakeengine"
)

// How late a handler's 1 ms timer fires per I/O mode (the worker's reader
// waits while the handler sleeps). Skipped unless STACCATO_BENCH=1.
func TestTimerLatency(t *testing.T) {
	if os.Getenv("STACCATO_BENCH") != "1" {
		t.Skip("set STACCATO_BENCH=1")
	}
	for _, env := range [][]string{
		{"STACCATO_GO_IO=poll", "STACCATO_SPIN_US=0"},
		{"STACCATO_GO_IO=block", "STACCATO_SPIN_US=30"},
		{"STACCATO_GO_IO=block", "STACCATO_SPIN_US=0"},
	} {
		l := startLauncher(t, append(env, "GOMAXPROCS=")...)
		l.Hello()
		w := l.CreateWorker()
		var lat []time.Duration
		for i := 0; i < 40; i++ {
			t0 := time.Now()
			l.Call(w, fakeengine.Gateway|uint64(i+1), []byte("sleep 1"))
			lat = append(lat, time.Since(t0))
			time.Sleep(time.Duration(i%5) * 20 * time.Millisecond) // idle gaps: sysmon backs off
		}
		sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
		t.Logf("%v: sleep(1ms) round trip p50 %v p90 %v p99 %v max %v", env, lat[20], lat[36], lat[39], lat[39])
	}
}
