package fakeengine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"staccato.local/go/wire"
)

// Launcher is one launcher process and the engine's ends of its channels.
// Its methods fail the test on error; call them from the test goroutine.
type Launcher struct {
	t      testing.TB
	Name   string
	IPC    string // STACCATO_IPC_DIR
	Shm    string
	Cmd    *exec.Cmd
	Ch0    *Chan
	stderr string

	mu      sync.Mutex
	Workers map[uint32]*Chan
	next    uint32

	waitErr error
	exited  chan struct{}
	closing atomic.Bool
}

// Start creates the function's IPC directory and channel 0 and starts argv
// as its launcher in cwd with the protocol's environment plus env.
func Start(t testing.TB, name string, argv []string, cwd string, env ...string) *Launcher {
	t.Helper()
	tmp := t.TempDir()
	l := &Launcher{
		t:       t,
		Name:    name,
		IPC:     filepath.Join(tmp, "ipc", name+".1"),
		Workers: make(map[uint32]*Chan),
		next:    1,
		stderr:  filepath.Join(tmp, name+".log"),
		exited:  make(chan struct{}),
	}
	l.Shm = filepath.Join(l.IPC, "shm")
	if err := os.MkdirAll(l.Shm, 0o700); err != nil {
		t.Fatal(err)
	}
	var err error
	if l.Ch0, err = NewChan(l.IPC, 0); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(l.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	l.Cmd = exec.Command(argv[0], argv[1:]...)
	l.Cmd.Dir = cwd
	l.Cmd.Env = append(os.Environ(),
		"STACCATO_FUNCTION="+name,
		"STACCATO_IPC_DIR="+l.IPC,
	)
	l.Cmd.Env = append(l.Cmd.Env, env...)
	l.Cmd.Stdout = logf
	l.Cmd.Stderr = logf
	if err := l.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		l.waitErr = l.Cmd.Wait()
		close(l.exited)
	}()
	t.Cleanup(l.Close)
	return l
}

// Close kills the launcher (if still running) and closes every channel.
func (l *Launcher) Close() {
	l.closing.Store(true)
	select {
	case <-l.exited:
	default:
		l.Cmd.Process.Kill()
		select {
		case <-l.exited:
		case <-time.After(Timeout):
		}
	}
	if log := l.Stderr(); strings.Contains(log, "WARNING: DATA RACE") {
		l.t.Errorf("launcher %s: data race:\n%s", l.Name, log)
	}
	l.Ch0.Close()
	l.mu.Lock()
	for _, c := range l.Workers {
		c.Close()
	}
	l.mu.Unlock()
}

// Wait waits for the launcher to exit and returns its exit status.
func (l *Launcher) Wait(timeout time.Duration) (int, error) {
	select {
	case <-l.exited:
		return l.Cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("launcher %s still running after %v", l.Name, timeout)
	}
}

// Exited reports whether the launcher process has exited.
func (l *Launcher) Exited() bool {
	select {
	case <-l.exited:
		return true
	default:
		return false
	}
}

// Closing reports whether Close has been called (the test is over).
func (l *Launcher) Closing() bool { return l.closing.Load() }

// Stderr returns what the launcher wrote to stdout and stderr so far.
func (l *Launcher) Stderr() string {
	b, _ := os.ReadFile(l.stderr)
	return string(b)
}

// Hello receives and checks the LauncherHello.
func (l *Launcher) Hello() wire.Message {
	l.t.Helper()
	m, err := l.Ch0.Recv(Timeout)
	if err != nil {
		l.t.Fatalf("waiting for LauncherHello: %v\nlauncher log:\n%s", err, l.Stderr())
	}
	if m.Kind != wire.LauncherHello || m.WorkerID != 0 || m.Aux != uint32(l.Cmd.Process.Pid) {
		l.t.Fatalf("bad LauncherHello %+v (pid %d)", m.Header, l.Cmd.Process.Pid)
	}
	return m
}

// CreateWorker makes the next worker's channel, sends CreateWorker and
// checks its WorkerHello.
func (l *Launcher) CreateWorker() *Chan {
	l.t.Helper()
	c, err := l.NewWorker()
	if err != nil {
		l.t.Fatal(err)
	}
	return c
}

