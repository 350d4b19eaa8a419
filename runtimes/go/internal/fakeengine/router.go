package fakeengine

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"staccato.local/go/wire"
)

// Router is a small engine for several functions: gateway calls (Call),
// internal calls routed from Invoke to a worker of the callee (shm files
// renamed between the functions' shm directories, callee deadline = the
// earlier of the caller's and now + the callee's timeout), a worker pool
// that grows on demand.
type Router struct {
	t      testing.TB
	mu     sync.Mutex
	funcs  map[string]*routed
	calls  map[uint64]*pendingCall
	gwSeq  atomic.Uint64
	closed atomic.Bool

	inFlight    map[uint64]int // internal calls in flight per parent call id
	maxInFlight map[uint64]int
}

// MaxInFlight is the most internal calls the invocation parent had in
// flight at once.
func (r *Router) MaxInFlight(parent uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxInFlight[parent]
}

type routed struct {
	name    string
	timeout time.Duration
	l       *Launcher
	idle    []*Chan
	queue   []func(*Chan) // dispatches waiting for a worker
	workers int
	max     int
}

// Result is the outcome of a call.
type Result struct {
	ErrKind wire.ErrorKind // 0 on success
	Data    []byte         // output or error message
	Kind    wire.Kind
	CallID  uint64 // the gateway call id
}

type pendingCall struct {
	callee *routed
	worker *Chan
	// where the result goes: a gateway waiter, or the caller's worker
	gw       chan Result
	parent   uint64
	caller   *routed
	callerCh *Chan
}

// NewRouter returns an empty router; its launchers die with the test.
func NewRouter(t testing.TB) *Router {
	r := &Router{t: t, funcs: make(map[string]*routed), calls: make(map[uint64]*pendingCall),
		inFlight: make(map[uint64]int), maxInFlight: make(map[uint64]int)}
	t.Cleanup(func() { r.closed.Store(true) })
	return r
}

// Add starts function name (argv as its launcher, in cwd) with one worker;
// the pool grows up to maxWorkers.
func (r *Router) Add(name string, argv []string, cwd string, timeout time.Duration, maxWorkers int, env ...string) *Launcher {
	r.t.Helper()
	l := Start(r.t, name, argv, cwd, env...)
	l.Hello()
	f := &routed{name: name, timeout: timeout, l: l, max: max(maxWorkers, 1), workers: 1}
	r.mu.Lock()
	r.funcs[name] = f
	r.mu.Unlock()
	c, err := r.newWorker(f)
	if err != nil {
		r.t.Fatal(err)
	}
	r.release(f, c)
	return l
}

func (r *Router) newWorker(f *routed) (*Chan, error) {
	c, err := f.l.NewWorker()
	if err != nil {
		return nil, err
	}
	go r.serve(f, c)
	return c, nil
}

// acquire runs use with an idle worker of f: now, with a new worker, or
// when one is released.
func (r *Router) acquire(f *routed, use func(*Chan)) {
	r.mu.Lock()
	if n := len(f.idle); n > 0 {
		c := f.idle[n-1]
		f.idle = f.idle[:n-1]
		r.mu.Unlock()
		use(c)
		return
	}
	if f.workers < f.max {
		f.workers++
		r.mu.Unlock()
		c, err := r.newWorker(f)
		if err != nil {
			r.t.Errorf("creating a worker of %s: %v", f.name, err)
			return
		}
		use(c)
		return
	}
	f.queue = append(f.queue, use)
	r.mu.Unlock()
}

func (r *Router) release(f *routed, c *Chan) {
	r.mu.Lock()
	if len(f.queue) > 0 {
		use := f.queue[0]
		f.queue = f.queue[1:]
		r.mu.Unlock()
		use(c)
		return
	}
	f.idle = append(f.idle, c)
	r.mu.Unlock()
}

// Call makes a gateway call and waits for its result.
func (r *Router) Call(name string, input []byte, timeout time.Duration) (Result, error) {
	r.mu.Lock()
	f := r.funcs[name]
	r.mu.Unlock()
	if f == nil {
		return Result{ErrKind: wire.NotFound, Data: []byte("no function " + name)}, nil
	}
	if timeout == 0 {
		timeout = f.timeout
	}
	id := Gateway | r.gwSeq.Add(1)
	deadline := uint64(time.Now().Add(timeout).UnixMicro())
	done := make(chan Result, 1)
	r.acquire(f, func(c *Chan) {
		r.mu.Lock()
		r.calls[id] = &pendingCall{callee: f, worker: c, gw: done}
		r.mu.Unlock()
		h := wire.Header{Kind: wire.Dispatch, CallID: id, DeadlineUs: deadline}
		if err := f.l.SendPayload(c, h, input); err != nil {
			r.t.Errorf("dispatch to %s: %v", name, err)
		}
	})
	select {
	case res := <-done:
		res.CallID = id
		return res, nil
	case <-time.After(timeout + Timeout):
		return Result{}, fmt.Errorf("call %016x to %s: no result\nlauncher log:\n%s", id, name, f.l.Stderr())
	}
}

