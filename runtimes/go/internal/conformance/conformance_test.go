// Package conformance tests the Go conformance functions
// (conformance/functions/go) the way conformance/test_conformance.py does,
// but against internal/fakeengine's Router instead of a real engine: each
// function is built from a copy of its source directory with
// build-function.sh (as the engine does at deploy) and started as a
// launcher; internal calls are routed between them.
package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"staccato.local/go/internal/fakeengine"
	"staccato.local/go/wire"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
}

// The roles of conformance/README.md with the handler, source and timeout
// of conformance/functions/go/staccato.yml.
var roles = []struct {
	role, handler string
	timeout       time.Duration
}{
	{"nop", "Nop", 30 * time.Second},
	{"echo", "Echo", 30 * time.Second},
	{"fail", "Fail", 30 * time.Second},
	{"call", "Call", 30 * time.Second},
	{"deadline", "Deadline", 60 * time.Second},
	{"chain-deadline", "ChainDeadline", 5 * time.Second},
	{"fanout", "Fanout", 30 * time.Second},
	{"log", "Log", 30 * time.Second},
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	out, err := exec.Command("cp", "-a", from+"/.", to).CombinedOutput()
	if err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
}

// The manifest names exactly these functions with these settings.
func TestManifest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "conformance", "functions", "go", "staccato.yml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, r := range roles {
		block := regexp.MustCompile(`(?m)^  conf-go-` + regexp.QuoteMeta(r.role) + `:\n((?:    .*\n)+)`).FindStringSubmatch(text)
		if block == nil {
			t.Fatalf("conf-go-%s missing", r.role)
		}
		for _, want := range []string{"runtime: go\n", "handler: " + r.handler + "\n", "source: conf\n"} {
			if !strings.Contains(block[1], want) {
				t.Errorf("conf-go-%s: no %q", r.role, want)
			}
		}
		if strings.Contains(block[1], "timeout:") != (r.timeout != 30*time.Second) ||
			(r.timeout != 30*time.Second && !strings.Contains(block[1], fmt.Sprintf("timeout: %ds\n", int(r.timeout.Seconds())))) {
			t.Errorf("conf-go-%s: timeout", r.role)
		}
	}
}

// Built once per test binary run: role → (code dir, binary).
type built struct{ code, bin string }

func buildAll(t *testing.T) map[string]built {
	root := repoRoot()
	script := filepath.Join(root, "runtimes", "go", "build-function.sh")
	src := filepath.Join(root, "conformance", "functions", "go", "conf")
	out := map[string]built{}
	for _, role := range roles {
		code := filepath.Join(t.TempDir(), "code") // the engine's copy of the source
		if err := os.Mkdir(code, 0o755); err != nil {
			t.Fatal(err)
		}
		copyDir(t, src, code)
		bin := filepath.Join(code, ".staccato-worker")
		cmd := exec.Command("bash", script, code, role.handler, bin)
		cmd.Dir = t.TempDir() // any working directory
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building conf-go-%s: %v\n%s", role.role, err, b)
		}
		out[role.role] = built{code, bin}
	}
	return out
}

// With the engine's worker spin on (30 µs: the block I/O mode) and off
// (the netpoller).
func TestConformanceFunctions(t *testing.T) {
	bins := buildAll(t)
	for _, spin := range []string{"30", "0"} {
		t.Run("spin_us="+spin, func(t *testing.T) { conformance(t, bins, "STACCATO_SPIN_US="+spin) })
	}
}

