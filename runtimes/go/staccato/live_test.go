package staccato_test

// Live tests: the test binary re-executes itself as a launcher
// (STACCATO_TEST_LAUNCHER=1 → staccato.Serve(testHandler)) and the tests play
// the engine with real FIFOs and shm files (internal/fakeengine). Every wait
// has a timeout.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"staccato.local/go/internal/fakeengine"
	"staccato.local/go/staccato"
	"staccato.local/go/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv("STACCATO_TEST_LAUNCHER") == "1" {
		staccato.Serve(testHandler)
	}
	os.Exit(m.Run())
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}

func testHandler(ctx *staccato.Context, in []byte) ([]byte, error) {
	cmd, arg, _ := bytes.Cut(in, []byte(" "))
	switch string(cmd) {
	case "echo":
		return arg, nil
	case "big":
		n, _ := strconv.Atoi(string(arg))
		return pattern(n), nil
	case "fail":
		return nil, errors.New(string(arg))
	case "longfail":
		return nil, errors.New(strings.Repeat("é", 1000)) // 2000 bytes
	case "emptyerr":
		return nil, errors.New("")
	case "panic":
		panic("boom")
	case "goexit":
		runtime.Goexit()
	case "ctx":
		d, ok := ctx.Deadline()
		return json.Marshal(map[string]any{
			"call_id": strconv.FormatUint(ctx.CallID(), 10), "parent": strconv.FormatUint(ctx.ParentCallID(), 10),
			"has_deadline": ok, "deadline_us": d.UnixMicro(), "remaining_ns": ctx.Remaining().Nanoseconds(),
			"function": ctx.Function(), "worker": ctx.WorkerID(), "raw_deadline": strconv.FormatUint(ctx.DeadlineUs(), 10),
			"trace_id": ctx.TraceID(), "traceparent": ctx.Traceparent(), "tracestate": ctx.Tracestate(),
			"input": len(arg),
		})
	case "gocontext":
		gctx := ctx.GoContext()
		d, ok := gctx.Deadline()
		return []byte(fmt.Sprintf("%v %d %v", ok, d.UnixMicro(), gctx.Err())), nil
	case "procs":
		return []byte(strconv.Itoa(runtime.GOMAXPROCS(0))), nil
	case "call":
		name, payload, _ := bytes.Cut(arg, []byte(" "))
		out, err := ctx.Call(string(name), payload)
		var ce *staccato.CallError
		if errors.As(err, &ce) {
			return []byte("err:" + ce.Kind + "|" + ce.Message), nil
		}
		if err != nil {
			return nil, err
		}
		return append([]byte("got:"), out...), nil
	case "callbig":
		n, _ := strconv.Atoi(string(arg))
		out, err := ctx.Call("big", pattern(n))
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(out, pattern(len(out))) {
			return nil, errors.New("callbig: corrupt output")
		}
		return []byte(strconv.Itoa(len(out))), nil
	case "fanout":
		n, _ := strconv.Atoi(string(arg))
		outs := make([][]byte, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				outs[i], errs[i] = ctx.Call("f"+strconv.Itoa(i), []byte(strconv.Itoa(i)))
			}(i)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		return bytes.Join(outs, []byte(",")), nil
	case "uncaught":
		_, err := ctx.Call("nope", nil)
		return nil, err
	case "badname":
		_, err := ctx.Call(strings.Repeat("n", 65), nil)
		return []byte(err.Error()), nil
	case "pending":
		// arg: a file to record what happened to a call cut off by close
		_, err := ctx.Call("slow", nil)
		result := "completed"
		var ce *staccato.CallError
		if errors.As(err, &ce) {
			result = ce.Kind
		}
		return nil, os.WriteFile(string(arg), []byte(result), 0o600)
	case "log":
		ctx.Logf("log line %s\n", arg)
		return []byte("ok"), nil
	case "sleep":
		ms, _ := strconv.Atoi(string(arg))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return []byte("slept"), nil
	case "bench":
		// bench N NAME: N sequential calls to NAME, handler-measured
		// latency percentiles (as runtimes/c/tests/test_handler.c).
		nStr, name, _ := bytes.Cut(arg, []byte(" "))
		n, _ := strconv.Atoi(string(nStr))
		lat := make([]int64, n)
		for i := range lat {
			t0 := time.Now()
			if _, err := ctx.Call(string(name), nil); err != nil {
				return nil, err
			}
			lat[i] = int64(time.Since(t0))
		}
		sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
		return []byte(fmt.Sprintf("calls=%d p50_ns=%d p90_ns=%d p99_ns=%d max_ns=%d",
			n, lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])), nil
	}
	return nil, fmt.Errorf("unknown command %q", cmd)
}

