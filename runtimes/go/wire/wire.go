// Package wire encodes and decodes Staccato worker messages
// (docs/protocol.md §1): fixed 1024-byte messages made of a 64-byte
// little-endian header and a 960-byte inline payload area.
//
// Every field is read and written at its explicit offset with
// encoding/binary; there is no struct layout involved. Decode enforces every
// rule of the protocol, and Encode checks the same rules, so a runtime using
// this package never sends a message the engine would reject.
package wire

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// Sizes (docs/protocol.md, "Size assertions").
const (
	MessageLen = 1024
	HeaderLen  = 64
	InlineMax  = MessageLen - HeaderLen // 960
	// NameMax is the longest callee name an Invoke may carry.
	NameMax = 64
	// TraceContextLen is the start of a traced Dispatch's inline area:
	// trace id (16), span id (8), flags (1); its tracestate follows (up to
	// 512 bytes). NameLen says how many bytes the two take.
	TraceContextLen = 25
	TraceLenMax     = TraceContextLen + 512
	// PipeBuf is POSIX PIPE_BUF on Linux: writes up to this size to a pipe
	// are atomic, which is what keeps several writers on one FIFO aligned.
	PipeBuf = 4096
	// DefaultPayloadMax is the default STACCATO_PAYLOAD_MAX (6 MiB).
	DefaultPayloadMax = 6 << 20
)

// Header field offsets.
const (
	offKind         = 0
	offFlags        = 2
	offPayloadLen   = 4
	offCallID       = 8
	offParentCallID = 16
	offWorkerID     = 24
	offNameLen      = 28
	offErrorKind    = 30
	offDeadlineUs   = 32
	offSendTsNs     = 40
	offAux          = 48
	offReserved     = 52
	reservedLen     = 12
)

// Compile-time size assertions: [0]struct{} is assignable only from an
// array of length 0 (a negative length does not compile either), so each
// line pins an equality.
var (
	_ [0]struct{} = [HeaderLen - 64]struct{}{}
	_ [0]struct{} = [MessageLen - 1024]struct{}{}
	_ [0]struct{} = [InlineMax - 960]struct{}{}
	_ [0]struct{} = [HeaderLen - (offReserved + reservedLen)]struct{}{}
	// Each field ends where the next begins.
	_ [0]struct{} = [offFlags - (offKind + 2)]struct{}{}
	_ [0]struct{} = [offPayloadLen - (offFlags + 2)]struct{}{}
	_ [0]struct{} = [offCallID - (offPayloadLen + 4)]struct{}{}
	_ [0]struct{} = [offParentCallID - (offCallID + 8)]struct{}{}
	_ [0]struct{} = [offWorkerID - (offParentCallID + 8)]struct{}{}
	_ [0]struct{} = [offNameLen - (offWorkerID + 4)]struct{}{}
	_ [0]struct{} = [offErrorKind - (offNameLen + 2)]struct{}{}
	_ [0]struct{} = [offDeadlineUs - (offErrorKind + 2)]struct{}{}
	_ [0]struct{} = [offSendTsNs - (offDeadlineUs + 8)]struct{}{}
	_ [0]struct{} = [offAux - (offSendTsNs + 8)]struct{}{}
	_ [0]struct{} = [offReserved - (offAux + 4)]struct{}{}
)

// A message fits one atomic pipe write (a negative array length would not
// compile).
var _ [PipeBuf - MessageLen]struct{}

// Kind is a message kind.
type Kind uint16

// Message kinds.
const (
	LauncherHello Kind = 1
	WorkerHello   Kind = 2
	CreateWorker  Kind = 3
	StopWorker    Kind = 4
	Dispatch      Kind = 5
	Completion    Kind = 6
	Failure       Kind = 7
	Invoke        Kind = 8
)