// serve reads one worker channel: Invokes are routed, results delivered.
func (r *Router) serve(f *routed, c *Chan) {
	for {
		m, err := c.Recv(time.Hour)
		if err != nil {
			if !r.closed.Load() && !f.l.Closing() && !f.l.Exited() {
				r.t.Errorf("%s worker %d: %v", f.name, c.ID, err)
			}
			return
		}
		switch m.Kind {
		case wire.Invoke:
			r.invoke(f, c, &m)
		case wire.Completion, wire.Failure:
			r.result(f, c, &m)
		default:
			r.t.Errorf("%s worker %d: unexpected %v", f.name, c.ID, m.Kind)
		}
	}
}

func (r *Router) invoke(caller *routed, callerCh *Chan, m *wire.Message) {
	name := string(m.Name())
	if m.ParentCallID == 0 {
		r.t.Errorf("Invoke %016x without parent_call_id", m.CallID)
	}
	r.mu.Lock()
	callee := r.funcs[name]
	r.mu.Unlock()
	if callee == nil {
		if m.InShm() {
			os.Remove(caller.l.ShmPath(m.CallID, 'i'))
		}
		msg := fmt.Sprintf("no function '%s'", name)
		callerCh.Send(wire.Header{Kind: wire.Failure, CallID: m.CallID, ErrorKind: wire.NotFound,
			PayloadLen: uint32(len(msg))}, []byte(msg))
		return
	}
	deadline := uint64(time.Now().Add(callee.timeout).UnixMicro())
	if m.DeadlineUs != 0 && m.DeadlineUs < deadline {
		deadline = m.DeadlineUs
	}
	h := wire.Header{Kind: wire.Dispatch, CallID: m.CallID, ParentCallID: m.ParentCallID, DeadlineUs: deadline,
		Flags: m.Flags, PayloadLen: m.PayloadLen}
	var input []byte
	if m.InShm() {
		// Zero copy between functions: rename into the callee's directory.
		if err := os.Rename(caller.l.ShmPath(m.CallID, 'i'), callee.l.ShmPath(m.CallID, 'i')); err != nil {
			r.t.Errorf("moving the input of %016x: %v", m.CallID, err)
			return
		}
	} else {
		input = m.InlinePayload()
		h.PayloadLen = uint32(len(input))
	}
	id, parent := m.CallID, m.ParentCallID
	r.mu.Lock()
	r.inFlight[parent]++
	r.maxInFlight[parent] = max(r.maxInFlight[parent], r.inFlight[parent])
	r.mu.Unlock()
	r.acquire(callee, func(c *Chan) {
		r.mu.Lock()
		r.calls[id] = &pendingCall{callee: callee, worker: c, caller: caller, callerCh: callerCh, parent: parent}
		r.mu.Unlock()
		if err := c.Send(h, input); err != nil {
			r.t.Errorf("dispatch to %s: %v", callee.name, err)
		}
	})
}

func (r *Router) result(f *routed, c *Chan, m *wire.Message) {
	r.mu.Lock()
	p := r.calls[m.CallID]
	delete(r.calls, m.CallID)
	if p != nil && p.gw == nil {
		r.inFlight[p.parent]--
	}
	r.mu.Unlock()
	if p == nil || p.worker != c {
		r.t.Errorf("%s worker %d: result for unknown call %016x", f.name, c.ID, m.CallID)
		return
	}
	r.release(f, c)
	if p.gw != nil {
		data, err := f.l.ReadPayload(m, 'o')
		if err != nil {
			r.t.Errorf("result of %016x: %v", m.CallID, err)
		}
		p.gw <- Result{ErrKind: m.ErrorKind, Data: data, Kind: m.Kind}
		return
	}
	h := wire.Header{Kind: m.Kind, CallID: m.CallID, ErrorKind: m.ErrorKind, Flags: m.Flags, PayloadLen: m.PayloadLen}
	if m.InShm() {
		if err := os.Rename(f.l.ShmPath(m.CallID, 'o'), p.caller.l.ShmPath(m.CallID, 'o')); err != nil {
			r.t.Errorf("moving the result of %016x: %v", m.CallID, err)
			return
		}
		p.callerCh.Send(h)
		return
	}
	p.callerCh.Send(h, m.Inline)
}
