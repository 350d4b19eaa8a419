package chain

import "staccato.local/go/staccato"

// Handle wraps what the Node.js function returns.
func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {
	inner, err := ctx.Call("poly-node", in)
	if err != nil {
		return nil, err // a *staccato.CallError: the kind travels back up the chain
	}
	return []byte("go(" + string(inner) + ")"), nil
}
