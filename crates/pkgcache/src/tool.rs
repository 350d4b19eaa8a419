//! Running pip, npm and interpreters, and turning their failures into text
//! for the person deploying: our sentence first, then the tool's own lines.

use std::io;
use std::process::{Command, Output};

/// How many of a failing tool's last output lines an error quotes: enough for
/// pip's resolver explanation, short enough to read in a deploy response.
const QUOTED_LINES_MAX: usize = 30;

pub(crate) enum ToolError {
    /// The program could not be started at all (usually: not installed).
    Spawn(io::Error),
    /// It ran and exited non-zero; its last output lines.
    Failed(String),
}

pub(crate) fn run(cmd: &mut Command) -> Result<Output, ToolError> {
    let out = cmd.output().map_err(ToolError::Spawn)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(ToolError::Failed(tail(&out)))
    }
}

/// Standard error before standard output: both pip and npm put the reason
/// for a failure on standard error.
fn tail(out: &Output) -> String {
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
