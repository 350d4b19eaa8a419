//! Running pip, npm and interpreters, and turning their failures into text
//! for the person deploying: our sentence first, then the tool's own lines.

use crate::{RunError, Runner};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// How many of a failing tool's last output lines an error quotes: enough for
/// pip's resolver explanation, short enough to read in a deploy response.
const QUOTED_LINES_MAX: usize = 30;

pub(crate) enum ToolError {
    /// The program could not be started at all (usually: not installed).
    Spawn(io::Error),
    /// It ran and exited non-zero; its last output lines.
    Failed(String),
    /// The build sandbox stopped it (time or memory limit): why, then its
    /// last output lines.
    Stopped(String),
}

/// Runs a trusted command (an interpreter probe) on the host.
pub(crate) fn run(cmd: &mut Command) -> Result<Output, ToolError> {
    finish(cmd.output().map_err(ToolError::Spawn)?)
}

/// Runs a command that may execute the deployer's code (pip, npm) through
/// the cache's runner: it reads `reads` and writes only `output`.
pub(crate) fn run_in(
    runner: &dyn Runner,
    cmd: &mut Command,
    reads: &[PathBuf],
    output: Option<&Path>,
) -> Result<Output, ToolError> {
    match runner.output(cmd, reads, output) {
        Ok(out) => finish(out),
        Err(RunError::Spawn(e)) => Err(ToolError::Spawn(e)),
        Err(RunError::Stopped(why)) => Err(ToolError::Stopped(why)),
    }
}

fn finish(out: Output) -> Result<Output, ToolError> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(ToolError::Failed(tail(&out)))
    }
}

/// Standard error before standard output: both pip and npm put the reason
/// for a failure on standard error.
pub(crate) fn tail(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut quoted = lines[lines.len().saturating_sub(QUOTED_LINES_MAX)..].join("\n");
    if quoted.is_empty() {
        quoted = format!("(no output; {})", out.status);
    }
    quoted
}

/// Indents a tool's output under our own sentence.
pub(crate) fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