func startLauncher(t *testing.T, env ...string) *fakeengine.Launcher {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env = append([]string{"STACCATO_TEST_LAUNCHER=1"}, env...)
	return fakeengine.Start(t, "fn", []string{exe}, t.TempDir(), env...)
}

var gwSeq uint64

func gw() uint64 {
	gwSeq++
	return fakeengine.Gateway | gwSeq
}

func newWorker(t *testing.T) (*fakeengine.Launcher, *fakeengine.Chan) {
	t.Helper()
	l := startLauncher(t)
	l.Hello()
	return l, l.CreateWorker()
}

func expectCompletion(t *testing.T, l *fakeengine.Launcher, m wire.Message) []byte {
	t.Helper()
	if m.Kind != wire.Completion {
		t.Fatalf("expected Completion, got %v kind %d %q", m.Kind, m.ErrorKind, m.Inline)
	}
	return l.Payload(&m, 'o')
}

func TestHandshakes(t *testing.T) {
	l := startLauncher(t)
	hello := l.Hello()
	if hello.SendTsNs == 0 {
		t.Error("LauncherHello without send_ts_ns")
	}
	a, b := l.CreateWorker(), l.CreateWorker()
	if a.ID != 1 || b.ID != 2 {
		t.Fatal(a.ID, b.ID)
	}
	// Both workers live in the launcher process (their hellos carry its pid).
	m := l.Call(b, gw(), []byte("echo two"))
	if string(expectCompletion(t, l, m)) != "two" {
		t.Fatal("echo on worker 2")
	}
}

func TestEchoSizes(t *testing.T) {
	l, w := newWorker(t)
	for _, n := range []int{0, 1, 960, 961, 1 << 20, 6<<20 - 5} {
		data := pattern(n)
		in := append([]byte("echo "), data...)
		id := gw()
		m := l.Call(w, id, in)
		if m.Kind != wire.Completion || m.PayloadLen != uint32(n) {
			t.Fatalf("%d bytes: %+v", n, m.Header)
		}
		if m.InShm() != (n > wire.InlineMax) {
			t.Fatalf("%d bytes: in shm = %v", n, m.InShm())
		}
		if _, err := os.Stat(l.ShmPath(id, 'i')); !os.IsNotExist(err) {
			t.Fatalf("%d bytes: input file not unlinked (%v)", n, err)
		}
		if got := l.Payload(&m, 'o'); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: wrong output (%d bytes)", n, len(got))
		}
		if files := l.ShmFiles(); len(files) != 0 {
			t.Fatalf("%d bytes: shm files left: %v", n, files)
		}
	}
}

func TestSerialCallsOnOneWorker(t *testing.T) {
	l, w := newWorker(t)
	for i := 0; i < 200; i++ {
		m := l.Call(w, gw(), []byte("echo "+strconv.Itoa(i)))
		if string(m.Inline) != strconv.Itoa(i) {
			t.Fatalf("call %d: %q", i, m.Inline)
		}
	}
}

func TestErrors(t *testing.T) {
	l, w := newWorker(t)
	check := func(cmd string, want func(string) bool) {
		t.Helper()
		m := l.Call(w, gw(), []byte(cmd))
		if m.Kind != wire.Failure || m.ErrorKind != wire.FunctionError || m.InShm() || !want(string(m.Inline)) {
			t.Errorf("%s: %v kind %d %q", cmd, m.Kind, m.ErrorKind, m.Inline)
		}
	}
	check("fail went wrong", func(s string) bool { return s == "went wrong" })
	check("panic", func(s string) bool { return s == "panic: boom" })
	check("goexit", func(s string) bool { return strings.Contains(s, "Goexit") })
	check("emptyerr", func(s string) bool { return strings.Contains(s, "empty message") })
	check("longfail", func(s string) bool {
		return len(s) <= wire.InlineMax && strings.HasSuffix(s, "...") && strings.HasPrefix(s, "éé") &&
			!strings.ContainsRune(s, '\uFFFD') && len(s) > 900
	})
	// The stack of the panic is in the function's log, prefixed.
	if log := l.Stderr(); !strings.Contains(log, "panic: boom") || !strings.Contains(log, "goroutine") ||
		!strings.Contains(log, "[fn 8") {
		t.Errorf("panic not logged with its stack:\n%s", log)
	}
	// The worker survives all of that.
	if m := l.Call(w, gw(), []byte("echo ok")); string(m.Inline) != "ok" {
		t.Fatal("worker did not survive")
	}
}

