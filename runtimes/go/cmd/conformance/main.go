// Command conformance is the Go runtime's vector program for the shared
// conformance suite (conformance/README.md): for every case of a vector file
// it decodes the message with package wire (the codec the runtime's workers
// use) and prints one JSON object per line.
//
//	go build -C runtimes/go -o ../../build/conformance-go ./cmd/conformance
//	build/conformance-go testvectors/message_v1.json
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"staccato.local/go/internal/vectors"
	"staccato.local/go/wire"
)

type result struct {
	TcID      int             `json:"tcId"`
	Decoded   bool            `json:"decoded"`
	Fields    *vectors.Fields `json:"fields,omitempty"`
	Reencoded string          `json:"reencoded,omitempty"`
	Error     string          `json:"error,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: conformance <vector file>")
		os.Exit(2)
	}
	file, err := vectors.Load(os.Args[len(os.Args)-1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out) // one object per line
	for _, tc := range file.Tests {
		r := result{TcID: tc.TcID}
		msg, err := hex.DecodeString(tc.Msg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "conformance: tcId %d: bad hex: %v\n", tc.TcID, err)
			os.Exit(1)
		}
		m, err := wire.Decode(msg)
		if err != nil {
			r.Error = err.Error()
		} else {
			r.Decoded = true
			f := vectors.ToFields(&m)
			r.Fields = &f
			buf, err := wire.Marshal(&m)
			if err != nil {
				// Cannot happen for a decoded message; report it visibly.
				r.Error = "re-encode: " + err.Error()
			} else {
				r.Reencoded = hex.EncodeToString(buf)
			}
		}
		if err := enc.Encode(&r); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(1)
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}
