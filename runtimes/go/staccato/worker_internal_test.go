package staccato

import (
	"math"
	"testing"
)

// Call ids are (worker_id << 32) | seq; seq wraps from 2^32-1 to 1, never
// 0, and skips ids still pending.
func TestCallIDSequenceWraps(t *testing.T) {
	w := newWorker(&runtimeState{}, 7, nil)
	w.seq = math.MaxUint32 - 1
	var ids []uint64
	for i := 0; i < 3; i++ {
		id, _, err := w.register()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	want := []uint64{7<<32 | math.MaxUint32, 7<<32 | 1, 7<<32 | 2}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("ids %x, want %x", ids, want)
		}
	}
	// Still pending: 1 and 2 are skipped after the next wrap.
	w.seq = math.MaxUint32
	id, _, _ := w.register()
	if id != 7<<32|3 {
		t.Fatalf("got %x, want %x", id, uint64(7<<32|3))
	}
	if !w.unregister(7<<32|1) || w.unregister(7<<32|1) {
		t.Fatal("unregister")
	}
}

func TestTruncateMessage(t *testing.T) {
	if got := truncateMessage("short"); string(got) != "short" {
		t.Fatal(string(got))
	}
	long := make([]byte, 0, 3000)
	for len(long) < 2990 {
		long = append(long, "€"...) // 3 bytes
	}
	got := truncateMessage(string(long))
	if len(got) > 960 || string(got[len(got)-3:]) != "..." {
		t.Fatalf("%d bytes", len(got))
	}
	for i := 0; i < len(got)-3; i += 3 {
		if string(got[i:i+3]) != "€" {
			t.Fatalf("cut inside a character at %d", i)
		}
	}
}
