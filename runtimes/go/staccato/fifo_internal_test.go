package staccato

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"staccato.local/go/wire"
)

// A read spins only while messages come quickly: after a wait longer than
// spinQuietX times the spin budget, the next read blocks at once. The
// engine here is a goroutine that sends one message after each gap.
func TestReadSpinsOnlyWhileMessagesComeQuickly(t *testing.T) {
	dir := t.TempDir()
	for _, s := range []string{"1.e2w", "1.w2e"} {
		if err := syscall.Mkfifo(filepath.Join(dir, s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Both held open by the engine, as the protocol says.
	e2w, err := syscall.Open(filepath.Join(dir, "1.e2w"), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(e2w)
	w2e, err := syscall.Open(filepath.Join(dir, "1.w2e"), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(w2e)
	const spin = 20 * time.Millisecond // quiet threshold: 10 x 20 ms
	f, err := openFifo(dir, 1, ioBlock, spin.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	gaps := []time.Duration{300 * time.Millisecond, 60 * time.Millisecond, 60 * time.Millisecond}
	go func() {
		msg := make([]byte, wire.MessageLen)
		for _, g := range gaps {
			time.Sleep(g)
			syscall.Write(e2w, msg)
		}
	}()
	yields := make([]int, len(gaps))
	for i := range gaps {
		y0 := f.spinYields
		if _, err := f.next(); err != nil {
			t.Fatal(err)
		}
		yields[i] = f.spinYields - y0
	}
	// 1: nothing before it, so it spins (then blocks); it waited 300 ms.
	// 2: after that quiet wait it blocks at once.
	// 3: the wait before it (60 ms) was within the threshold: it spins.
	if yields[0] == 0 {
		t.Error("the first read did not spin")
	}
	if yields[1] != 0 {
		t.Errorf("a read after a wait over %dx the spin budget spun (%d yields)", spinQuietX, yields[1])
	}
	if yields[2] == 0 {
		t.Errorf("a read after a wait within %dx the spin budget did not spin", spinQuietX)
	}
}