var kindNames = [...]string{
	LauncherHello: "LauncherHello",
	WorkerHello:   "WorkerHello",
	CreateWorker:  "CreateWorker",
	StopWorker:    "StopWorker",
	Dispatch:      "Dispatch",
	Completion:    "Completion",
	Failure:       "Failure",
	Invoke:        "Invoke",
}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return k >= LauncherHello && k <= Invoke }

// String returns the protocol's name of the kind ("Dispatch", ...).
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// ParseKind returns the kind with the protocol name s.
func ParseKind(s string) (Kind, bool) {
	for k := LauncherHello; k <= Invoke; k++ {
		if kindNames[k] == s {
			return k, true
		}
	}
	return 0, false
}

// FlagPayloadInShm (bit 0 of flags): the payload is in a shared-memory file.
const FlagPayloadInShm uint16 = 1

// FlagCPUTime (bit 1): a Dispatch asks for the call's CPU time, which its
// Completion or Failure carries in Aux (µs). The Go runtime does not
// measure it (goroutines share threads), so it never sets it.
const FlagCPUTime uint16 = 2

// ErrorKind is the error kind code of a Failure.
type ErrorKind uint16

// Error kinds (docs/protocol.md, "Error kinds").
const (
	NotFound          ErrorKind = 1
	PayloadTooLarge   ErrorKind = 2
	FunctionError     ErrorKind = 3
	WorkerCrashed     ErrorKind = 4
	Timeout           ErrorKind = 5
	EngineUnavailable ErrorKind = 6
	BadRequest        ErrorKind = 7
	Internal          ErrorKind = 8
	OutOfMemory       ErrorKind = 9
	OutputTooLarge    ErrorKind = 10
	CallCycle         ErrorKind = 11
	CallDepthExceeded ErrorKind = 12
	FunctionRemoved   ErrorKind = 13
	Overloaded        ErrorKind = 14
	errorKindMax                = Overloaded
)

var errorKindNames = [...]string{
	NotFound:          "not_found",
	PayloadTooLarge:   "payload_too_large",
	FunctionError:     "function_error",
	WorkerCrashed:     "worker_crashed",
	Timeout:           "timeout",
	EngineUnavailable: "engine_unavailable",
	BadRequest:        "bad_request",
	Internal:          "internal",
	OutOfMemory:       "out_of_memory",
	OutputTooLarge:    "output_too_large",
	CallCycle:         "call_cycle",
	CallDepthExceeded: "call_depth_exceeded",
	FunctionRemoved:   "function_removed",
	Overloaded:        "overloaded",
}

// Valid reports whether e is a known error kind code.
func (e ErrorKind) Valid() bool { return e >= NotFound && e <= errorKindMax }

// String returns the protocol's name of the error kind ("not_found", ...).
func (e ErrorKind) String() string {
	if e.Valid() {
		return errorKindNames[e]
	}
	return "error_kind_" + strconv.Itoa(int(e))
}

// ParseErrorKind returns the error kind with the protocol name s.
func ParseErrorKind(s string) (ErrorKind, bool) {
	for e := NotFound; e <= errorKindMax; e++ {
		if errorKindNames[e] == s {
			return e, true
		}
	}
	return 0, false
}

// Header holds the fields of a message header (the reserved bytes are
// always zero and have no field).
type Header struct {
	Kind         Kind
	Flags        uint16
	PayloadLen   uint32
	CallID       uint64
	ParentCallID uint64
	WorkerID     uint32
	NameLen      uint16
	ErrorKind    ErrorKind
	DeadlineUs   uint64
	SendTsNs     uint64
	Aux          uint32
}

// InShm reports whether the payload is in a shared-memory file.
func (h *Header) InShm() bool { return h.Flags&FlagPayloadInShm != 0 }

// Message is a decoded message: its header and the used inline bytes (the
// payload when inline, after an Invoke's name or a Dispatch's trace
// context; the name or the context alone when the payload is in shm; else
// empty).
type Message struct {
	Header
	Inline []byte
}

