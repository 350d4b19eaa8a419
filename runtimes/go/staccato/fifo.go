package staccato

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"staccato.local/go/wire"
)

// ioMode selects how a channel's FIFOs are read and written.
//
//   - ioPoll: the FIFOs are non-blocking *os.File values registered with Go's
//     netpoller (epoll). A goroutine waiting for a message is parked; no OS
//     thread is held. With STACCATO_SPIN_US it retries read(2) with yields
//     before parking, but that spin starves the netpoller (a yielding
//     goroutine keeps the run queue non-empty, and the scheduler polls the
//     network only when it is empty): other channels' messages wait out the
//     spin. Measured: 65 us per internal call instead of 17 at GOMAXPROCS=1.
//   - ioBlock: raw descriptors. Without spinning, plain blocking read(2),
//     which is slow at small GOMAXPROCS (the goroutine the reader starts
//     waits until sysmon retakes the P from the thread blocked in read:
//     ~100 us per round trip). With spinning, the descriptor is non-blocking:
//     read(2) with yields for STACCATO_SPIN_US, then ppoll(2), like the C
//     runtime; the fastest configuration measured (13 us per internal call).
//
// The default (Serve) is ioBlock when STACCATO_SPIN_US > 0, else ioPoll.
type ioMode int

const (
	ioPoll ioMode = iota
	ioBlock
)

func (m ioMode) String() string {
	if m == ioBlock {
		return "block"
	}
	return "poll"
}

// readChunk is how many bytes one read(2) may take: several messages at a
// time when replies arrive in a burst (fan-out), one syscall each otherwise.
const readChunk = 16 * wire.MessageLen

var errPartialMessage = errors.New("end of file in the middle of a message")

// fifo is one channel: e2w (read) and w2e (write).
type fifo struct {
	mode   ioMode
	spinNs int64
	// How long the last read with a spin budget waited for its bytes, and
	// how many times reads yielded in a spin (for tests).
	lastWaitNs int64
	spinYields int

	// ioPoll
	rf, wf *os.File
	rc     syscall.RawConn

	// ioBlock
	rfd, wfd int

	// Receive buffer: buf[start:end] holds bytes read but not yet returned.
	buf        []byte
	start, end int
}

// fifoPaths is channel id's FIFO pair in dir (docs/protocol.md, "Channels
// and FIFOs").
func fifoPaths(dir string, id uint32) (e2w, w2e string) {
	base := filepath.Join(dir, strconv.FormatUint(uint64(id), 10))
	return base + ".e2w", base + ".w2e"
}

