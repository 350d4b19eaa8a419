// Package staccato is the Go function runtime of Staccato.
//
// A function is an exported Go function with the HandlerFunc signature:
//
//	package hello
//
//	import "staccato.local/go/staccato"
//
//	func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {
//		out, err := ctx.Call("upper", in)
//		if err != nil {
//			return nil, err
//		}
//		return append([]byte("hello "), out...), nil
//	}
//
// runtimes/go/build-function.sh builds it into a worker binary whose main is
// staccato.Serve(hello.Handle). The engine starts that binary as the
// function's launcher (docs/protocol.md §1); it runs every worker the engine
// asks for as goroutines of this one process (Nightcore §4.2), and every
// invocation on a goroutine of its own.
//
// Errors: a handler returning an error fails the call with function_error
// and err.Error() as the message (cut to 960 bytes); a panic is recovered
// and fails the call the same way ("panic: ...", stack trace in the log). A
// panic in another goroutine the handler started kills the process, and
// with it every worker of the function (the engine reports worker_crashed
// and starts a new launcher).
package staccato

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"staccato.local/go/wire"
)

// HandlerFunc is a function's entry point. in is the call's input (a copy
// the handler owns); the returned bytes are the output. ctx is valid until
// the handler returns (Call fails with internal after that).
type HandlerFunc func(ctx *Context, in []byte) ([]byte, error)

// Error kind names (docs/protocol.md, "Error kinds"), as found in
// CallError.Kind.
const (
	KindNotFound          = "not_found"
	KindPayloadTooLarge   = "payload_too_large"
	KindFunctionError     = "function_error"
	KindWorkerCrashed     = "worker_crashed"
	KindTimeout           = "timeout"
	KindEngineUnavailable = "engine_unavailable"
	KindBadRequest        = "bad_request"
	KindInternal          = "internal"
	KindOutOfMemory       = "out_of_memory"
	KindOutputTooLarge    = "output_too_large"
	KindCallCycle         = "call_cycle"
	KindCallDepthExceeded = "call_depth_exceeded"
	KindFunctionRemoved   = "function_removed"
	KindOverloaded        = "overloaded"
)

// CallError is the error of a failed Context.Call: Kind is the error kind
// name (KindNotFound, ...), Message the callee's or engine's message.
type CallError struct {
	Kind    string
	Message string
}

func (e *CallError) Error() string {
	if e.Message == "" {
		return e.Kind
	}
	return e.Kind + ": " + e.Message
}

// Code returns the numeric error kind code of e.Kind (0 if unknown).
func (e *CallError) Code() int {
	k, _ := wire.ParseErrorKind(e.Kind)
	return int(k)
}

// runtimeState is everything one launcher process shares between its
// channels.
type runtimeState struct {
	function   string
	ipcDir     string
	shmDir     string
	handler    HandlerFunc
	payloadMax int
	spinUs     int64
	io         ioMode
	pid        uint32

	mu         sync.Mutex
	workers    map[uint32]*worker
	procsFixed bool // GOMAXPROCS chosen by the environment
	procs      int
}

