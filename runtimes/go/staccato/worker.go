package staccato

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"staccato.local/go/wire"
)

var errChannelClosed = errors.New("channel closed")

// reply is a Completion or Failure for one of this worker's Invokes, handed
// from the reading goroutine to the waiting Call.
type reply struct {
	kind    wire.Kind
	errKind wire.ErrorKind
	inShm   bool
	length  uint32
	data    []byte     // the inline payload (copied)
	local   *CallError // set instead when the channel closed
}

// worker is one worker channel. Its reading goroutine decodes messages and
// starts a goroutine per Dispatch; replies to Invokes are routed by call id
// to the Call waiting for them.
type worker struct {
	rt *runtimeState
	id uint32
	ch *fifo

	// wmu serializes sends (a 1 KiB write is atomic anyway, but the encode
	// buffer is shared) and guards wclosed.
	wmu     sync.Mutex
	tx      [wire.MessageLen]byte
	wclosed bool

	closed atomic.Bool

	// mu guards the call id sequence, the pending calls and the counters.
	mu       sync.Mutex
	seq      uint32
	pending  map[uint64]chan reply
	running  int  // Dispatches whose handler has not finished
	stopping bool // StopWorker arrived while running > 0
	reason   string
}

func newWorker(rt *runtimeState, id uint32, ch *fifo) *worker {
	return &worker{rt: rt, id: id, ch: ch, pending: make(map[uint64]chan reply)}
}

// send encodes h (with the channel's worker id and the send time) and the
// inline parts into one message and writes it.
func (w *worker) send(h *wire.Header, inline ...[]byte) error {
	h.WorkerID = w.id
	w.wmu.Lock()
	if w.wclosed {
		w.wmu.Unlock()
		return errChannelClosed
	}
	h.SendTsNs = uint64(nanotime())
	err := wire.Encode(w.tx[:], h, inline...)
	if err != nil {
		w.wmu.Unlock()
		// A bug in this runtime: never send a message the engine rejects.
		w.rt.logf("worker %d: not sending invalid %v message: %v", w.id, h.Kind, err)
		return err
	}
	err = w.ch.write(w.tx[:])
	w.wmu.Unlock()
	if err != nil {
		// EPIPE: the engine closed the channel.
		w.close(fmt.Sprintf("write error: %v", err))
	}
	return err
}

// readLoop is the worker's reading goroutine.
func (w *worker) readLoop() {
	reason := "end of file on e2w"
loop:
	for !w.closed.Load() {
		buf, err := w.ch.next()
		if err != nil {
			if err != io.EOF {
				reason = "read error: " + err.Error()
			}
			break
		}
		m, err := wire.Decode(buf)
		if err != nil {
			w.rt.logf("worker %d: dropping invalid message: %v", w.id, err)
			continue
		}
		switch m.Kind {
		case wire.Dispatch:
			w.dispatch(&m)
		case wire.Completion, wire.Failure:
			w.onReply(&m)
		case wire.StopWorker:
			if w.stop() {
				reason = "StopWorker"
				break loop
			}
		default:
			w.rt.logf("worker %d: ignoring unexpected %v", w.id, m.Kind)
		}
	}
	w.close(reason) // a no-op if closed already
	if w.ch.mode == ioBlock {
		w.ch.closeRead() // only this goroutine may (see fifo.closeRead)
	}
}

// stop handles StopWorker: close now if idle (the normal case: the engine
// stops only idle workers), else once the running invocation has answered.
// It reports whether the channel is to be closed now.
func (w *worker) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running == 0 {
		return true
	}
	w.stopping = true
	return false
}

// close closes the channel (idempotent): w2e first, so the engine sees end
// of file at once; pending calls fail with engine_unavailable.
func (w *worker) close(reason string) {
	if !w.closed.CompareAndSwap(false, true) {
		return
	}
	w.wmu.Lock()
	w.wclosed = true
	w.ch.closeWrite()
	w.wmu.Unlock()
	if w.ch.mode == ioPoll {
		w.ch.closeRead() // wakes the reading goroutine
	}
	w.mu.Lock()
	w.reason = reason
	pending := w.pending
	w.pending = make(map[uint64]chan reply)
	w.mu.Unlock()
	for _, rc := range pending {
		rc <- reply{local: &CallError{KindEngineUnavailable, fmt.Sprintf("worker channel %d closed: %s", w.id, reason)}}
	}
	w.rt.workerClosed(w, reason)
}

// ---- running the handler ------------------------------------------------

func (w *worker) dispatch(m *wire.Message) {
	ctx := &Context{w: w, callID: m.CallID, parentCallID: m.ParentCallID, deadlineUs: m.DeadlineUs}
	if m.NameLen > 0 {
		ctx.trace = bytes.Clone(m.Inline[:m.NameLen]) // the receive buffer is reused
	}
	var inline []byte
	if !m.InShm() {
		inline = bytes.Clone(m.InlinePayload())
	}
	w.mu.Lock()
	w.running++
	w.mu.Unlock()
	go w.run(ctx, m.InShm(), m.PayloadLen, inline)
}

