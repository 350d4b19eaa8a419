package staccato

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"staccato.local/go/wire"
)

// Context is what a handler knows about its invocation, and how it calls
// other functions. It is valid while the handler runs; its methods are safe
// for concurrent use by any number of goroutines of that invocation.
type Context struct {
	w            *worker
	callID       uint64
	parentCallID uint64
	deadlineUs   uint64 // as on the wire: 0 = none
	trace        []byte // the Dispatch's trace context and state; nil = none
	done         atomic.Bool

	goMu     sync.Mutex
	goCtx    context.Context
	goCancel context.CancelFunc

	// calls answers Call in a test (RunHandler); nil in a worker.
	calls *FakeCalls
}

// TraceID is the invocation's W3C trace id (32 lower-case hex digits), or
// "" when it has no trace context (it has one on an engine that traces,
// --otlp-endpoint, when the engine records the call or its caller sent a
// context). Internal calls carry the context without being told.
func (c *Context) TraceID() string {
	if c.trace == nil {
		return ""
	}
	return hex.EncodeToString(c.trace[:16])
}

// Traceparent is a traceparent header naming this invocation's span as the
// parent (for calls to services outside Staccato), or "".
func (c *Context) Traceparent() string {
	t := c.trace
	if t == nil {
		return ""
	}
	return "00-" + hex.EncodeToString(t[:16]) + "-" + hex.EncodeToString(t[16:24]) + "-0" + string(rune('0'+t[24]&1))
}

// Tracestate is the caller's tracestate header, or "" when there is none.
func (c *Context) Tracestate() string {
	if len(c.trace) <= wire.TraceContextLen {
		return ""
	}
	return string(c.trace[wire.TraceContextLen:])
}

// CallID is this invocation's call id (docs/protocol.md, "Call ids").
func (c *Context) CallID() uint64 { return c.callID }

// ParentCallID is the call id of the invocation that called this one with
// Call, or 0 for a call from the gateway.
func (c *Context) ParentCallID() uint64 { return c.parentCallID }

// Function is the name of the function being run.
func (c *Context) Function() string { return c.w.rt.function }

// WorkerID is the id of the worker channel running this invocation.
func (c *Context) WorkerID() uint32 { return c.w.id }

// Deadline returns the absolute deadline of this invocation, and false when
// it has none. Internal calls made with Call inherit it.
func (c *Context) Deadline() (time.Time, bool) {
	if c.deadlineUs == 0 {
		return time.Time{}, false
	}
	return time.UnixMicro(int64(min(c.deadlineUs, math.MaxInt64))), true
}

// DeadlineUs is the deadline as on the wire: microseconds since the Unix
// epoch, 0 when there is none.
func (c *Context) DeadlineUs() uint64 { return c.deadlineUs }

// Remaining returns the time left until the deadline, never negative: 0 once
// the deadline has passed. With no deadline it also returns 0; use Deadline
// (whose second result is false then) to tell "no deadline" from "no time
// left".
func (c *Context) Remaining() time.Duration {
	if c.deadlineUs == 0 {
		return 0
	}
	now := nowUs()
	if now >= c.deadlineUs {
		return 0
	}
	left := c.deadlineUs - now
	if left > math.MaxInt64/1000 {
		return math.MaxInt64
	}
	return time.Duration(left) * time.Microsecond
}

// GoContext returns a context.Context that carries this invocation's
// deadline and is cancelled when the handler returns, for libraries that
// take one (net/http, database drivers).
func (c *Context) GoContext() context.Context {
	c.goMu.Lock()
	defer c.goMu.Unlock()
	if c.goCtx == nil {
		if d, ok := c.Deadline(); ok {
			c.goCtx, c.goCancel = context.WithDeadline(context.Background(), d)
		} else {
			c.goCtx, c.goCancel = context.WithCancel(context.Background())
		}
		if c.done.Load() {
			c.goCancel()
		}
	}
	return c.goCtx
}

// finish marks the invocation over: Call fails from now on, GoContext is
// cancelled.
func (c *Context) finish() {
	c.done.Store(true)
	c.goMu.Lock()
	if c.goCancel != nil {
		c.goCancel()
	}
	c.goMu.Unlock()
}

