package staccato

// The cross-language contract (testvectors/contract_v1.json) against this
// runtime's own tables: error kind names, payload and channel file names,
// and the STACCATO_* variables it reads.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"staccato.local/go/wire"
)

type contract struct {
	ErrorKinds []struct {
		Code int    `json:"code"`
		Name string `json:"name"`
	} `json:"error_kinds"`
	PayloadFiles []struct {
		CallID string `json:"call_id"`
		Kind   string `json:"kind"`
		Path   string `json:"path"`
	} `json:"payload_files"`
	ChannelFiles []struct {
		ID  uint32 `json:"id"`
		E2W string `json:"e2w"`
		W2E string `json:"w2e"`
	} `json:"channel_files"`
	Env struct {
		Launcher []string            `json:"launcher"`
		Runtime  map[string][]string `json:"runtime"`
	} `json:"env"`
}

func here() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func loadContract(t *testing.T) contract {
	raw, err := os.ReadFile(filepath.Join(here(), "..", "..", "..", "testvectors", "contract_v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c contract
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestErrorKindsAreTheContracts(t *testing.T) {
	c := loadContract(t)
	for _, k := range c.ErrorKinds {
		e := wire.ErrorKind(k.Code)
		if !e.Valid() || e.String() != k.Name {
			t.Errorf("code %d: ours is %q (valid %v), the contract's %q", k.Code, e.String(), e.Valid(), k.Name)
		}
		if p, ok := wire.ParseErrorKind(k.Name); !ok || p != e {
			t.Errorf("ParseErrorKind(%q) = %d, %v", k.Name, p, ok)
		}
	}
	if e := wire.ErrorKind(len(c.ErrorKinds) + 1); e.Valid() {
		t.Errorf("code %d is not in the contract but valid here", e)
	}
}

func TestPayloadFileNamesAreTheContracts(t *testing.T) {
	kinds := map[string]wire.Kind{"Dispatch": wire.Dispatch, "Invoke": wire.Invoke, "Completion": wire.Completion,
		"Failure": wire.Failure}
	for _, f := range loadContract(t).PayloadFiles {
		id, err := strconv.ParseUint(f.CallID, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		k, ok := kinds[f.Kind]
		if !ok {
			t.Fatalf("kind %q", f.Kind)
		}
		if got := shmPath("shm", id, k); got != f.Path {
			t.Errorf("%s %s: %q, want %q", f.CallID, f.Kind, got, f.Path)
		}
	}
}

func TestChannelFileNamesAreTheContracts(t *testing.T) {
	for _, f := range loadContract(t).ChannelFiles {
		e2w, w2e := fifoPaths("/ipc", f.ID)
		if e2w != "/ipc/"+f.E2W || w2e != "/ipc/"+f.W2E {
			t.Errorf("channel %d: %q %q, want %q %q", f.ID, e2w, w2e, f.E2W, f.W2E)
		}
	}
}

func TestOnlyTheContractsEnvironmentVariablesAreRead(t *testing.T) {
	c := loadContract(t)
	allowed := map[string]bool{}
	for _, n := range append(c.Env.Launcher, c.Env.Runtime["go"]...) {
		allowed[n] = true
	}
	lit := regexp.MustCompile("[\"`](STACCATO_[A-Z0-9_]+)")
	used := 0
	for _, dir := range []string{here(), filepath.Join(here(), "..", "cmd")} {
		err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllSubmatch(src, -1) {
				used++
				if !allowed[string(m[1])] {
					t.Errorf("%s reads %s, which testvectors/contract_v1.json does not list", p, m[1])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if used == 0 {
		t.Fatal("the scan found nothing: it is broken")
	}
}
