// Package vectors reads testvectors/message_v1.json and converts between
// decoded messages and the vector file's "fields" objects. It is shared by
// the wire tests and the conformance vector program (cmd/conformance); the
// codec itself is package wire.
package vectors

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"staccato.local/go/wire"
)

// Fields is a vector's "fields" object: kind as a name, u64 fields as
// decimal strings, inline as hex of the used inline bytes.
type Fields struct {
	Kind         string `json:"kind"`
	Flags        uint16 `json:"flags"`
	PayloadLen   uint32 `json:"payload_len"`
	CallID       string `json:"call_id"`
	ParentCallID string `json:"parent_call_id"`
	WorkerID     uint32 `json:"worker_id"`
	NameLen      uint16 `json:"name_len"`
	ErrorKind    uint16 `json:"error_kind"`
	DeadlineUs   string `json:"deadline_us"`
	SendTsNs     string `json:"send_ts_ns"`
	Aux          uint32 `json:"aux"`
	Inline       string `json:"inline"`
}

// Case is one test case of the vector file.
type Case struct {
	TcID    int             `json:"tcId"`
	Comment string          `json:"comment"`
	Result  string          `json:"result"` // "valid" or "invalid"
	Msg     string          `json:"msg"`    // hex
	Fields  json.RawMessage `json:"fields,omitempty"`
}

// File is the whole vector file.
type File struct {
	Schema        string `json:"schema"`
	NumberOfTests int    `json:"numberOfTests"`
	Tests         []Case `json:"tests"`
}

// Load reads a vector file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Schema != "staccato_message_v1" {
		return nil, fmt.Errorf("%s: unexpected schema %q", path, f.Schema)
	}
	if f.NumberOfTests != len(f.Tests) {
		return nil, fmt.Errorf("%s: numberOfTests %d but %d tests", path, f.NumberOfTests, len(f.Tests))
	}
	return &f, nil
}

// ToFields converts a decoded message to the vector representation.
func ToFields(m *wire.Message) Fields {
	u64 := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return Fields{
		Kind:         m.Kind.String(),
		Flags:        m.Flags,
		PayloadLen:   m.PayloadLen,
		CallID:       u64(m.CallID),
		ParentCallID: u64(m.ParentCallID),
		WorkerID:     m.WorkerID,
		NameLen:      m.NameLen,
		ErrorKind:    uint16(m.ErrorKind),
		DeadlineUs:   u64(m.DeadlineUs),
		SendTsNs:     u64(m.SendTsNs),
		Aux:          m.Aux,
		Inline:       hex.EncodeToString(m.Inline),
	}
}

// ParseFields decodes a "fields" object strictly (unknown keys are errors).
func ParseFields(raw []byte) (Fields, error) {
	var f Fields
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&f)
	return f, err
}

// ToMessage converts the vector representation to a message.
func (f *Fields) ToMessage() (wire.Message, error) {
	var m wire.Message
	kind, ok := wire.ParseKind(f.Kind)
	if !ok {
		return m, fmt.Errorf("unknown kind name %q", f.Kind)
	}
	var err error
	u64 := func(s string) uint64 {
		v, e := strconv.ParseUint(s, 10, 64)
		if e != nil && err == nil {
			err = e
		}
		return v
	}
	m.Header = wire.Header{
		Kind:         kind,
		Flags:        f.Flags,
		PayloadLen:   f.PayloadLen,
		CallID:       u64(f.CallID),
		ParentCallID: u64(f.ParentCallID),
		WorkerID:     f.WorkerID,
		NameLen:      f.NameLen,
		ErrorKind:    wire.ErrorKind(f.ErrorKind),
		DeadlineUs:   u64(f.DeadlineUs),
		SendTsNs:     u64(f.SendTsNs),
		Aux:          f.Aux,
	}
	if err != nil {
		return m, err
	}
	m.Inline, err = hex.DecodeString(f.Inline)
	return m, err
}
