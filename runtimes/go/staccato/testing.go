package staccato

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
)

// FakeCalls answers Context.Call in a unit test (RunHandler): per callee
// name a function of the input. A callee not listed fails with a
// *CallError of kind not_found, as the engine would. Made records every
// call, in order; it is safe for handlers that call from many goroutines.
type FakeCalls struct {
	Callees map[string]func(in []byte) ([]byte, error)

	mu   sync.Mutex
	made []FakeCall
}

// FakeCall is one call a handler made.
type FakeCall struct {
	Name string
	In   []byte
}

// Made returns the calls made so far.
func (f *FakeCalls) Made() []FakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FakeCall(nil), f.made...)
}

func (f *FakeCalls) answer(name string, in []byte) ([]byte, error) {
	f.mu.Lock()
	f.made = append(f.made, FakeCall{name, append([]byte(nil), in...)})
	callee, ok := f.Callees[name]
	f.mu.Unlock()
	if !ok {
		return nil, &CallError{KindNotFound, fmt.Sprintf("no function named %q", name)}
	}
	return callee(in)
}

// RunOptions are RunHandler's settings; the zero value is a call of
// function "test" with no deadline and no callees.
type RunOptions struct {
	Function string
	Calls    *FakeCalls
	// Timeout sets the call's deadline (Context.Deadline, Remaining,
	// GoContext); 0: none.
	Timeout time.Duration
	CallID  uint64
	// Traceparent and Tracestate give the invocation a trace context
	// (Context.TraceID ...); "": none.
	Traceparent string
	Tracestate  string
}

// RunHandler runs h once with input in, as a worker would but without an
// engine, for a unit test: the handler gets a Context whose Call is
// answered by opts.Calls. It returns what the handler returned.
func RunHandler(h HandlerFunc, in []byte, opts RunOptions) ([]byte, error) {
	fn := opts.Function
	if fn == "" {
		fn = "test"
	}
	calls := opts.Calls
	if calls == nil {
		calls = &FakeCalls{}
	}
	ctx := &Context{w: &worker{rt: &runtimeState{function: fn}, id: 1}, callID: opts.CallID, calls: calls}
	if opts.Traceparent != "" {
		p := strings.Split(opts.Traceparent, "-")
		raw, err := hex.DecodeString(strings.Join(p, ""))
		if len(p) != 4 || len(p[0]) != 2 || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 || err != nil {
			return nil, fmt.Errorf("traceparent %q is not 00-<32 hex>-<16 hex>-<2 hex>", opts.Traceparent)
		}
		ctx.trace = append(raw[1:], opts.Tracestate...)
	}
	if opts.Timeout > 0 {
		ctx.deadlineUs = uint64(time.Now().Add(opts.Timeout).UnixMicro())
	}
	defer ctx.finish()
	return h(ctx, in)
}
