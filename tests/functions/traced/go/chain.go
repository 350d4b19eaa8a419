package chain

import (
	"encoding/json"

	"staccato.local/go/staccato"
)

type entry struct {
	Fn          string `json:"fn"`
	TraceID     string `json:"trace_id"`
	Traceparent string `json:"traceparent"`
	Tracestate  string `json:"tracestate"`
}

// Handle puts its own entry before the Node.js function's list.
func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {
	out, err := ctx.Call("tr-node", in)
	if err != nil {
		return nil, err
	}
	var inner []json.RawMessage
	if err := json.Unmarshal(out, &inner); err != nil {
		return nil, err
	}
	me, _ := json.Marshal(entry{"tr-go", ctx.TraceID(), ctx.Traceparent(), ctx.Tracestate()})
	return json.Marshal(append([]json.RawMessage{me}, inner...))
}