// NewWorker is CreateWorker returning an error (any goroutine).
func (l *Launcher) NewWorker() (*Chan, error) {
	l.mu.Lock()
	id := l.next
	l.next++
	c, err := NewChan(l.IPC, id)
	if err == nil {
		l.Workers[id] = c
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := l.Ch0.Send(wire.Header{Kind: wire.CreateWorker, WorkerID: id}); err != nil {
		return nil, err
	}
	m, err := c.Recv(Timeout)
	if err != nil {
		return nil, fmt.Errorf("waiting for WorkerHello %d: %w\nlauncher log:\n%s", id, err, l.Stderr())
	}
	if m.Kind != wire.WorkerHello || m.WorkerID != id || m.Aux != uint32(l.Cmd.Process.Pid) {
		return nil, fmt.Errorf("bad WorkerHello %+v", m.Header)
	}
	return c, nil
}

// ShmPath is the payload file of a call in this function's shm directory.
func (l *Launcher) ShmPath(callID uint64, suffix byte) string {
	return filepath.Join(l.Shm, fmt.Sprintf("%016x.%c", callID, suffix))
}

// ShmFiles lists the shm directory.
func (l *Launcher) ShmFiles() []string {
	ents, _ := os.ReadDir(l.Shm)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// SendPayload sends a message carrying data the way the engine does: inline
// when it fits, else in the shm file (suffix i for Dispatch, o for replies).
func (l *Launcher) SendPayload(c *Chan, h wire.Header, data []byte) error {
	if len(data) <= wire.InlineMax {
		h.PayloadLen = uint32(len(data))
		return c.Send(h, data)
	}
	suffix := byte('o')
	if h.Kind == wire.Dispatch {
		suffix = 'i'
	}
	if err := os.WriteFile(l.ShmPath(h.CallID, suffix), data, 0o600); err != nil {
		return err
	}
	h.Flags |= wire.FlagPayloadInShm
	h.PayloadLen = uint32(len(data))
	return c.Send(h)
}

// Dispatch sends a Dispatch with input data.
func (l *Launcher) Dispatch(c *Chan, callID, parent, deadlineUs uint64, data []byte) {
	l.t.Helper()
	h := wire.Header{Kind: wire.Dispatch, CallID: callID, ParentCallID: parent, DeadlineUs: deadlineUs}
	if err := l.SendPayload(c, h, data); err != nil {
		l.t.Fatal(err)
	}
}

// DispatchTraced sends a Dispatch whose inline area starts with trace (the
// call's trace context and state), the input after it or in shm.
func (l *Launcher) DispatchTraced(c *Chan, callID uint64, trace, data []byte) {
	l.t.Helper()
	h := wire.Header{Kind: wire.Dispatch, CallID: callID, NameLen: uint16(len(trace))}
	var err error
	if len(trace)+len(data) <= wire.InlineMax {
		h.PayloadLen = uint32(len(trace) + len(data))
		err = c.Send(h, trace, data)
	} else if err = os.WriteFile(l.ShmPath(callID, 'i'), data, 0o600); err == nil {
		h.Flags |= wire.FlagPayloadInShm
		h.PayloadLen = uint32(len(data))
		err = c.Send(h, trace)
	}
	if err != nil {
		l.t.Fatal(err)
	}
}

// Reply answers an Invoke: Completion with data, or Failure of errKind.
func (l *Launcher) Reply(c *Chan, callID uint64, errKind wire.ErrorKind, data []byte) {
	l.t.Helper()
	h := wire.Header{Kind: wire.Completion, CallID: callID}
	if errKind != 0 {
		h.Kind, h.ErrorKind = wire.Failure, errKind
	}
	if err := l.SendPayload(c, h, data); err != nil {
		l.t.Fatal(err)
	}
}

// ReadPayload returns a received message's payload (for an Invoke: the
// input); shm files are read, checked against payload_len and unlinked.
func (l *Launcher) ReadPayload(m *wire.Message, suffix byte) ([]byte, error) {
	if !m.InShm() {
		return append([]byte(nil), m.InlinePayload()...), nil
	}
	path := l.ShmPath(m.CallID, suffix)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	syscall.Unlink(path)
	if len(data) != int(m.PayloadLen) {
		return nil, fmt.Errorf("%s: %d bytes, payload_len %d", path, len(data), m.PayloadLen)
	}
	return data, nil
}

// Payload is ReadPayload failing the test on error.
func (l *Launcher) Payload(m *wire.Message, suffix byte) []byte {
	l.t.Helper()
	data, err := l.ReadPayload(m, suffix)
	if err != nil {
		l.t.Fatal(err)
	}
	return data
}

// Recv receives the next message on c, failing the test on error.
func (l *Launcher) Recv(c *Chan) wire.Message {
	l.t.Helper()
	m, err := c.Recv(Timeout)
	if err != nil {
		l.t.Fatalf("%v\nlauncher log:\n%s", err, l.Stderr())
	}
	return m
}

// Call dispatches data and waits for the result message of that call.
func (l *Launcher) Call(c *Chan, callID uint64, data []byte) wire.Message {
	l.t.Helper()
	l.Dispatch(c, callID, 0, 0, data)
	m := l.Recv(c)
	if m.CallID != callID || m.WorkerID != c.ID || (m.Kind != wire.Completion && m.Kind != wire.Failure) {
		l.t.Fatalf("expected the result of %016x, got %+v %q", callID, m.Header, m.Inline)
	}
	return m
}
