package staccato_test

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"staccato.local/go/staccato"
)

func TestRunHandlerGivesARealContext(t *testing.T) {
	var fn string
	var left time.Duration
	out, err := staccato.RunHandler(func(ctx *staccato.Context, in []byte) ([]byte, error) {
		fn, left = ctx.Function(), ctx.Remaining()
		ctx.Logf("called with %d bytes", len(in))
		return bytes.ToUpper(in), nil
	}, []byte("abc"), staccato.RunOptions{Function: "greet", Timeout: 5 * time.Second, CallID: 7})
	if err != nil || string(out) != "ABC" {
		t.Fatalf("got %q, %v", out, err)
	}
	if fn != "greet" || left <= 4*time.Second || left > 5*time.Second {
		t.Fatalf("function %q, remaining %v", fn, left)
	}
}

func TestCallsAreAnsweredByTheFakesAndRecorded(t *testing.T) {
	calls := &staccato.FakeCalls{Callees: map[string]func([]byte) ([]byte, error){
		"upper": func(in []byte) ([]byte, error) { return bytes.ToUpper(in), nil },
		"down":  func([]byte) ([]byte, error) { return nil, &staccato.CallError{Kind: staccato.KindTimeout} },
	}}
	out, err := staccato.RunHandler(func(ctx *staccato.Context, in []byte) ([]byte, error) {
		var wg sync.WaitGroup
		var a []byte
		wg.Add(1)
		go func() { defer wg.Done(); a, _ = ctx.Call("upper", in) }()
		wg.Wait()
		var kinds []string
		for _, name := range []string{"down", "nobody"} {
			_, err := ctx.Call(name, nil)
			var ce *staccato.CallError
			if !errors.As(err, &ce) {
				t.Fatalf("%s: %v", name, err)
			}
			kinds = append(kinds, ce.Kind)
		}
		return []byte(string(a) + "|" + strings.Join(kinds, "|")), nil
	}, []byte("hi"), staccato.RunOptions{Calls: calls})
	if err != nil || string(out) != "HI|timeout|not_found" {
		t.Fatalf("got %q, %v", out, err)
	}
	made := calls.Made()
	if len(made) != 3 || made[0].Name != "upper" || string(made[0].In) != "hi" {
		t.Fatalf("made %+v", made)
	}
}

func TestRunHandlerTakesATraceContext(t *testing.T) {
	h := func(ctx *staccato.Context, in []byte) ([]byte, error) {
		return []byte(ctx.TraceID() + " " + ctx.Traceparent() + " " + ctx.Tracestate()), nil
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	out, err := staccato.RunHandler(h, nil, staccato.RunOptions{Traceparent: tp, Tracestate: "k=v"})
	if err != nil || string(out) != "4bf92f3577b34da6a3ce929d0e0e4736 "+tp+" k=v" {
		t.Fatalf("%q %v", out, err)
	}
	if out, _ := staccato.RunHandler(h, nil, staccato.RunOptions{}); string(out) != "  " {
		t.Fatalf("%q", out)
	}
	if _, err := staccato.RunHandler(h, nil, staccato.RunOptions{Traceparent: "00-short"}); err == nil ||
		!strings.Contains(err.Error(), "traceparent") {
		t.Fatalf("%v", err)
	}
}
