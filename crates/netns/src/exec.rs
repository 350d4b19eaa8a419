//! Running `ip` and `nft`. Every exec costs about 2 ms here (ip links ten
//! shared libraries), which dominates a netns's setup, so callers batch
//! their commands on stdin: one exec per namespace instead of one per step.

use crate::{Error, Result};
use std::env;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The absolute path of `name`, so later execs skip the PATH search. Also
/// looks in the sbin directories, which a non-login root shell may lack.
pub(crate) fn find_tool(name: &str, package: &str) -> Result<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    let dirs = env::split_paths(&path).chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(Error::ToolMissing { tool: name.to_string(), package: package.to_string() })
}

/// Runs `program args…` with `input` on stdin and returns its stdout, or an
/// error naming the command, its exit status, its stderr and the input (the
/// batch line numbers in ip's stderr refer to it).
pub(crate) fn run(program: &Path, args: &[&str], input: &str) -> Result<String> {
    let shown = || {
        let name = program.file_name().map_or_else(|| program.to_string_lossy(), |n| n.to_string_lossy());
        format!("`{name} {}`", args.join(" "))
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Command { command: shown(), detail: format!("could not start: {e}") })?;
    let mut stdin = child.stdin.take();
    // A writer thread, because a long cleanup batch can outgrow the pipe
    // buffer while the child, blocked on a full stderr pipe, stops reading.
    let output = std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(stdin) = stdin.as_mut() {
                // A child that exits early closes the pipe; its exit status
                // and stderr then tell the real story, so this error is moot.
                let _ = stdin.write_all(input.as_bytes());
            }
            drop(stdin);
        });
        child.wait_with_output()
    })
    .map_err(|e| Error::Command { command: shown(), detail: format!("failed: waiting for it: {e}") })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let numbered: Vec<String> = input.lines().enumerate().map(|(n, l)| format!("{}: {l}", n + 1)).collect();
    let detail =
        format!("failed ({}): {}; input: [{}]", output.status, stderr.trim().replace('\n', "; "), numbered.join("; "));
    Err(Error::Command { command: shown(), detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_command_and_carry_stderr_and_input() {
        let sh = find_tool("sh", "dash").expect("sh");
        let e =
            run(&sh, &["-c", "cat >/dev/null; echo boom >&2; exit 3"], "line one\nline two\n").unwrap_err().to_string();
        assert!(e.starts_with("`sh -c "), "{e}");
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(e.contains("boom"), "{e}");
        assert!(e.contains("2: line two"), "{e}");
    }

    #[test]
    fn stdout_is_returned_and_big_inputs_do_not_deadlock() {
        let sh = find_tool("sh", "dash").expect("sh");
        let big = "x".repeat(1 << 20);
        let out = run(&sh, &["-c", "head -c 1000000 >/dev/null; echo ok; cat >/dev/null"], &big).unwrap();
        assert_eq!(out, "ok\n");
    }

    #[test]
    fn missing_tools_name_their_package() {
        let e = find_tool("surely-not-a-tool-xyz", "some-package").unwrap_err().to_string();
        assert!(e.contains("some-package"), "{e}");
    }
}