// Name returns the callee name of an Invoke (nil for other kinds).
func (m *Message) Name() []byte { return m.Inline[:m.NameLen] }

// InlinePayload returns the inline payload: the input of an inline Invoke
// or Dispatch (the bytes after the name or the trace context), the whole
// inline bytes of any other inline message, and nil when the payload is in
// shm.
func (m *Message) InlinePayload() []byte {
	if m.InShm() {
		return nil
	}
	return m.Inline[m.NameLen:]
}

// ErrInvalid is matched (errors.Is) by every error Decode and Encode return.
var ErrInvalid = errors.New("invalid message")

// Error describes why a message is invalid.
type Error struct{ Reason string }

func (e *Error) Error() string        { return "wire: invalid message: " + e.Reason }
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func invalid(reason string) error { return &Error{reason} }

// check enforces the field rules of docs/protocol.md §1 ("Rules a decoder
// enforces") and returns how many inline bytes the message uses.
func check(h *Header) (int, error) {
	if !h.Kind.Valid() {
		return 0, invalid("unknown message kind " + strconv.Itoa(int(h.Kind)))
	}
	if h.Flags&^(FlagPayloadInShm|FlagCPUTime) != 0 {
		return 0, invalid("unknown flag bits 0x" + strconv.FormatUint(uint64(h.Flags), 16))
	}
	if h.Flags&FlagCPUTime != 0 && h.Kind != Dispatch && h.Kind != Completion && h.Kind != Failure {
		return 0, invalid("CPU_TIME on " + h.Kind.String())
	}
	switch {
	case h.Kind == Invoke:
		if h.NameLen < 1 || h.NameLen > NameMax {
			return 0, invalid("Invoke name_len " + strconv.Itoa(int(h.NameLen)) + " outside 1..64")
		}
	case h.Kind == Dispatch:
		if h.NameLen != 0 && (h.NameLen < TraceContextLen || h.NameLen > TraceLenMax) {
			return 0, invalid("Dispatch name_len " + strconv.Itoa(int(h.NameLen)) + " is neither 0 nor 25..537")
		}
	case h.NameLen != 0:
		return 0, invalid("name_len " + strconv.Itoa(int(h.NameLen)) + " on " + h.Kind.String())
	}
	if h.Kind == Failure {
		if !h.ErrorKind.Valid() {
			return 0, invalid("Failure with invalid error_kind " + strconv.Itoa(int(h.ErrorKind)))
		}
	} else if h.ErrorKind != 0 {
		return 0, invalid("error_kind " + strconv.Itoa(int(h.ErrorKind)) + " on " + h.Kind.String())
	}
	if h.InShm() {
		if h.Kind < Dispatch {
			return 0, invalid("PAYLOAD_IN_SHM on " + h.Kind.String())
		}
		// Only an Invoke's callee name or a Dispatch's trace context stays
		// inline (<= TraceLenMax <= InlineMax) when the payload is in shm.
		return int(h.NameLen), nil
	}
	if h.PayloadLen > InlineMax {
		return 0, invalid("inline payload_len " + strconv.FormatUint(uint64(h.PayloadLen), 10) + " exceeds 960")
	}
	if uint32(h.NameLen) > h.PayloadLen {
		return 0, invalid("name_len " + strconv.Itoa(int(h.NameLen)) + " exceeds payload_len " +
			strconv.FormatUint(uint64(h.PayloadLen), 10))
	}
	return int(h.PayloadLen), nil
}

// Check reports whether h satisfies every header rule of the protocol.
func Check(h *Header) error {
	_, err := check(h)
	return err
}

