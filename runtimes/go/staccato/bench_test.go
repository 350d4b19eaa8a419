package staccato_test

// Latency of the fake-engine round trip, per I/O mode, spinning and
// GOMAXPROCS. Skipped unless STACCATO_BENCH=1:
//
//	STACCATO_BENCH=1 go test ./staccato -run Latency -v
//
// The engine side here uses blocking read(2)/write(2) on a locked OS thread
// (like runtimes/c/tests/bench_engine.c, which uses poll+read), so it adds
// little of its own. Two figures per configuration:
//
//   - external: Dispatch → Completion, measured by the engine (2 FIFO hops)
//   - internal: ctx.Call measured in the handler, the engine forwarding the
//     Invoke to a second worker as a Dispatch and the result back (4 hops,
//     the path of a real internal call)

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"staccato.local/go/wire"
)

type rawChan struct {
	id       uint32
	e2w, w2e int
	buf      [wire.MessageLen]byte
	spinNs   int64 // the engine's own spin before ppoll (engine_spin_us)
}

// engineSpinNs is STACCATO_BENCH_ENGINE_SPIN_US (default 30, the real
// engine's default engine_spin_us).
func engineSpinNs() int64 {
	us := int64(30)
	if v := os.Getenv("STACCATO_BENCH_ENGINE_SPIN_US"); v != "" {
		us, _ = strconv.ParseInt(v, 10, 64)
	}
	return us * 1000
}

