// Package buildtest tests runtimes/go/build-function.sh: user packages with
// and without go.mod, subpackages, and the errors a user sees.
package buildtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"staccato.local/go/internal/fakeengine"
	"staccato.local/go/wire"
)

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "build-function.sh")
}

// writeTree creates files (path → content) under a new directory named name.
func writeTree(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	for path, content := range files {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func build(t *testing.T, dir, handler, out string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", script(), dir, handler, out)
	cmd.Dir = t.TempDir() // any working directory
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// run starts the binary as a launcher and calls it once.
func run(t *testing.T, bin, dir string, in []byte) wire.Message {
	t.Helper()
	l := fakeengine.Start(t, "fn", []string{bin}, dir)
	l.Hello()
	w := l.CreateWorker()
	return l.Call(w, fakeengine.Gateway|1, in)
}

const upper = `package %s

import (
	"bytes"

	"staccato.local/go/staccato"
)

func Upper(ctx *staccato.Context, in []byte) ([]byte, error) {
	return bytes.ToUpper(in), nil
}
`

func TestWithoutGoMod(t *testing.T) {
	dir := writeTree(t, "My Func", map[string]string{
		"handler.go": strings.Replace(upper, "%s", "anything", 1),
		"data.txt":   "not go",
	})
	bin := filepath.Join(dir, ".staccato-worker") // where the engine puts it
	if out, err := build(t, dir, "Upper", bin); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The code directory is not modified (no go.mod written into it).
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); !os.IsNotExist(err) {
		t.Fatal("go.mod written into the code directory")
	}
	if m := run(t, bin, dir, []byte("abc")); string(m.Inline) != "ABC" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
	// A rebuild over a binary in use works (rename, not rewrite).
	if out, err := build(t, dir, "Upper", bin); err != nil {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
}

func TestWithGoModAndSubpackage(t *testing.T) {
	dir := writeTree(t, "withmod", map[string]string{
		"go.mod": "module example.com/me/withmod\n\ngo 1.22\n\nrequire staccato.local/go v0.0.0\n\n" +
			"replace staccato.local/go => /nonexistent/ignored/when/not/main\n",
		"handler.go": `package withmod

import (
	"example.com/me/withmod/internal/rev"
	"staccato.local/go/staccato"
)

func Reverse(ctx *staccato.Context, in []byte) ([]byte, error) {
	ctx.Logf("reversing %d bytes", len(in))
	return rev.Bytes(in), nil
}
`,
		"internal/rev/rev.go": `package rev

func Bytes(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[len(b)-1-i] = b[i]
	}
	return out
}
`,
	})
	bin := filepath.Join(t.TempDir(), "bin")
	if out, err := build(t, dir, "Reverse", bin); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if m := run(t, bin, dir, []byte("abc")); string(m.Inline) != "cba" {
		t.Fatalf("%+v %q", m.Header, m.Inline)
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tc := range []struct {
		name, handler string
		files         map[string]string
		want          []string
	}{
		{"compile error", "Handle", map[string]string{"h.go": "package h\n\nfunc Handle() { undefinedThing() }\n"},
			[]string{"h.go:3", "undefined: undefinedThing"}},
		{"wrong signature", "Handle", map[string]string{"h.go": "package h\n\nfunc Handle(in []byte) []byte { return in }\n"},
			[]string{"cannot use fn.Handle", "building"}},
		{"missing handler", "Nope", map[string]string{"h.go": strings.Replace(upper, "%s", "h", 1)},
			[]string{"undefined: fn.Nope"}},
		{"unexported handler", "upper", map[string]string{"h.go": strings.Replace(upper, "%s", "h", 1)},
			[]string{"exported Go function"}},
		{"package main", "Handle", map[string]string{"main.go": "package main\n\nfunc main() {}\n"},
			[]string{"package main"}},
		{"no go files", "Handle", map[string]string{"README": "x"},
			[]string{"no .go files"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTree(t, "f", tc.files)
			bin := filepath.Join(t.TempDir(), "bin")
			out, err := build(t, dir, tc.handler, bin)
			if err == nil {
				t.Fatalf("build succeeded:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "staccato-go-build.") {
				t.Errorf("temporary path in the output:\n%s", out)
			}
			if _, err := os.Stat(bin); !os.IsNotExist(err) {
				t.Error("binary left behind")
			}
		})
	}
}