func (w *worker) run(ctx *Context, inShm bool, length uint32, in []byte) {
	answered := false
	defer func() {
		// Only runtime.Goexit in the handler gets here without an answer
		// (a panic is recovered in callHandler).
		if !answered {
			ctx.finish()
			w.sendFailure(ctx, wire.FunctionError, "handler exited without returning (runtime.Goexit)")
		}
		w.finished()
	}()
	if inShm {
		answered = true
		path := shmPath(w.rt.shmDir, ctx.callID, wire.Dispatch)
		if int64(length) > int64(w.rt.payloadMax) {
			os.Remove(path)
			w.sendFailure(ctx, wire.PayloadTooLarge,
				fmt.Sprintf("input of %d bytes exceeds the maximum payload of %d bytes", length, w.rt.payloadMax))
			return
		}
		var err error
		if in, err = readShm(path, length); err != nil {
			w.sendFailure(ctx, wire.Internal, "cannot read input: "+err.Error())
			return
		}
		answered = false
	}
	out, err := w.callHandler(ctx, in)
	answered = true
	ctx.finish()
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = fmt.Sprintf("handler returned an error (%T) with an empty message", err)
		}
		w.sendFailure(ctx, wire.FunctionError, msg)
		return
	}
	w.sendResult(ctx, out)
}

type panicError struct{ value any }

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// callHandler runs the handler, turning a panic into an error (the stack
// goes to the function's log).
func (w *worker) callHandler(ctx *Context, in []byte) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			ctx.Logf("panic: %v\n%s", r, debug.Stack())
			out, err = nil, &panicError{r}
		}
	}()
	return w.rt.handler(ctx, in)
}

// finished runs when an invocation has answered; it completes a StopWorker
// that arrived meanwhile.
func (w *worker) finished() {
	w.mu.Lock()
	w.running--
	stop := w.stopping && w.running == 0
	w.mu.Unlock()
	if stop {
		w.close("StopWorker")
	}
}

// sendResult sends the Completion of a dispatched call: inline when it fits,
// else through the output file.
func (w *worker) sendResult(ctx *Context, out []byte) {
	h := wire.Header{Kind: wire.Completion, PayloadLen: uint32(len(out)), CallID: ctx.callID, ParentCallID: ctx.parentCallID}
	if len(out) <= wire.InlineMax {
		w.send(&h, out)
		return
	}
	if len(out) > w.rt.payloadMax {
		w.sendFailure(ctx, wire.OutputTooLarge,
			fmt.Sprintf("%s: output of %d bytes exceeds the maximum payload of %d bytes", w.rt.function, len(out), w.rt.payloadMax))
		return
	}
	path := shmPath(w.rt.shmDir, ctx.callID, wire.Completion)
	if err := writeShm(path, out); err != nil {
		w.sendFailure(ctx, wire.Internal, fmt.Sprintf("cannot write %d-byte output file: %v", len(out), err))
		return
	}
	h.Flags = wire.FlagPayloadInShm
	if err := w.send(&h); err != nil {
		os.Remove(path)
	}
}

// sendFailure sends a Failure; the message is cut to fit inline (at a UTF-8
// character boundary, with "..."): messages are for humans.
func (w *worker) sendFailure(ctx *Context, kind wire.ErrorKind, msg string) {
	data := truncateMessage(msg)
	h := wire.Header{Kind: wire.Failure, PayloadLen: uint32(len(data)), CallID: ctx.callID,
		ParentCallID: ctx.parentCallID, ErrorKind: kind}
	w.send(&h, data)
}

func truncateMessage(msg string) []byte {
	if len(msg) <= wire.InlineMax {
		return []byte(msg)
	}
	cut := wire.InlineMax - 3
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return append([]byte(msg[:cut]), "..."...)
}

// ---- internal calls -------------------------------------------------------

// register allocates a call id, (worker_id << 32) | seq with seq from 1,
// wrapping from 2^32-1 to 1 (never 0, never one still pending), and a
// channel for its reply.
func (w *worker) register() (uint64, chan reply, *CallError) {
	rc := make(chan reply, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return 0, nil, &CallError{KindEngineUnavailable, fmt.Sprintf("worker channel %d closed: %s", w.id, w.reason)}
	}
	for {
		w.seq++
		if w.seq == 0 {
			w.seq = 1
		}
		id := uint64(w.id)<<32 | uint64(w.seq)
		if _, busy := w.pending[id]; !busy {
			w.pending[id] = rc
			return id, rc, nil
		}
	}
}

// unregister forgets a pending call; false if its reply was taken already.
func (w *worker) unregister(id uint64) bool {
	w.mu.Lock()
	_, ok := w.pending[id]
	delete(w.pending, id)
	w.mu.Unlock()
	return ok
}

// onReply routes a Completion/Failure to the Call waiting for it. A reply
// nobody waits for (the caller gave up) is dropped with its payload file.
func (w *worker) onReply(m *wire.Message) {
	w.mu.Lock()
	rc, ok := w.pending[m.CallID]
	delete(w.pending, m.CallID)
	w.mu.Unlock()
	if !ok {
		if m.InShm() {
			os.Remove(shmPath(w.rt.shmDir, m.CallID, m.Kind))
		}
		w.rt.logf("worker %d: dropping %v for unknown call %016x", w.id, m.Kind, m.CallID)
		return
	}
	r := reply{kind: m.Kind, errKind: m.ErrorKind, inShm: m.InShm(), length: m.PayloadLen}
	if !r.inShm {
		r.data = bytes.Clone(m.Inline)
	}
	rc <- r // buffered: never blocks
}

// replyResult turns a reply into Call's results (reading the payload file
// in the caller's goroutine, so big replies do not hold up the channel).
func (rt *runtimeState) replyResult(id uint64, r *reply) ([]byte, error) {
	if r.local != nil {
		return nil, r.local
	}
	data := r.data
	if r.inShm {
		var err error
		if data, err = readShm(shmPath(rt.shmDir, id, wire.Completion), r.length); err != nil {
			return nil, &CallError{KindInternal, "cannot read reply: " + err.Error()}
		}
	}
	if r.kind == wire.Completion {
		return data, nil
	}
	return nil, &CallError{Kind: r.errKind.String(), Message: string(data)}
}