// Decode decodes and validates one message. buf must be exactly MessageLen
// bytes. The returned Inline aliases buf.
func Decode(buf []byte) (Message, error) {
	var m Message
	if len(buf) != MessageLen {
		return m, invalid("message is " + strconv.Itoa(len(buf)) + " bytes, expected 1024")
	}
	le := binary.LittleEndian
	m.Header = Header{
		Kind:         Kind(le.Uint16(buf[offKind:])),
		Flags:        le.Uint16(buf[offFlags:]),
		PayloadLen:   le.Uint32(buf[offPayloadLen:]),
		CallID:       le.Uint64(buf[offCallID:]),
		ParentCallID: le.Uint64(buf[offParentCallID:]),
		WorkerID:     le.Uint32(buf[offWorkerID:]),
		NameLen:      le.Uint16(buf[offNameLen:]),
		ErrorKind:    ErrorKind(le.Uint16(buf[offErrorKind:])),
		DeadlineUs:   le.Uint64(buf[offDeadlineUs:]),
		SendTsNs:     le.Uint64(buf[offSendTsNs:]),
		Aux:          le.Uint32(buf[offAux:]),
	}
	// Reserved bytes 52..63: one 8-byte and one 4-byte load.
	if le.Uint64(buf[offReserved:]) != 0 || le.Uint32(buf[offReserved+8:]) != 0 {
		return m, invalid("reserved header bytes are not zero")
	}
	used, err := check(&m.Header)
	if err != nil {
		return m, err
	}
	m.Inline = buf[HeaderLen : HeaderLen+used : HeaderLen+used]
	return m, nil
}

// EncodeHeader checks h and writes it to dst[:HeaderLen] (reserved bytes
// zeroed). It returns the number of inline bytes the message must carry.
// The caller fills dst[HeaderLen:] itself; Encode does everything at once.
func EncodeHeader(dst []byte, h *Header) (int, error) {
	used, err := check(h)
	if err != nil {
		return 0, err
	}
	if len(dst) < MessageLen {
		return 0, invalid("encode buffer of " + strconv.Itoa(len(dst)) + " bytes")
	}
	le := binary.LittleEndian
	le.PutUint16(dst[offKind:], uint16(h.Kind))
	le.PutUint16(dst[offFlags:], h.Flags)
	le.PutUint32(dst[offPayloadLen:], h.PayloadLen)
	le.PutUint64(dst[offCallID:], h.CallID)
	le.PutUint64(dst[offParentCallID:], h.ParentCallID)
	le.PutUint32(dst[offWorkerID:], h.WorkerID)
	le.PutUint16(dst[offNameLen:], h.NameLen)
	le.PutUint16(dst[offErrorKind:], uint16(h.ErrorKind))
	le.PutUint64(dst[offDeadlineUs:], h.DeadlineUs)
	le.PutUint64(dst[offSendTsNs:], h.SendTsNs)
	le.PutUint32(dst[offAux:], h.Aux)
	le.PutUint64(dst[offReserved:], 0)
	le.PutUint32(dst[offReserved+8:], 0)
	return used, nil
}

// Encode writes the message h with its inline bytes into dst[:MessageLen].
// The inline bytes may come in several parts (an Invoke's name and input);
// together they must be exactly what h says is inline: payload_len bytes,
// or name_len bytes for an Invoke in shm, or none. The rest of the inline
// area is zeroed.
func Encode(dst []byte, h *Header, inline ...[]byte) error {
	used, err := EncodeHeader(dst, h)
	if err != nil {
		return err
	}
	n := 0
	for _, p := range inline {
		n += len(p)
	}
	if n != used {
		return invalid("inline bytes: got " + strconv.Itoa(n) + ", header says " + strconv.Itoa(used))
	}
	off := HeaderLen
	for _, p := range inline {
		off += copy(dst[off:], p)
	}
	clear(dst[off:MessageLen])
	return nil
}

// Marshal encodes m into a new MessageLen-byte slice.
func Marshal(m *Message) ([]byte, error) {
	buf := make([]byte, MessageLen)
	if err := Encode(buf, &m.Header, m.Inline); err != nil {
		return nil, err
	}
	return buf, nil
}