func conformance(t *testing.T, bins map[string]built, env ...string) {
	r := fakeengine.NewRouter(t)
	launchers := map[string]*fakeengine.Launcher{}
	for _, role := range roles {
		name := "conf-go-" + role.role
		b := bins[role.role]
		launchers[name] = r.Add(name, []string{b.bin}, b.code, role.timeout, 16, env...)
	}
	call := func(role string, in []byte) fakeengine.Result {
		t.Helper()
		res, err := r.Call("conf-go-"+role, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	ok := func(role string, in []byte) []byte {
		t.Helper()
		res := call(role, in)
		if res.ErrKind != 0 {
			t.Fatalf("%s: error %v: %s", role, res.ErrKind, res.Data)
		}
		return res.Data
	}

	t.Run("nop", func(t *testing.T) {
		if out := ok("nop", []byte("ignored")); len(out) != 0 {
			t.Fatalf("%q", out)
		}
	})
	t.Run("echo external and internal", func(t *testing.T) {
		for _, n := range []int{0, 960, 961, 1 << 20} {
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(i * 7)
			}
			if out := ok("echo", data); !bytes.Equal(out, data) {
				t.Fatalf("echo %d bytes: got %d", n, len(out))
			}
			if out := ok("call", append([]byte("conf-go-echo:"), data...)); !bytes.Equal(out, data) {
				t.Fatalf("call echo %d bytes: got %d", n, len(out))
			}
		}
		for name, l := range launchers {
			if files := l.ShmFiles(); len(files) != 0 {
				t.Errorf("%s: shm files left: %v", name, files)
			}
		}
	})
	t.Run("fail", func(t *testing.T) {
		res := call("fail", []byte("boom"))
		if res.ErrKind != wire.FunctionError || string(res.Data) != "conformance failure: boom" {
			t.Fatalf("%v %q", res.ErrKind, res.Data)
		}
	})
	t.Run("callee errors", func(t *testing.T) {
		var e struct {
			ErrorKind string `json:"error_kind"`
			Message   string `json:"message"`
		}
		if err := json.Unmarshal(ok("call", []byte("conf-nope-missing:x")), &e); err != nil || e.ErrorKind != "not_found" {
			t.Fatalf("%+v %v", e, err)
		}
		if err := json.Unmarshal(ok("call", []byte("conf-go-fail:why")), &e); err != nil ||
			e.ErrorKind != "function_error" || !strings.Contains(e.Message, "conformance failure: why") {
			t.Fatalf("%+v %v", e, err)
		}
	})
	type deadlineOut struct {
		CallID       string  `json:"call_id"`
		ParentCallID string  `json:"parent_call_id"`
		DeadlineUs   float64 `json:"deadline_us"`
		RemainingMs  float64 `json:"remaining_ms"`
	}
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	t.Run("deadline", func(t *testing.T) {
		before := float64(time.Now().UnixMicro())
		res := call("deadline", nil)
		var d deadlineOut
		if err := json.Unmarshal(res.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.CallID != fmt.Sprintf("%016x", res.CallID) || d.ParentCallID != "0000000000000000" ||
			!(before+50e6 < d.DeadlineUs && d.DeadlineUs <= float64(time.Now().UnixMicro())+60e6+1e5) ||
			!(50_000 < d.RemainingMs && d.RemainingMs <= 60_000) {
			t.Fatalf("%s", res.Data)
		}
	})
	t.Run("chain-deadline", func(t *testing.T) {
		before := float64(time.Now().UnixMicro())
		res := call("chain-deadline", nil)
		outer := fmt.Sprintf("%016x", res.CallID)
		var d deadlineOut
		if err := json.Unmarshal(res.Data, &d); err != nil {
			t.Fatalf("%v: %s", err, res.Data)
		}
		// The callee's call id is an internal one, (worker << 32) | seq, and
		// its parent a gateway call id.
		if !hex16.MatchString(d.CallID) || d.CallID[0] != '0' || d.ParentCallID != outer || d.DeadlineUs > before+5e6+2e5 || !(0 < d.RemainingMs && d.RemainingMs <= 5000) {
			t.Fatalf("%s", res.Data)
		}
	})
	t.Run("fanout", func(t *testing.T) {
		res := call("fanout", nil)
		var outs []string
		if err := json.Unmarshal(res.Data, &outs); err != nil {
			t.Fatalf("%v: %s", err, res.Data)
		}
		if fmt.Sprint(outs) != "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]" {
			t.Fatalf("%q", outs)
		}
		// Concurrently: several of the 16 calls were in flight at once.
		n := r.MaxInFlight(res.CallID)
		t.Logf("at most %d of 16 calls in flight at once", n)
		if n < 2 {
			t.Fatalf("calls were not concurrent (at most %d in flight)", n)
		}
	})
	t.Run("log", func(t *testing.T) {
		marker := fmt.Sprintf("m%d-%d", os.Getpid(), time.Now().UnixNano())
		if out := ok("log", []byte(marker)); string(out) != "ok" {
			t.Fatalf("%q", out)
		}
		line := regexp.MustCompile(`(?m)^\[conf-go-log [0-9a-f]{16}\] conformance log ` + marker + `$`)
		deadline := time.Now().Add(3 * time.Second)
		for !line.MatchString(launchers["conf-go-log"].Stderr()) {
			if time.Now().After(deadline) {
				t.Fatalf("log line not found:\n%s", launchers["conf-go-log"].Stderr())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
