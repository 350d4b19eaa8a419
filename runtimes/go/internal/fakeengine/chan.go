// Package fakeengine plays the engine's side of docs/protocol.md §1 for
// tests: real FIFOs, real shm payload files, real launcher processes.
//
// Chan is one channel seen from the engine; Launcher is one launcher
// process with its channels; Router is a small engine that runs several
// functions and routes their internal calls (Invoke → Dispatch to the callee,
// result back, shm files renamed between the functions' directories) the way
// the real engine does. Every wait has a timeout.
package fakeengine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"staccato.local/go/wire"
)

// Timeout is the default for every wait.
const Timeout = 10 * time.Second

// Gateway is bit 63, set in call ids of calls from the gateway.
const Gateway = uint64(1) << 63

// ErrTimeout is returned when nothing arrived in time.
var ErrTimeout = errors.New("timed out waiting for a message")

// Chan is the engine's end of a channel: e2w opened O_RDWR, w2e opened
// O_RDONLY|O_NONBLOCK, as the engine does.
type Chan struct {
	ID  uint32
	e2w *os.File
	w2e *os.File
	rc  syscall.RawConn

	wmu sync.Mutex

	rmu  sync.Mutex
	buf  []byte
	seen bool // the worker has written something (its FIFO end is open)
}

// NewChan creates both FIFOs of channel id in dir and opens the engine's
// ends.
func NewChan(dir string, id uint32) (*Chan, error) {
	base := filepath.Join(dir, strconv.FormatUint(uint64(id), 10))
	for _, s := range []string{".e2w", ".w2e"} {
		if err := syscall.Mkfifo(base+s, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", base+s, err)
		}
	}
	e2w, err := os.OpenFile(base+".e2w", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	fd, err := syscall.Open(base+".w2e", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		e2w.Close()
		return nil, err
	}
	w2e := os.NewFile(uintptr(fd), base+".w2e") // non-blocking: netpoller, deadlines work
	rc, err := w2e.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &Chan{ID: id, e2w: e2w, w2e: w2e, rc: rc}, nil
}

// Send encodes and writes one message. The worker id is the channel's
// unless the message is a CreateWorker.
func (c *Chan) Send(h wire.Header, inline ...[]byte) error {
	if h.Kind != wire.CreateWorker {
		h.WorkerID = c.ID
	}
	buf := make([]byte, wire.MessageLen)
	if err := wire.Encode(buf, &h, inline...); err != nil {
		return err
	}
	return c.SendRaw(buf)
}

// SendRaw writes bytes as they are (to test invalid messages).
func (c *Chan) SendRaw(buf []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.e2w.Write(buf)
	return err
}

// fill reads more bytes; false at end of file.
func (c *Chan) fill(deadline time.Time) (bool, error) {
	if err := c.w2e.SetReadDeadline(deadline); err != nil {
		return false, err
	}
	tmp := make([]byte, 64*1024)
	var n int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), tmp)
			if rerr == syscall.EINTR {
				continue
			}
			if rerr == syscall.EAGAIN {
				return false
			}
			// A FIFO nobody has opened for writing yet reads as end of
			// file: wait for the worker to open it and write.
			if rerr == nil && n == 0 && !c.seen {
				return false
			}
			return true
		}
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, ErrTimeout
	}
	if err != nil {
		return false, err
	}
	if rerr != nil {
		return false, rerr
	}
	if n == 0 {
		return false, nil
	}
	c.seen = true
	c.buf = append(c.buf, tmp[:n]...)
	return true, nil
}

// Recv waits for the next message (its Inline is a copy).
func (c *Chan) Recv(timeout time.Duration) (wire.Message, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	deadline := time.Now().Add(timeout)
	for len(c.buf) < wire.MessageLen {
		ok, err := c.fill(deadline)
		if err != nil {
			return wire.Message{}, fmt.Errorf("channel %d: %w", c.ID, err)
		}
		if !ok {
			return wire.Message{}, fmt.Errorf("channel %d: end of file", c.ID)
		}
	}
	raw := make([]byte, wire.MessageLen)
	copy(raw, c.buf)
	c.buf = c.buf[wire.MessageLen:]
	m, err := wire.Decode(raw)
	if err != nil {
		return m, fmt.Errorf("channel %d: %w", c.ID, err)
	}
	return m, nil
}

// ExpectEOF waits for end of file on w2e (the worker closed its end); any
// message before it is an error.
func (c *Chan) ExpectEOF(timeout time.Duration) error {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := c.fill(deadline)
		if err != nil {
			return fmt.Errorf("channel %d: %w", c.ID, err)
		}
		if len(c.buf) > 0 {
			return fmt.Errorf("channel %d: %d unexpected bytes before end of file", c.ID, len(c.buf))
		}
		if !ok {
			return nil
		}
	}
}

// CloseE2W drops the engine's end of e2w: the worker reads end of file.
func (c *Chan) CloseE2W() { c.e2w.Close() }

// Close closes both of the engine's ends.
func (c *Chan) Close() {
	c.e2w.Close()
	c.w2e.Close()
}
