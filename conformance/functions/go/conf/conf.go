// Package conf holds the Go runtime's conformance functions
// (conformance/README.md, section 2), one exported handler per role,
// written with the runtime's ordinary API.
package conf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"staccato.local/go/staccato"
)

const lang = "go"

// Nop returns nothing.
func Nop(ctx *staccato.Context, in []byte) ([]byte, error) {
	return nil, nil
}

// Echo returns its input.
func Echo(ctx *staccato.Context, in []byte) ([]byte, error) {
	return in, nil
}

// Fail fails the Go way: by returning an error.
func Fail(ctx *staccato.Context, in []byte) ([]byte, error) {
	return nil, fmt.Errorf("conformance failure: %s", in)
}

// Call takes "<target>:<data>" and returns the target's output for data, or,
// when the call fails, its error as JSON {"error_kind", "message"}.
func Call(ctx *staccato.Context, in []byte) ([]byte, error) {
	target, data, ok := bytes.Cut(in, []byte(":"))
	if !ok || len(target) == 0 {
		return nil, errors.New("input must be <target>:<data>")
	}
	out, err := ctx.Call(string(target), data)
	var ce *staccato.CallError
	if errors.As(err, &ce) {
		return json.Marshal(struct {
			ErrorKind string `json:"error_kind"`
			Message   string `json:"message"`
		}{ce.Kind, ce.Message})
	}
	return out, err
}

// Deadline reports the invocation's context.
func Deadline(ctx *staccato.Context, in []byte) ([]byte, error) {
	return json.Marshal(struct {
		CallID       string  `json:"call_id"`
		ParentCallID string  `json:"parent_call_id"`
		DeadlineUs   uint64  `json:"deadline_us"`
		RemainingMs  float64 `json:"remaining_ms"`
	}{
		CallID:       fmt.Sprintf("%016x", ctx.CallID()),
		ParentCallID: fmt.Sprintf("%016x", ctx.ParentCallID()),
		DeadlineUs:   ctx.DeadlineUs(),
		RemainingMs:  float64(ctx.Remaining()) / float64(time.Millisecond),
	})
}

// ChainDeadline calls conf-go-deadline and returns its output unchanged.
func ChainDeadline(ctx *staccato.Context, in []byte) ([]byte, error) {
	return ctx.Call("conf-"+lang+"-deadline", nil)
}

// Fanout makes 16 concurrent calls to conf-go-echo (inputs "0".."15") from
// 16 goroutines and returns the outputs as a JSON list in input order.
func Fanout(ctx *staccato.Context, in []byte) ([]byte, error) {
	const n = 16
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			out, err := ctx.Call("conf-"+lang+"-echo", []byte(strconv.Itoa(i)))
			outs[i], errs[i] = string(out), err
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return json.Marshal(outs)
}

// Log writes "conformance log <input>" through the context's logger.
func Log(ctx *staccato.Context, in []byte) ([]byte, error) {
	ctx.Logf("conformance log %s", in)
	return []byte("ok"), nil
}