func TestOutputOverPayloadMax(t *testing.T) {
	l := startLauncher(t, "STACCATO_PAYLOAD_MAX=4096")
	l.Hello()
	w := l.CreateWorker()
	m := l.Call(w, gw(), []byte("big 4097"))
	if m.Kind != wire.Failure || m.ErrorKind != wire.OutputTooLarge {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	if files := l.ShmFiles(); len(files) != 0 {
		t.Fatalf("shm files left: %v", files)
	}
	m = l.Call(w, gw(), []byte("big 4096"))
	if m.Kind != wire.Completion || m.PayloadLen != 4096 {
		t.Fatalf("%+v", m.Header)
	}
	l.Payload(&m, 'o')
	// Call's input above the maximum is refused locally.
	m = l.Call(w, gw(), []byte("callbig 5000"))
	if m.Kind != wire.Failure || !strings.Contains(string(m.Inline), "payload_too_large") {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
}

func TestContextFields(t *testing.T) {
	l, w := newWorker(t)
	id := uint64(w.ID)<<32 | 77 // an internal call dispatched to us
	parent := fakeengine.Gateway | 5
	deadline := uint64(time.Now().Add(30 * time.Second).UnixMicro())
	l.Dispatch(w, id, parent, deadline, []byte("ctx"))
	m := l.Recv(w)
	var raw map[string]any
	if err := json.Unmarshal(expectCompletion(t, l, m), &raw); err != nil {
		t.Fatal(err)
	}
	rem, _ := raw["remaining_ns"].(float64)
	if raw["call_id"] != strconv.FormatUint(id, 10) || raw["parent"] != strconv.FormatUint(parent, 10) ||
		raw["has_deadline"] != true || raw["deadline_us"] != float64(deadline) ||
		raw["raw_deadline"] != strconv.FormatUint(deadline, 10) ||
		rem <= 0 || rem > float64(30*time.Second) || raw["function"] != "fn" || raw["worker"] != float64(w.ID) {
		t.Fatalf("%s", m.Inline)
	}
	// No deadline: Deadline() false, Remaining() 0, parent 0.
	m = l.Call(w, gw(), []byte("ctx"))
	json.Unmarshal(m.Inline, &raw)
	if raw["has_deadline"] != false || raw["remaining_ns"] != 0.0 || raw["parent"] != "0" {
		t.Fatalf("%s", m.Inline)
	}
	// A deadline in the past: Remaining() is 0, never negative.
	l.Dispatch(w, gw(), 0, uint64(time.Now().Add(-time.Second).UnixMicro()), []byte("ctx"))
	m = l.Recv(w)
	json.Unmarshal(m.Inline, &raw)
	if raw["has_deadline"] != true || raw["remaining_ns"] != 0.0 {
		t.Fatalf("%s", m.Inline)
	}
	// GoContext carries the deadline.
	l.Dispatch(w, gw(), 0, deadline, []byte("gocontext"))
	if m = l.Recv(w); string(m.Inline) != fmt.Sprintf("true %d <nil>", deadline) {
		t.Fatalf("%q", m.Inline)
	}
}

func TestTraceContextBeforeTheInput(t *testing.T) {
	l, w := newWorker(t)
	trace, _ := hex.DecodeString("4bf92f3577b34da6a3ce929d0e0e4736" + "00f067aa0ba902b7" + "01")
	trace = append(trace, "rojo=1,congo=2"...)
	for _, size := range []int{3, 2000} { // the input inline, then in shm
		l.DispatchTraced(w, gw(), trace, []byte("ctx "+strings.Repeat("x", size)))
		m := l.Recv(w)
		var raw map[string]any
		if err := json.Unmarshal(expectCompletion(t, l, m), &raw); err != nil {
			t.Fatal(err)
		}
		if raw["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" ||
			raw["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" ||
			raw["tracestate"] != "rojo=1,congo=2" || raw["input"] != float64(size) {
			t.Fatalf("%d: %v", size, raw)
		}
	}
	unsampled := append(append([]byte{}, trace[:24]...), 0)
	l.DispatchTraced(w, gw(), unsampled, []byte("ctx"))
	m := l.Recv(w)
	var raw map[string]any
	json.Unmarshal(m.Inline, &raw)
	if !strings.HasSuffix(raw["traceparent"].(string), "-00") || raw["tracestate"] != "" {
		t.Fatalf("%v", raw)
	}
	// Without a context: empty strings.
	m = l.Call(w, gw(), []byte("ctx"))
	json.Unmarshal(m.Inline, &raw)
	if raw["trace_id"] != "" || raw["traceparent"] != "" || raw["tracestate"] != "" {
		t.Fatalf("%v", raw)
	}
}

func TestLogf(t *testing.T) {
	l, w := newWorker(t)
	id := gw()
	l.Call(w, id, []byte("log hello world"))
	want := fmt.Sprintf("[fn %016x] log line hello world\n", id)
	deadline := time.Now().Add(fakeengine.Timeout)
	for !strings.Contains(l.Stderr(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("log line %q not in:\n%s", want, l.Stderr())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Contains(l.Stderr(), "world\n\n") {
		t.Fatal("trailing newline not dropped")
	}
}

func TestCallSendsInvokeAndReturnsCompletion(t *testing.T) {
	l, w := newWorker(t)
	id := gw()
	deadline := uint64(time.Now().Add(30 * time.Second).UnixMicro())
	l.Dispatch(w, id, 0, deadline, []byte("call x ping"))
	inv := l.Recv(w)
	if inv.Kind != wire.Invoke || inv.InShm() || string(inv.Name()) != "x" || string(l.Payload(&inv, 'i')) != "ping" {
		t.Fatalf("%+v %q", inv.Header, inv.Inline)
	}
	// call id layout: (worker_id << 32) | seq, seq from 1 per channel.
	if inv.ParentCallID != id || inv.DeadlineUs != deadline || inv.WorkerID != w.ID || inv.CallID != uint64(w.ID)<<32|1 {
		t.Fatalf("%+v", inv.Header)
	}
	l.Reply(w, inv.CallID, 0, []byte("pong"))
	if m := l.Recv(w); m.Kind != wire.Completion || m.CallID != id || string(m.Inline) != "got:pong" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	// The sequence goes on; an empty input is a name-only Invoke.
	l.Dispatch(w, gw(), 0, 0, []byte("call y "))
	inv = l.Recv(w)
	if inv.CallID != uint64(w.ID)<<32|2 || inv.PayloadLen != 1 || inv.NameLen != 1 || inv.DeadlineUs != 0 {
		t.Fatalf("%+v", inv.Header)
	}
	l.Reply(w, inv.CallID, 0, nil)
	if m := l.Recv(w); string(m.Inline) != "got:" {
		t.Fatalf("%q", m.Inline)
	}
}

func TestCallWithLargeInputAndOutputUsesShm(t *testing.T) {
	l, w := newWorker(t)
	id := gw()
	l.Dispatch(w, id, 0, 0, []byte("callbig 2000000"))
	inv := l.Recv(w)
	if inv.Kind != wire.Invoke || !inv.InShm() || inv.NameLen != 3 || string(inv.Inline) != "big" || inv.PayloadLen != 2000000 {
		t.Fatalf("%+v %q", inv.Header, inv.Inline)
	}
	if in := l.Payload(&inv, 'i'); !bytes.Equal(in, pattern(2000000)) {
		t.Fatal("wrong Invoke input")
	}
	l.Reply(w, inv.CallID, 0, pattern(3000000))
	m := l.Recv(w)
	if m.Kind != wire.Completion || string(m.Inline) != "3000000" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	if files := l.ShmFiles(); len(files) != 0 {
		t.Fatalf("shm files left: %v", files)
	}
	// An input that fits inline only without the name goes to shm: 3 + 958 > 960.
	l.Dispatch(w, gw(), 0, 0, []byte("callbig 958"))
	if inv = l.Recv(w); !inv.InShm() || inv.PayloadLen != 958 {
		t.Fatalf("%+v", inv.Header)
	}
	l.Payload(&inv, 'i')
	l.Reply(w, inv.CallID, 0, nil)
	l.Recv(w)
	l.Dispatch(w, gw(), 0, 0, []byte("callbig 957"))
	if inv = l.Recv(w); inv.InShm() || inv.PayloadLen != 960 {
		t.Fatalf("%+v", inv.Header)
	}
	l.Reply(w, inv.CallID, 0, nil)
	l.Recv(w)
}

func TestFanout16AnsweredOutOfOrder(t *testing.T) {
	l, w := newWorker(t)
	id := gw()
	l.Dispatch(w, id, 0, 0, []byte("fanout 16"))
	byName := map[string]wire.Message{}
	ids := map[uint64]bool{}
	for i := 0; i < 16; i++ {
		m := l.Recv(w)
		if m.Kind != wire.Invoke || m.ParentCallID != id || m.CallID>>32 != uint64(w.ID) {
			t.Fatalf("%+v", m.Header)
		}
		byName[string(m.Name())] = m
		ids[m.CallID] = true
	}
	if len(byName) != 16 || len(ids) != 16 {
		t.Fatalf("%d names, %d ids", len(byName), len(ids))
	}
	order := []int{5, 2, 15, 7, 0, 3, 11, 6, 1, 14, 4, 9, 13, 8, 12, 10}
	for _, i := range order {
		m := byName["f"+strconv.Itoa(i)]
		in := l.Payload(&m, 'i')
		if i == 9 {
			l.Reply(w, m.CallID, 0, append(pattern(2000), in...)) // one through shm
		} else {
			l.Reply(w, m.CallID, 0, append([]byte("r"), in...))
		}
	}
	m := l.Recv(w)
	var want []string
	for i := 0; i < 16; i++ {
		if i == 9 {
			want = append(want, string(pattern(2000))+"9")
		} else {
			want = append(want, "r"+strconv.Itoa(i))
		}
	}
	if got := string(expectCompletion(t, l, m)); m.CallID != id || got != strings.Join(want, ",") {
		t.Fatalf("%+v %.80q", m.Header, got)
	}
}

func TestFailureReplyIsCallError(t *testing.T) {
	l, w := newWorker(t)
	l.Dispatch(w, gw(), 0, 0, []byte("call nope x"))
	inv := l.Recv(w)
	l.Reply(w, inv.CallID, wire.NotFound, []byte("no function 'nope'"))
	if m := l.Recv(w); string(m.Inline) != "err:not_found|no function 'nope'" {
		t.Fatalf("%q", m.Inline)
	}
	// A failure message in shm.
	l.Dispatch(w, gw(), 0, 0, []byte("call slow x"))
	inv = l.Recv(w)
	l.Reply(w, inv.CallID, wire.Timeout, pattern(5000))
	if m := l.Recv(w); !bytes.Equal(l.Payload(&m, 'o'), append([]byte("err:timeout|"), pattern(5000)...)) {
		t.Fatalf("%+v", m.Header)
	}
	// A CallError the handler returns is a function_error naming the kind.
	id := gw()
	l.Dispatch(w, id, 0, 0, []byte("uncaught"))
	inv = l.Recv(w)
	l.Reply(w, inv.CallID, wire.Timeout, []byte("too slow"))
	m := l.Recv(w)
	if m.Kind != wire.Failure || m.CallID != id || m.ErrorKind != wire.FunctionError || string(m.Inline) != "timeout: too slow" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	if files := l.ShmFiles(); len(files) != 0 {
		t.Fatalf("shm files left: %v", files)
	}
}

func TestCallErrorsDetectedLocally(t *testing.T) {
	l, w := newWorker(t)
	if m := l.Call(w, gw(), []byte("badname")); !strings.HasPrefix(string(m.Inline), "bad_request: ") {
		t.Fatalf("%q", m.Inline)
	}
	// Deadline already passed: nothing is sent, timeout.
	l.Dispatch(w, gw(), 0, uint64(time.Now().Add(-time.Millisecond).UnixMicro()), []byte("call x y"))
	if m := l.Recv(w); m.Kind != wire.Completion || !strings.HasPrefix(string(m.Inline), "err:timeout|") {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
}

func TestLateReplyIsDropped(t *testing.T) {
	l, w := newWorker(t)
	stray := uint64(w.ID)<<32 | 999
	l.Reply(w, stray, 0, pattern(5000)) // in shm
	l.Reply(w, stray+1, wire.Timeout, []byte("late"))
	if m := l.Call(w, gw(), []byte("echo still")); string(m.Inline) != "still" {
		t.Fatalf("%q", m.Inline)
	}
	if files := l.ShmFiles(); len(files) != 0 {
		t.Fatalf("stray payload file not consumed: %v", files)
	}
}

func TestInvalidMessagesAreDropped(t *testing.T) {
	l, w := newWorker(t)
	bad := make([]byte, wire.MessageLen)
	bad[0] = 9 // unknown kind
	if err := w.SendRaw(bad); err != nil {
		t.Fatal(err)
	}
	l.Ch0.SendRaw(bad)
	// Kinds a worker channel must not carry are ignored too.
	w.Send(wire.Header{Kind: wire.CreateWorker, WorkerID: 5})
	if m := l.Call(w, gw(), []byte("echo fine")); string(m.Inline) != "fine" {
		t.Fatalf("%q", m.Inline)
	}
	if log := l.Stderr(); !strings.Contains(log, "dropping invalid message") {
		t.Fatalf("not logged:\n%s", log)
	}
}

func TestStopWorkerClosesChannel(t *testing.T) {
	l, w := newWorker(t)
	w.Send(wire.Header{Kind: wire.StopWorker})
	if err := w.ExpectEOF(fakeengine.Timeout); err != nil {
		t.Fatal(err)
	}
	if l.Exited() {
		t.Fatal("launcher exited")
	}
	other := l.CreateWorker()
	if m := l.Call(other, gw(), []byte("echo alive")); string(m.Inline) != "alive" {
		t.Fatal("other worker")
	}
}

func TestStopWorkerWhileBusyFinishesFirst(t *testing.T) {
	l, w := newWorker(t)
	id := gw()
	l.Dispatch(w, id, 0, 0, []byte("sleep 200"))
	time.Sleep(20 * time.Millisecond)
	w.Send(wire.Header{Kind: wire.StopWorker})
	if m := l.Recv(w); m.CallID != id || string(m.Inline) != "slept" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	if err := w.ExpectEOF(fakeengine.Timeout); err != nil {
		t.Fatal(err)
	}
}

func TestEOFOnWorkerChannelFailsPendingCalls(t *testing.T) {
	l, w := newWorker(t)
	record := t.TempDir() + "/pending"
	l.Dispatch(w, gw(), 0, 0, []byte("pending "+record))
	if inv := l.Recv(w); inv.Kind != wire.Invoke {
		t.Fatalf("%+v", inv.Header)
	}
	w.CloseE2W() // the engine drops its end of e2w
	if err := w.ExpectEOF(fakeengine.Timeout); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(fakeengine.Timeout)
	for {
		b, _ := os.ReadFile(record)
		if string(b) == "engine_unavailable" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending call not failed: %q", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	other := l.CreateWorker()
	if m := l.Call(other, gw(), []byte("echo alive")); string(m.Inline) != "alive" {
		t.Fatal("other worker")
	}
}

func TestSeveralWorkersInOneProcess(t *testing.T) {
	l := startLauncher(t)
	l.Hello()
	a, b := l.CreateWorker(), l.CreateWorker()
	ca, cb := gw(), gw()
	l.Dispatch(a, ca, 0, 0, []byte("call sa 1"))
	l.Dispatch(b, cb, 0, 0, []byte("call sb 2"))
	ia, ib := l.Recv(a), l.Recv(b)
	if ia.CallID != uint64(a.ID)<<32|1 || ib.CallID != uint64(b.ID)<<32|1 {
		t.Fatalf("%x %x", ia.CallID, ib.CallID)
	}
	l.Reply(b, ib.CallID, 0, []byte("B"))
	l.Reply(a, ia.CallID, 0, []byte("A"))
	if string(l.Recv(b).Inline) != "got:B" || string(l.Recv(a).Inline) != "got:A" {
		t.Fatal("replies crossed")
	}
}

func TestEOFOnChannel0Exits(t *testing.T) {
	l, w := newWorker(t)
	l.Call(w, gw(), []byte("echo x"))
	l.Ch0.CloseE2W()
	code, err := l.Wait(fakeengine.Timeout)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	if err := l.Ch0.ExpectEOF(fakeengine.Timeout); err != nil {
		t.Fatal(err)
	}
	if err := w.ExpectEOF(fakeengine.Timeout); err != nil {
		t.Fatal(err)
	}
}

func TestStartupErrors(t *testing.T) {
	exe, _ := os.Executable()
	for _, tc := range []struct{ env, want string }{
		{"STACCATO_IPC_DIR=", "STACCATO_IPC_DIR is not set"},
		{"STACCATO_PAYLOAD_MAX=lots", "STACCATO_PAYLOAD_MAX"},
		{"STACCATO_GOMAXPROCS=0", "STACCATO_GOMAXPROCS"},
		{"STACCATO_GO_IO=fast", "STACCATO_GO_IO"},
	} {
		l := fakeengine.Start(t, "fn", []string{exe}, t.TempDir(), "STACCATO_TEST_LAUNCHER=1", tc.env)
		code, err := l.Wait(fakeengine.Timeout)
		if err != nil || code != 1 || !strings.Contains(l.Stderr(), tc.want) {
			t.Errorf("%s: exit %d %v, log %q", tc.env, code, err, l.Stderr())
		}
	}
}

func TestGOMAXPROCSFollowsWorkers(t *testing.T) {
	l := startLauncher(t, "GOMAXPROCS=") // Go's own variable would fix it
	l.Hello()
	w := l.CreateWorker()
	if m := l.Call(w, gw(), []byte("procs")); string(m.Inline) != "1" {
		t.Fatalf("1 worker: GOMAXPROCS %s", m.Inline)
	}
	var ws []*fakeengine.Chan
	for i := 0; i < 8; i++ {
		ws = append(ws, l.CreateWorker())
	}
	want := strconv.Itoa(min(2, runtime.NumCPU()))
	if m := l.Call(w, gw(), []byte("procs")); string(m.Inline) != want {
		t.Fatalf("9 workers: GOMAXPROCS %s, want %s", m.Inline, want)
	}
	for _, c := range ws {
		c.Send(wire.Header{Kind: wire.StopWorker})
		if err := c.ExpectEOF(fakeengine.Timeout); err != nil {
			t.Fatal(err)
		}
	}
	if m := l.Call(w, gw(), []byte("procs")); string(m.Inline) != "1" {
		t.Fatalf("back to 1 worker: GOMAXPROCS %s", m.Inline)
	}

	fixed := startLauncher(t, "STACCATO_GOMAXPROCS=3")
	fixed.Hello()
	fw := fixed.CreateWorker()
	if m := fixed.Call(fw, gw(), []byte("procs")); string(m.Inline) != "3" {
		t.Fatalf("STACCATO_GOMAXPROCS=3: %s", m.Inline)
	}
}

// The same behaviour with the other I/O mode and with spinning.
func TestIOModes(t *testing.T) {
	for _, env := range [][]string{
		{"STACCATO_GO_IO=block"},
		{"STACCATO_GO_IO=block", "STACCATO_SPIN_US=30"},
		{"STACCATO_GO_IO=poll", "STACCATO_SPIN_US=30"},
	} {
		t.Run(strings.Join(env, ","), func(t *testing.T) {
			l := startLauncher(t, env...)
			l.Hello()
			w := l.CreateWorker()
			data := pattern(5000)
			if m := l.Call(w, gw(), append([]byte("echo "), data...)); !bytes.Equal(l.Payload(&m, 'o'), data) {
				t.Fatal("echo")
			}
			id := gw()
			l.Dispatch(w, id, 0, 0, []byte("fanout 16"))
			for i := 0; i < 16; i++ {
				inv := l.Recv(w)
				l.Reply(w, inv.CallID, 0, l.Payload(&inv, 'i'))
			}
			if m := l.Recv(w); m.CallID != id || m.Kind != wire.Completion {
				t.Fatalf("%+v %q", m.Header, m.Inline)
			}
			w.Send(wire.Header{Kind: wire.StopWorker})
			if err := w.ExpectEOF(fakeengine.Timeout); err != nil {
				t.Fatal(err)
			}
			l.Ch0.CloseE2W()
			if code, err := l.Wait(fakeengine.Timeout); err != nil || code != 0 {
				t.Fatalf("exit %d %v", code, err)
			}
		})
	}
}