func (rt *runtimeState) logf(format string, args ...any) {
	b := time.Now().AppendFormat(make([]byte, 0, 160), "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, " staccato-go "...)
	b = append(b, rt.function...)
	b = append(b, ": "...)
	b = fmt.Appendf(b, format, args...)
	b = append(b, '\n')
	os.Stderr.Write(b)
}

// Serve runs the process as the function's launcher and never returns. It
// reads its configuration from the environment the engine sets:
//
//	STACCATO_FUNCTION     function name (log prefixes)
//	STACCATO_IPC_DIR      the function's IPC directory (channels, shm/)
//	STACCATO_PAYLOAD_MAX  maximum payload bytes (default 6291456)
//	STACCATO_SPIN_US      µs a waiting channel polls before it blocks (0 = never)
//	STACCATO_GOMAXPROCS   fixes GOMAXPROCS (default: see below)
//	STACCATO_GO_IO        "poll" or "block": how FIFOs are read (default:
//	                      block when STACCATO_SPIN_US > 0, else poll)
//
// It opens channel 0, says LauncherHello, and serves CreateWorker by opening
// that worker's channel in this process. End of file on channel 0 (the
// engine is gone) exits with status 0; a configuration error exits with 1
// before channel 0 is opened.
//
// GOMAXPROCS follows Nightcore: max(1, ceil(open workers / 8)), capped at
// the number of CPUs, updated as workers come and go. Workers mostly wait
// for messages; one P per 8 of them keeps the scheduler on few threads and
// avoids cross-CPU wake-ups on the engine's small machines, while a function
// scaled out by the engine to many workers (because its handlers are busy)
// gets more parallelism. STACCATO_GOMAXPROCS (or Go's own GOMAXPROCS)
// fixes the value instead.
func Serve(h HandlerFunc) {
	os.Exit(serve(h))
}

func serve(h HandlerFunc) int {
	rt := &runtimeState{
		function:   os.Getenv("STACCATO_FUNCTION"),
		ipcDir:     os.Getenv("STACCATO_IPC_DIR"),
		handler:    h,
		payloadMax: wire.DefaultPayloadMax,
		pid:        uint32(os.Getpid()),
		workers:    make(map[uint32]*worker),
	}
	if rt.function == "" {
		rt.function = "?"
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "staccato go launcher (%s): %s\n", rt.function, fmt.Sprintf(format, args...))
		return 1
	}
	if h == nil {
		return fail("no handler (staccato.Serve(nil))")
	}
	if rt.ipcDir == "" {
		return fail("STACCATO_IPC_DIR is not set")
	}
	rt.shmDir = rt.ipcDir + "/shm"
	var err error
	if v := os.Getenv("STACCATO_PAYLOAD_MAX"); v != "" {
		if rt.payloadMax, err = strconv.Atoi(v); err != nil || rt.payloadMax < 0 {
			return fail("STACCATO_PAYLOAD_MAX is not a byte count: %q", v)
		}
	}
	if v := os.Getenv("STACCATO_SPIN_US"); v != "" {
		if rt.spinUs, err = strconv.ParseInt(v, 10, 64); err != nil || rt.spinUs < 0 || rt.spinUs > 1e6 {
			return fail("STACCATO_SPIN_US is not a number of microseconds (0..1000000): %q", v)
		}
	}
	switch v := os.Getenv("STACCATO_GO_IO"); v {
	case "":
		// Measured (README.md, "I/O mode"): with spinning, spin on the raw
		// descriptor and then block in ppoll; without, the netpoller.
		rt.io = ioPoll
		if rt.spinUs > 0 {
			rt.io = ioBlock
		}
	case "poll":
		rt.io = ioPoll
	case "block":
		rt.io = ioBlock
	default:
		return fail("STACCATO_GO_IO must be poll or block, got %q", v)
	}
	if v := os.Getenv("STACCATO_GOMAXPROCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fail("STACCATO_GOMAXPROCS is not a positive number: %q", v)
		}
		runtime.GOMAXPROCS(n)
		rt.procsFixed = true
	} else if os.Getenv("GOMAXPROCS") != "" {
		rt.procsFixed = true // the Go runtime applied it already
	}
	rt.mu.Lock()
	rt.adjustProcs()
	rt.mu.Unlock()

	// Channel 0 never spins (CreateWorker is rare) and always waits in the
	// netpoller: the main goroutine blocked in read(2) right after starting a
	// worker would hold the P until sysmon retakes it, delaying the new
	// worker's reader (and its first Dispatch) by up to milliseconds.
	ch0, err := openFifo(rt.ipcDir, 0, ioPoll, 0)
	if err != nil {
		return fail("cannot open channel 0: %v", err)
	}
	var tx [wire.MessageLen]byte
	hello := wire.Header{Kind: wire.LauncherHello, SendTsNs: uint64(nanotime()), Aux: rt.pid}
	if err := wire.Encode(tx[:], &hello); err != nil {
		return fail("%v", err)
	}
	if err := ch0.write(tx[:]); err != nil {
		return fail("cannot send LauncherHello: %v", err)
	}
	for {
		buf, err := ch0.next()
		if err != nil {
			// End of file: the engine is gone, and so are the workers' peers.
			if err == io.EOF {
				err = errors.New("end of file")
			}
			rt.logf("launcher channel: %v; exiting", err)
			return 0
		}
		m, err := wire.Decode(buf)
		if err != nil {
			rt.logf("launcher channel: dropping invalid message: %v", err)
			continue
		}
		if m.Kind != wire.CreateWorker {
			rt.logf("launcher channel: ignoring unexpected %v", m.Kind)
			continue
		}
		rt.createWorker(m.WorkerID)
	}
}

// createWorker opens worker channel id and says WorkerHello on it. On
// failure nothing is sent: the engine notices the missing hello.
func (rt *runtimeState) createWorker(id uint32) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	// Worker ids are below 2^31 so internal call ids keep bit 63 clear.
	if id == 0 || id >= 1<<31 || rt.workers[id] != nil {
		rt.logf("CreateWorker for an invalid or open worker id %d", id)
		return
	}
	ch, err := openFifo(rt.ipcDir, id, rt.io, rt.spinUs)
	if err != nil {
		rt.logf("cannot open worker channel %d: %v", id, err)
		return
	}
	var tx [wire.MessageLen]byte
	hello := wire.Header{Kind: wire.WorkerHello, WorkerID: id, SendTsNs: uint64(nanotime()), Aux: rt.pid}
	err = wire.Encode(tx[:], &hello)
	if err == nil {
		err = ch.write(tx[:])
	}
	if err != nil {
		rt.logf("cannot send WorkerHello on channel %d: %v", id, err)
		ch.close()
		return
	}
	w := newWorker(rt, id, ch)
	rt.workers[id] = w
	rt.adjustProcs()
	go w.readLoop()
}

func (rt *runtimeState) workerClosed(w *worker, reason string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.workers[w.id] == w {
		delete(rt.workers, w.id)
		rt.adjustProcs()
	}
}

// adjustProcs sets GOMAXPROCS = max(1, ceil(workers/8)), at most the number
// of CPUs, unless the environment fixed it. Called with rt.mu held.
func (rt *runtimeState) adjustProcs() {
	if rt.procsFixed {
		return
	}
	n := max(1, min((len(rt.workers)+7)/8, runtime.NumCPU()))
	if n != rt.procs {
		runtime.GOMAXPROCS(n)
		rt.procs = n
	}
}
