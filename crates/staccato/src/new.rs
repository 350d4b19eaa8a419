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
        Lang::Go => ("go", "Handle", vec![("handler.go", GO)]),
        Lang::C => ("c", "handler.c", vec![("handler.c", C)]),
        Lang::Cpp => ("cpp", "handler.cpp", vec![("handler.cpp", CPP)]),
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
    for (file, text) in files {
        std::fs::write(dir.join(file), text.replace("{name}", name))?;
    }
    println!("Created {}/ ({runtime} function {name})", dir.display());
    println!("Next: staccato deploy {} && staccato invoke {name} --data world", dir.display());
    // The unit test runs the handler without an engine, through the
    // runtime's package, installed from this Staccato's runtimes.
    let runtimes = engine::config::find_runtimes(None).ok();
    let sdk = |sub: &str| {
        runtimes.as_ref().map_or(format!("<staccato>/runtimes/{sub}"), |r| r.join(sub).display().to_string())
    };
    match lang {
        Lang::Python => {
            println!("Unit test: pip install {} && (cd {} && python3 -m pytest)", sdk("python"), dir.display())
        }
        Lang::Node => println!("Unit test: (cd {} && npm install {} && node --test)", dir.display(), sdk("node")),
        _ => {}
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
