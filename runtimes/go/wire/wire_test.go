package wire_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand"
	"path/filepath"
	"runtime"
	"testing"

	"staccato.local/go/internal/vectors"
	"staccato.local/go/wire"
)

func vectorPath(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "testvectors", "message_v1.json")
}

func TestVectors(t *testing.T) {
	f, err := vectors.Load(vectorPath(t))
	if err != nil {
		t.Fatal(err)
	}
	var valid, invalid int
	for _, tc := range f.Tests {
		msg, err := hex.DecodeString(tc.Msg)
		if err != nil {
			t.Fatalf("tcId %d: %v", tc.TcID, err)
		}
		m, derr := wire.Decode(msg)
		switch tc.Result {
		case "valid":
			valid++
			if derr != nil {
				t.Errorf("tcId %d (%s): rejected: %v", tc.TcID, tc.Comment, derr)
				continue
			}
			want, err := vectors.ParseFields(tc.Fields)
			if err != nil {
				t.Fatalf("tcId %d: fields: %v", tc.TcID, err)
			}
			if got := vectors.ToFields(&m); got != want {
				t.Errorf("tcId %d (%s): fields\n got %+v\nwant %+v", tc.TcID, tc.Comment, got, want)
			}
			// Re-encode the decoded message, and encode from the vector's
			// own fields: both must give the message byte for byte.
			out, err := wire.Marshal(&m)
			if err != nil || !bytes.Equal(out, msg) {
				t.Errorf("tcId %d (%s): re-encode differs (err %v)", tc.TcID, tc.Comment, err)
			}
			fm, err := want.ToMessage()
			if err != nil {
				t.Fatalf("tcId %d: %v", tc.TcID, err)
			}
			out, err = wire.Marshal(&fm)
			if err != nil || !bytes.Equal(out, msg) {
				t.Errorf("tcId %d (%s): encode from fields differs (err %v)", tc.TcID, tc.Comment, err)
			}
		case "invalid":
			invalid++
			if derr == nil {
				t.Errorf("tcId %d (%s): accepted an invalid message: %+v", tc.TcID, tc.Comment, m.Header)
			} else if !errors.Is(derr, wire.ErrInvalid) {
				t.Errorf("tcId %d: error %v does not match ErrInvalid", tc.TcID, derr)
			}
		default:
			t.Fatalf("tcId %d: unknown result %q", tc.TcID, tc.Result)
		}
	}
	if valid == 0 || invalid == 0 {
		t.Fatalf("expected valid and invalid cases, got %d/%d", valid, invalid)
	}
	t.Logf("%d valid, %d invalid cases", valid, invalid)
}

func TestEncodeRejectsWhatDecodeRejects(t *testing.T) {
	buf := make([]byte, wire.MessageLen)
	bad := []wire.Header{
		{Kind: 0},
		{Kind: 9},
		{Kind: wire.Dispatch, Flags: 4},
		{Kind: wire.Invoke, Flags: wire.FlagCPUTime, NameLen: 1, PayloadLen: 1},
		{Kind: wire.Dispatch, PayloadLen: 961},
		{Kind: wire.Invoke, PayloadLen: 3},
		{Kind: wire.Invoke, NameLen: 65, PayloadLen: 100},
		{Kind: wire.Invoke, NameLen: 4, PayloadLen: 3},
		{Kind: wire.Dispatch, NameLen: 1, PayloadLen: 1},
		{Kind: wire.Failure},
		{Kind: wire.Failure, ErrorKind: 15},
		{Kind: wire.Completion, ErrorKind: 3},
		{Kind: wire.WorkerHello, Flags: wire.FlagPayloadInShm},
		{Kind: wire.StopWorker, Flags: wire.FlagPayloadInShm},
	}
	for _, h := range bad {
		if err := wire.Encode(buf, &h, make([]byte, min(int(h.PayloadLen), 960))); err == nil {
			t.Errorf("encoded invalid header %+v", h)
		}
	}
	// Inline bytes must match the header exactly.
	h := wire.Header{Kind: wire.Completion, PayloadLen: 5}
	if err := wire.Encode(buf, &h, []byte("abcd")); err == nil {
		t.Error("encoded 4 inline bytes for payload_len 5")
	}
	if err := wire.Encode(buf[:1023], &h, []byte("abcde")); err == nil {
		t.Error("encoded into a short buffer")
	}
}