// Logf writes one line to standard error, the function's log (shown by
// `staccato logs NAME`): "[<function> <call id, 16 hex digits>] <message>".
// Trailing newlines of the message are dropped; the line is one write(2).
func (c *Context) Logf(format string, args ...any) {
	b := make([]byte, 0, 128)
	b = append(b, '[')
	b = append(b, c.w.rt.function...)
	b = append(b, ' ')
	b = appendHex16(b, c.callID)
	b = append(b, "] "...)
	b = fmt.Appendf(b, format, args...)
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	b = append(b, '\n')
	os.Stderr.Write(b)
}

func appendHex16(b []byte, v uint64) []byte {
	var tmp [16]byte
	h := strconv.AppendUint(tmp[:0], v, 16)
	for i := len(h); i < 16; i++ {
		b = append(b, '0')
	}
	return append(b, h...)
}

// Call calls function name with input in and waits for its output. The
// callee inherits this invocation's deadline (the engine gives it no more
// time than this invocation has left).
//
// Call is safe to use from many goroutines at once (fan-out): each call has
// its own call id and its reply is routed to it. A failed call returns a
// *CallError whose Kind is the protocol's error kind name: the callee's
// failure (function_error, not_found, timeout, ...) or one detected here
// without sending anything: bad_request (name not 1..64 bytes),
// payload_too_large (input above STACCATO_PAYLOAD_MAX), timeout (deadline
// already passed), internal (Call after the handler returned),
// engine_unavailable (the worker's channel closed).
func (c *Context) Call(name string, in []byte) ([]byte, error) {
	w := c.w
	rt := w.rt
	if c.calls != nil {
		if c.done.Load() {
			return nil, &CallError{KindInternal, "Call after the handler returned"}
		}
		return c.calls.answer(name, in)
	}
	if len(name) < 1 || len(name) > wire.NameMax {
		return nil, &CallError{KindBadRequest, fmt.Sprintf("function name must be 1 to %d bytes, got %d", wire.NameMax, len(name))}
	}
	if len(in) > rt.payloadMax {
		return nil, &CallError{KindPayloadTooLarge, fmt.Sprintf("input of %d bytes exceeds the maximum payload of %d bytes", len(in), rt.payloadMax)}
	}
	if c.done.Load() {
		return nil, &CallError{KindInternal, "Call after the handler returned"}
	}
	if c.deadlineUs != 0 && nowUs() >= c.deadlineUs {
		return nil, &CallError{KindTimeout, "deadline passed before calling " + name}
	}
	id, rc, cerr := w.register()
	if cerr != nil {
		return nil, cerr
	}
	nameBytes := unsafe.Slice(unsafe.StringData(name), len(name)) // read only
	h := wire.Header{
		Kind:         wire.Invoke,
		CallID:       id,
		ParentCallID: c.callID,
		NameLen:      uint16(len(name)),
		DeadlineUs:   c.deadlineUs,
	}
	var err error
	if len(name)+len(in) <= wire.InlineMax {
		h.PayloadLen = uint32(len(name) + len(in))
		err = w.send(&h, nameBytes, in)
	} else {
		// In shm the name stays inline and payload_len counts the input only.
		path := shmPath(rt.shmDir, id, wire.Invoke)
		if err := writeShm(path, in); err != nil {
			w.unregister(id)
			return nil, &CallError{KindInternal, "cannot write input file: " + err.Error()}
		}
		h.Flags = wire.FlagPayloadInShm
		h.PayloadLen = uint32(len(in))
		if err = w.send(&h, nameBytes); err != nil {
			os.Remove(path)
		}
	}
	if err != nil {
		w.unregister(id)
		return nil, &CallError{KindEngineUnavailable, fmt.Sprintf("cannot send to the engine: %v", err)}
	}
	return c.await(id, rc)
}

// callGrace is how long after the deadline a call waits for the engine's
// answer (the engine itself fails the call with timeout at the deadline)
// before it gives up locally.
const callGrace = 2 * time.Second

func (c *Context) await(id uint64, rc chan reply) ([]byte, error) {
	var r reply
	if c.deadlineUs == 0 {
		r = <-rc
	} else {
		t := time.NewTimer(c.Remaining() + callGrace)
		select {
		case r = <-rc:
			t.Stop()
		case <-t.C:
			if c.w.unregister(id) {
				return nil, &CallError{KindTimeout, "no answer from the engine by the deadline"}
			}
			r = <-rc // the reply is being delivered right now
		}
	}
	return c.w.rt.replyResult(id, &r)
}
