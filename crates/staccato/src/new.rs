//! `staccato new NAME --lang LANG`: scaffolds a function directory with its
//! manifest, ready for `staccato deploy`.

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use std::path::Path;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Lang {
    Python,
    Node,
    Go,
    C,
    Cpp,
}

/// (runtime, handler, files) for a language; `{name}` is replaced.
fn template(lang: Lang) -> (&'static str, &'static str, Vec<(&'static str, &'static str)>) {
    match lang {
        Lang::Python => ("python", "handler:handle", vec![("handler.py", PYTHON), ("test_handler.py", PYTHON_TEST)]),
        Lang::Node => ("node", "handler.mjs:handle", vec![("handler.mjs", NODE), ("handler.test.mjs", NODE_TEST)]),
        Lang::Go => ("go", "Handle", vec![("handler.go", GO), ("handler_test.go", GO_TEST), ("go.mod", GO_MOD)]),
        Lang::C => ("c", "handler.c", vec![("handler.c", C), ("test_handler.c", C_TEST)]),
        Lang::Cpp => ("cpp", "handler.cpp", vec![("handler.cpp", CPP), ("test_handler.cpp", CPP_TEST)]),
    }
}

pub fn new(name: &str, lang: Lang, parent: &Path) -> Result<()> {
    if !wire::valid_function_name(name) {
        bail!("invalid function name {name:?}: use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter");
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!("{} already exists", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (runtime, handler, files) = template(lang);
    let manifest = format!(
        "version: 1\nfunctions:\n  {name}:\n    runtime: {runtime}\n    handler: {handler}\n    source: .\n    \
         min_workers: 1\n    max_workers: 8\n    timeout: 10s\n"
    );
    std::fs::write(dir.join("staccato.yml"), manifest)?;
    // The runtime's code, for a test that builds against it.
    let runtimes = engine::config::find_runtimes(None).ok();
    let sdk = |sub: &str| {
        runtimes.as_ref().map_or(format!("<staccato>/runtimes/{sub}"), |r| r.join(sub).display().to_string())
    };
    for (file, text) in files {
        std::fs::write(dir.join(file), text.replace("{name}", name).replace("{go_sdk}", &sdk("go")))?;
    }
    println!("Created {}/ ({runtime} function {name})", dir.display());
    println!("Next: staccato deploy {} && staccato invoke {name} --data world", dir.display());
    // The unit test runs the handler without an engine, through the
    // runtime's package, installed from this Staccato's runtimes.
    let d = dir.display();
    match lang {
        Lang::Python => {
            println!("Unit test: pip install {} && (cd {} && python3 -m pytest)", sdk("python"), dir.display())
        }
        Lang::Node => println!("Unit test: (cd {d} && npm install {} && node --test)", sdk("node")),
        Lang::Go => println!("Unit test: (cd {d} && go test ./...)   (go.mod points at {})", sdk("go")),
        Lang::C => println!(
            "Unit test: (cd {d} && cc -I {c}/include handler.c test_handler.c {c}/src/testing.c -pthread -o \
             unit-test && ./unit-test)",
            c = sdk("c")
        ),
        Lang::Cpp => println!(
            "Unit test: (cd {d} && cc -c -I {c}/include {c}/src/testing.c && g++ -std=c++20 -I {c}/include -I \
             {cpp}/include handler.cpp test_handler.cpp testing.o -pthread -o unit-test && ./unit-test)",
            c = sdk("c"),
            cpp = sdk("cpp")
        ),
    }
    Ok(())
}

const PYTHON: &str = r#"async def handle(ctx, data: bytes) -> bytes:
    """Runs once per call. `await ctx.call("other", b"...")` calls another
    function through the local engine; failures raise staccato.CallError."""
    ctx.logger.info("called with %d bytes", len(data))
    return b"Hello from {name}: " + data
"#;

const PYTHON_TEST: &str = r#"# The handler without an engine (staccato.testing). The runtime's package:
# pip install <staccato>/runtimes/python; then: python3 -m pytest
from staccato import CallError
from staccato.testing import FakeCalls, run_handler

from handler import handle


def test_greets():
    assert run_handler(handle, b"world", function="{name}") == b"Hello from {name}: world"


def test_a_call_it_makes_can_be_faked():
    # ctx.call("other", ...) in the handler would be answered like this:
    calls = FakeCalls({"other": lambda data: data.upper(), "down": CallError("timeout")})
    run_handler(handle, b"x", calls=calls)
    assert calls.made == []  # this handler calls nothing yet
"#;

const NODE_TEST: &str = r#"// The handler without an engine (staccato-runtime/testing). The runtime's
// package: npm install <staccato>/runtimes/node; then: node --test
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FakeCalls, runHandler } from 'staccato-runtime/testing';

import { handle } from './handler.mjs';

test('greets', async () => {
  const out = await runHandler(handle, 'world', { function: '{name}' });
  assert.equal(out.toString(), 'Hello from {name}: world');
});

test('a call it makes can be faked', async () => {
  // ctx.call('other', ...) in the handler would be answered like this:
  const calls = new FakeCalls({ other: (data) => data.toString().toUpperCase() });
  await runHandler(handle, 'x', { calls });
  assert.deepEqual(calls.made, []); // this handler calls nothing yet
});
"#;

const NODE: &str = r#"// Runs once per call. `await ctx.call('other', data)` calls another function
// through the local engine; failures reject with a CallError (err.kind).
export async function handle(ctx, data) {
  ctx.log(`called with ${data.length} bytes`);
  return Buffer.concat([Buffer.from('Hello from {name}: '), data]);
}
"#;

const GO: &str = r#"package handler

import "staccato.local/go/staccato"

// Handle runs once per call. ctx.Call("other", in) calls another function
// through the local engine; failures return a *staccato.CallError.
func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {
	ctx.Logf("called with %d bytes", len(in))
	return append([]byte("Hello from {name}: "), in...), nil
}
"#;

const GO_TEST: &str = r#"package handler

// The handler without an engine (staccato.RunHandler): go test ./...

import (
	"testing"

	"staccato.local/go/staccato"
)

func TestGreets(t *testing.T) {
	out, err := staccato.RunHandler(Handle, []byte("world"), staccato.RunOptions{Function: "{name}"})
	if err != nil || string(out) != "Hello from {name}: world" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestACallItMakesCanBeFaked(t *testing.T) {
	// ctx.Call("other", ...) in the handler would be answered like this:
	calls := &staccato.FakeCalls{Callees: map[string]func([]byte) ([]byte, error){
		"other": func(in []byte) ([]byte, error) { return in, nil },
	}}
	if _, err := staccato.RunHandler(Handle, []byte("x"), staccato.RunOptions{Calls: calls}); err != nil {
		t.Fatal(err)
	}
	if len(calls.Made()) != 0 {
		t.Fatalf("calls made: %v", calls.Made()) // this handler calls nothing yet
	}
}
"#;

/// The module of a Go function: the runtime's module has no public path,
/// so a test finds it by `replace` (the deploy's build ignores this one).
const GO_MOD: &str = r#"module {name}

go 1.22

require staccato.local/go v0.0.0

replace staccato.local/go => {go_sdk}
"#;

const C_TEST: &str = r#"/* The handler without an engine (libstaccato-testing, staccato_testing.h).
 * Build and run (the engine compiles handler.c only):
 *   cc -I <staccato>/runtimes/c/include handler.c test_handler.c \
 *      <staccato>/runtimes/c/src/testing.c -pthread -o unit-test && ./unit-test
 * or with `make -C <staccato>/runtimes/c install`: pkg-config staccato-testing */
#include <staccato_testing.h>
#include <stdio.h>
#include <string.h>

static int other(const uint8_t *in, size_t len, staccato_result *out, void *arg) {
    (void)arg;
    return staccato_fake_reply(out, STACCATO_OK, in, len);
}

int main(void) {
    /* staccato_call(ctx, "other", ...) in the handler would be answered by
     * other() above. */
    staccato_fake_callee callees[] = {{"other", other, NULL}};
    staccato_test_options o = {.function = "{name}", .timeout_us = 1000000, .callees = callees, .n_callees = 1};
    staccato_test_result r;
    int kind = staccato_test_run(staccato_handle, (const uint8_t *)"world", 5, &o, &r);
    const char *want = "Hello from {name}: world";
    int ok = kind == STACCATO_OK && r.output_len == strlen(want) && memcmp(r.output, want, r.output_len) == 0 &&
             r.n_calls == 0; /* this handler calls nothing yet */
    printf("%s: %s\n", ok ? "ok" : "FAILED", kind == STACCATO_OK ? (char *)r.output : r.error);
    staccato_test_result_free(&r);
    return ok ? 0 : 1;
}
"#;

const CPP_TEST: &str = r#"// The handler without an engine (libstaccato-testing, staccato_testing.h).
// Build and run (the engine compiles handler.cpp only):
//   cc -c -I <staccato>/runtimes/c/include <staccato>/runtimes/c/src/testing.c
//   g++ -std=c++20 -I <staccato>/runtimes/c/include -I <staccato>/runtimes/cpp/include \
//       handler.cpp test_handler.cpp testing.o -pthread -o unit-test && ./unit-test
#include <staccato_testing.h>

#include <cstdio>
#include <string>

extern "C" int staccato_handle(staccato_ctx*, const std::uint8_t*, std::size_t);

int main() {
    staccato_test_options o{};
    o.function = "{name}";
    o.timeout_us = 1000000;  // ctx.call() would be answered by o.callees
    staccato_test_result r;
    int kind = staccato_test_run(staccato_handle, reinterpret_cast<const std::uint8_t*>("world"), 5, &o, &r);
    std::string out = kind == STACCATO_OK ? std::string(reinterpret_cast<char*>(r.output), r.output_len) : r.error;
    bool ok = kind == STACCATO_OK && out == "Hello from {name}: world" && r.n_calls == 0;
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", out.c_str());
    staccato_test_result_free(&r);
    return ok ? 0 : 1;
}
"#;

const C: &str = r#"#include <staccato.h>
#include <stdlib.h>
#include <string.h>

/* Runs once per call. staccato_call(ctx, "other", in, len, &result) calls
 * another function through the local engine. Return 0 on success. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    static const char greeting[] = "Hello from {name}: ";
    size_t glen = sizeof greeting - 1;
    uint8_t *out = malloc(glen + input_len + 1);
    if (!out) {
        staccato_set_error(ctx, "out of memory");
        return 1;
    }
    memcpy(out, greeting, glen);
    if (input_len) memcpy(out + glen, input, input_len);
    staccato_log(ctx, "called with %zu bytes", input_len);
    staccato_set_output(ctx, out, glen + input_len);
    free(out);
    return 0;
}
"#;

const CPP: &str = r#"#include <staccato.hpp>

#include <string>
#include <string_view>

// Runs once per call. ctx.call("other", in) calls another function through
// the local engine; failures throw staccato::CallError (e.kind()).
std::string handle(staccato::Context& ctx, std::string_view in) {
    ctx.log("called with " + std::to_string(in.size()) + " bytes");
    return "Hello from {name}: " + std::string(in);
}

STACCATO_HANDLER(handle)
"#;