func newRawChan(t *testing.T, dir string, id uint32) *rawChan {
	base := filepath.Join(dir, strconv.Itoa(int(id)))
	for _, s := range []string{".e2w", ".w2e"} {
		if err := syscall.Mkfifo(base+s, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e2w, err := syscall.Open(base+".e2w", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	w2e, err := syscall.Open(base+".w2e", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(e2w); syscall.Close(w2e) })
	return &rawChan{id: id, e2w: e2w, w2e: w2e, spinNs: engineSpinNs()}
}

func (c *rawChan) send(t *testing.T, h wire.Header, inline ...[]byte) {
	if h.Kind != wire.CreateWorker {
		h.WorkerID = c.id
	}
	var buf [wire.MessageLen]byte
	if err := wire.Encode(buf[:], &h, inline...); err != nil {
		t.Fatal(err)
	}
	if n, err := syscall.Write(c.e2w, buf[:]); n != len(buf) || err != nil {
		t.Fatal(n, err)
	}
}

// recv: non-blocking read, yield-spinning up to spinNs, then ppoll (with a
// timeout), like the engine's I/O threads.
func (c *rawChan) recv(t *testing.T) wire.Message {
	spinUntil := time.Now().Add(time.Duration(c.spinNs))
	for {
		n, err := syscall.Read(c.w2e, c.buf[:])
		if err == syscall.EAGAIN && time.Now().Before(spinUntil) {
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		if n == wire.MessageLen {
			m, err := wire.Decode(c.buf[:])
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		if err != syscall.EAGAIN && err != syscall.EINTR && !(n == 0 && err == nil) {
			t.Fatalf("read: %d %v", n, err)
		}
		// n == 0: nobody has the FIFO open for writing yet; wait.
		fds := []pollfd{{fd: int32(c.w2e), events: 1}}
		ts := syscall.NsecToTimespec(int64(10 * time.Second))
		r, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e != 0 && e != syscall.EINTR {
			t.Fatal(e)
		}
		if r == 0 {
			t.Fatal("timed out")
		}
		if n == 0 && err == nil && fds[0].revents&1 == 0 {
			time.Sleep(time.Millisecond) // hung up without data: not open yet
		}
	}
}

type pollfd struct {
	fd      int32
	events  int16
	revents int16
}

func percentiles(lat []time.Duration) string {
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	n := len(lat)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return fmt.Sprintf("p50 %6.1f  p90 %6.1f  p99 %6.1f", us(lat[n/2]), us(lat[n*9/10]), us(lat[n*99/100]))
}

func TestLatency(t *testing.T) {
	if os.Getenv("STACCATO_BENCH") != "1" {
		t.Skip("set STACCATO_BENCH=1")
	}
	calls := 20000
	if v := os.Getenv("STACCATO_BENCH_CALLS"); v != "" {
		calls, _ = strconv.Atoi(v)
	}
	modes := []string{"poll", "block"}
	spins := []string{"0", "30"}
	procs := []string{"", "2"}
	if v := os.Getenv("STACCATO_BENCH_MODES"); v != "" {
		modes = strings.Split(v, ",")
	}
	if v := os.Getenv("STACCATO_BENCH_SPINS"); v != "" {
		spins = strings.Split(v, ",")
	}
	if v := os.Getenv("STACCATO_BENCH_PROCS"); v != "" {
		procs = strings.Split(v, ",")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t.Logf("engine spin %d us, %d calls per figure, µs", engineSpinNs()/1000, calls)
	exe, _ := os.Executable()
	rounds := 2
	for round := 0; round < rounds; round++ {
		for _, mode := range modes {
			for _, spin := range spins {
				for _, p := range procs {
					ext, in := benchOnce(t, exe, mode, spin, p, calls)
					pl := p
					if pl == "" {
						pl = "auto"
					}
					t.Logf("io=%-5s spin_us=%-2s gomaxprocs=%-4s | external %s | internal %s",
						mode, spin, pl, ext, in)
				}
			}
		}
	}
}

func benchOnce(t *testing.T, exe, mode, spin, procs string, calls int) (string, string) {
	dir := filepath.Join(t.TempDir(), "ipc")
	os.MkdirAll(filepath.Join(dir, "shm"), 0o700)
	ch0 := newRawChan(t, dir, 0)
	w1 := newRawChan(t, dir, 1)
	w2 := newRawChan(t, dir, 2)
	attr := &os.ProcAttr{
		Env: append(os.Environ(), "STACCATO_TEST_LAUNCHER=1", "STACCATO_FUNCTION=bench",
			"STACCATO_IPC_DIR="+dir, "STACCATO_GO_IO="+mode, "STACCATO_SPIN_US="+spin,
			"STACCATO_GOMAXPROCS="+procs, "GOMAXPROCS="),
		Files: []*os.File{nil, os.Stderr, os.Stderr},
	}
	proc, err := os.StartProcess(exe, []string{exe}, attr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { proc.Kill(); proc.Wait() }()
	ch0.recv(t)
	ch0.send(t, wire.Header{Kind: wire.CreateWorker, WorkerID: 1})
	w1.recv(t)
	ch0.send(t, wire.Header{Kind: wire.CreateWorker, WorkerID: 2})
	w2.recv(t)

	// external: Dispatch "echo " → Completion, engine-measured.
	lat := make([]time.Duration, calls)
	in := []byte("echo ")
	for i := range lat {
		id := uint64(1)<<63 | uint64(i+1)
		t0 := time.Now()
		w1.send(t, wire.Header{Kind: wire.Dispatch, CallID: id, PayloadLen: uint32(len(in))}, in)
		m := w1.recv(t)
		lat[i] = time.Since(t0)
		if m.Kind != wire.Completion || m.CallID != id {
			t.Fatalf("%+v", m.Header)
		}
	}
	external := percentiles(lat)

	// internal: the handler calls "nop" calls times; forward to worker 2.
	cmd := []byte("bench " + strconv.Itoa(calls) + " nop")
	w1.send(t, wire.Header{Kind: wire.Dispatch, CallID: 1<<63 | 1<<40, PayloadLen: uint32(len(cmd))}, cmd)
	for {
		m := w1.recv(t)
		if m.Kind != wire.Invoke {
			if m.Kind != wire.Completion {
				t.Fatalf("bench failed: %+v %q", m.Header, m.Inline)
			}
			return external, internalSummary(string(m.Inline))
		}
		w2.send(t, wire.Header{Kind: wire.Dispatch, CallID: m.CallID, ParentCallID: m.ParentCallID})
		r := w2.recv(t) // the unknown command fails: fine, any answer will do
		w1.send(t, wire.Header{Kind: wire.Completion, CallID: r.CallID})
	}
}

func internalSummary(s string) string {
	f := map[string]float64{}
	for _, kv := range strings.Fields(s) {
		k, v, _ := strings.Cut(kv, "=")
		x, _ := strconv.ParseFloat(v, 64)
		f[k] = x
	}
	return fmt.Sprintf("p50 %6.1f  p90 %6.1f  p99 %6.1f", f["p50_ns"]/1e3, f["p90_ns"]/1e3, f["p99_ns"]/1e3)
}