// openFifo opens channel id in dir. The engine holds both FIFOs open before
// it asks for the channel (docs/protocol.md, "Channels and FIFOs"), so the
// opens never wait; opening with O_NONBLOCK makes a broken promise fail
// with ENXIO instead of hanging. Descriptors are close-on-exec, so a child
// process of a handler never keeps w2e open (which would hide our death).
func openFifo(dir string, id uint32, mode ioMode, spinUs int64) (*fifo, error) {
	e2w, w2e := fifoPaths(dir, id)
	rfd, err := syscall.Open(e2w, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: e2w, Err: err}
	}
	wfd, err := syscall.Open(w2e, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		syscall.Close(rfd)
		return nil, &os.PathError{Op: "open", Path: w2e, Err: err}
	}
	f := &fifo{mode: mode, spinNs: spinUs * 1000, rfd: rfd, wfd: wfd, buf: make([]byte, readChunk)}
	switch mode {
	case ioPoll:
		// A non-blocking descriptor given to os.NewFile is registered with
		// the netpoller.
		f.rf = os.NewFile(uintptr(rfd), e2w)
		f.wf = os.NewFile(uintptr(wfd), w2e)
		if f.rc, err = f.rf.SyscallConn(); err != nil {
			f.close()
			return nil, err
		}
	case ioBlock:
		err = syscall.SetNonblock(wfd, false)
		if err == nil && f.spinNs == 0 {
			err = syscall.SetNonblock(rfd, false)
		}
		if err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// next returns the next whole message (valid until the following call), or
// io.EOF when the engine closed e2w.
func (f *fifo) next() ([]byte, error) {
	for f.end-f.start < wire.MessageLen {
		if f.start > 0 {
			// Keep a partial message (never seen in practice: message writes
			// are atomic) at the front of the buffer.
			f.end = copy(f.buf, f.buf[f.start:f.end])
			f.start = 0
		}
		n, err := f.read(f.buf[f.end:])
		if n > 0 {
			f.end += n
			continue
		}
		if err == nil || err == io.EOF {
			if f.end > f.start {
				return nil, errPartialMessage
			}
			return nil, io.EOF
		}
		return nil, err
	}
	msg := f.buf[f.start : f.start+wire.MessageLen]
	f.start += wire.MessageLen
	if f.start == f.end {
		f.start, f.end = 0, 0
	}
	return msg, nil
}

// read does one read of at most len(p) bytes (0, nil means end of file).
func (f *fifo) read(p []byte) (int, error) {
	switch {
	case f.mode == ioPoll && f.spinNs == 0:
		n, err := f.rf.Read(p)
		if err == io.EOF {
			return 0, nil
		}
		return n, err
	case f.mode == ioPoll:
		return f.readPollSpin(p) // only with STACCATO_GO_IO=poll
	case f.spinNs == 0:
		for {
			n, err := syscall.Read(f.rfd, p)
			if err == syscall.EINTR {
				continue
			}
			return max(n, 0), err
		}
	default:
		return f.readBlockSpin(p)
	}
}

// readPollSpin retries read(2) for up to spinNs, yielding between tries,
// before it lets the netpoller park the goroutine. Kept for measurement
// (STACCATO_GO_IO=poll with STACCATO_SPIN_US): see ioPoll for why it loses.
func (f *fifo) readPollSpin(p []byte) (int, error) {
	var n int
	var err error
	until := nanotime() + f.spinNs
	rerr := f.rc.Read(func(fd uintptr) bool {
		for {
			n, err = syscall.Read(int(fd), p)
			if err == syscall.EINTR {
				continue
			}
			if err != syscall.EAGAIN {
				return true
			}
			if nanotime() >= until {
				return false // park until readable; later calls do not spin
			}
			spinYield()
		}
	})
	if rerr != nil {
		return 0, rerr
	}
	return max(n, 0), err
}

// spinQuietX: a read spins only while messages come quickly; when the last
// one took more than spinQuietX times the spin budget to arrive, the next
// read blocks at once. At a low rate a spin catches nothing, and it does
// harm: a worker still spinning after its reply keeps the engine's vCPU
// busy when the engine answers the client, so the kernel wakes the client
// on another vCPU and each call wakes a halted vCPU twice (as in the C
// runtime; BENCHMARKS.md, "On an Intel guest").
const spinQuietX = 10

// readBlockSpin: non-blocking read(2) with yields for up to spinNs, then
// ppoll(2) in the kernel (blocking this thread), then read again.
func (f *fifo) readBlockSpin(p []byte) (int, error) {
	start := nanotime()
	until := start + f.spinNs
	if f.lastWaitNs > f.spinNs*spinQuietX {
		until = 0
	}
	for {
		n, err := syscall.Read(f.rfd, p)
		switch err {
		case nil:
			f.lastWaitNs = nanotime() - start
			return n, nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
		default:
			return 0, err
		}
		if until != 0 && nanotime() < until {
			f.spinYields++
			spinYield()
			continue
		}
		until = 0
		if err := pollIn(f.rfd); err != nil {
			return 0, err
		}
	}
}

// spinYield gives the CPU away for a moment: first to other goroutines of
// this process (the handler we are waiting for may need this P), then to
// other processes (the engine or the callee may need this vCPU). A spin that
// does not yield costs whole time slices to peers sharing a vCPU
// (BENCHMARKS.md: 433 us per internal call in C before yielding).
func spinYield() {
	runtime.Gosched()
	syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}

type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn_ = 0x1

// pollIn waits in ppoll(2) until fd is readable or hung up.
func pollIn(fd int) error {
	p := pollFd{fd: int32(fd), events: pollIn_}
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, 0, 0, 0, 0)
		if e == 0 {
			return nil
		}
		if e != syscall.EINTR {
			return e
		}
	}
}

// write sends one whole message. A message is at most PIPE_BUF bytes, so
// the write is atomic: all of it or (non-blocking) EAGAIN, never a part.
func (f *fifo) write(msg []byte) error {
	if f.mode == ioPoll {
		_, err := f.wf.Write(msg) // waits in the netpoller on EAGAIN
		return err
	}
	for {
		n, err := syscall.Write(f.wfd, msg)
		if err == syscall.EINTR {
			continue
		}
		if err == nil && n != len(msg) {
			err = io.ErrShortWrite
		}
		return err
	}
}

// closeWrite closes w2e: the engine sees end of file at once.
func (f *fifo) closeWrite() {
	if f.mode == ioPoll {
		f.wf.Close()
	} else {
		syscall.Close(f.wfd)
	}
}

// closeRead closes e2w. In ioPoll mode this is safe from any goroutine and
// wakes a reader parked in the netpoller. In ioBlock mode only the reading
// goroutine may call it (closing a descriptor another thread is blocked
// reading neither wakes it nor is safe against descriptor reuse).
func (f *fifo) closeRead() {
	if f.mode == ioPoll {
		f.rf.Close()
	} else {
		syscall.Close(f.rfd)
	}
}

func (f *fifo) close() {
	f.closeWrite()
	f.closeRead()
}