func TestEncodeZeroesUnusedInlineAndReserved(t *testing.T) {
	buf := bytes.Repeat([]byte{0xAA}, wire.MessageLen)
	h := wire.Header{Kind: wire.Invoke, PayloadLen: 7, NameLen: 3, CallID: 1<<32 | 1, WorkerID: 1}
	if err := wire.Encode(buf, &h, []byte("abc"), []byte("data")); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[52:64], make([]byte, 12)) || !bytes.Equal(buf[64+7:], make([]byte, 960-7)) {
		t.Fatal("reserved or unused inline bytes not zeroed")
	}
	m, err := wire.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Name()) != "abc" || string(m.InlinePayload()) != "data" || m.Header != h {
		t.Fatalf("round trip: %+v %q", m.Header, m.Inline)
	}
}

func TestFieldOffsets(t *testing.T) {
	h := wire.Header{
		Kind: wire.Failure, Flags: 1, PayloadLen: 0x01020304, CallID: 0x1112131415161718,
		ParentCallID: 0x2122232425262728, WorkerID: 0x31323334, ErrorKind: 9,
		DeadlineUs: 0x4142434445464748, SendTsNs: 0x5152535455565758, Aux: 0x61626364,
	}
	buf := make([]byte, wire.MessageLen)
	if err := wire.Encode(buf, &h); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	checks := []struct {
		off  int
		got  uint64
		want uint64
	}{
		{0, uint64(le.Uint16(buf[0:])), 7},
		{2, uint64(le.Uint16(buf[2:])), 1},
		{4, uint64(le.Uint32(buf[4:])), 0x01020304},
		{8, le.Uint64(buf[8:]), 0x1112131415161718},
		{16, le.Uint64(buf[16:]), 0x2122232425262728},
		{24, uint64(le.Uint32(buf[24:])), 0x31323334},
		{28, uint64(le.Uint16(buf[28:])), 0},
		{30, uint64(le.Uint16(buf[30:])), 9},
		{32, le.Uint64(buf[32:]), 0x4142434445464748},
		{40, le.Uint64(buf[40:]), 0x5152535455565758},
		{48, uint64(le.Uint32(buf[48:])), 0x61626364},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("offset %d: got %#x want %#x", c.off, c.got, c.want)
		}
	}
}

// Random buffers: Decode never panics, and whatever it accepts re-encodes
// to the same bytes when the unused inline area is zero.
func TestDecodeRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, wire.MessageLen)
	accepted := 0
	for i := 0; i < 200000; i++ {
		clear(buf)
		// Mostly plausible headers, so that many pass and are compared.
		binary.LittleEndian.PutUint16(buf[0:], uint16(rng.Intn(10)))
		binary.LittleEndian.PutUint16(buf[2:], uint16(rng.Intn(3)))
		binary.LittleEndian.PutUint32(buf[4:], uint32(rng.Intn(1100)))
		binary.LittleEndian.PutUint64(buf[8:], rng.Uint64())
		binary.LittleEndian.PutUint16(buf[28:], uint16(rng.Intn(3)*rng.Intn(40)))
		binary.LittleEndian.PutUint16(buf[30:], uint16(rng.Intn(2)*rng.Intn(11)))
		if rng.Intn(50) == 0 {
			buf[52+rng.Intn(12)] = 1
		}
		m, err := wire.Decode(buf)
		if err != nil {
			continue
		}
		accepted++
		for j := range m.Inline {
			m.Inline[j] = byte(rng.Intn(256))
		}
		out, err := wire.Marshal(&m)
		if err != nil || !bytes.Equal(out, buf) {
			t.Fatalf("accepted %+v but re-encode differs (err %v)", m.Header, err)
		}
	}
	if accepted == 0 {
		t.Fatal("nothing accepted")
	}
}

func BenchmarkDecode(b *testing.B) {
	buf := make([]byte, wire.MessageLen)
	h := wire.Header{Kind: wire.Dispatch, PayloadLen: 5, CallID: 1 << 63}
	if err := wire.Encode(buf, &h, []byte("hello")); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := wire.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	buf := make([]byte, wire.MessageLen)
	h := wire.Header{Kind: wire.Completion, PayloadLen: 5, CallID: 1 << 63}
	p := []byte("hello")
	for i := 0; i < b.N; i++ {
		if err := wire.Encode(buf, &h, p); err != nil {
			b.Fatal(err)
		}
	}
}
