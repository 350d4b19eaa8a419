//! `staccato calls`: asynchronous calls (`staccato invoke --async`), their
//! state and results, and the dead letters (`--state failed`) to replay.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use client::{check, Gateway, Requester};
use serde_json::Value;

#[derive(Args)]
pub struct CallsCmd {
    #[command(subcommand)]
    pub cmd: Option<CallsSub>,
    /// Only calls of this function.
    #[arg(long)]
    pub function: Option<String>,
    /// Only calls in this state: queued, running, ok or failed (the dead
    /// letters).
    #[arg(long)]
    pub state: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum CallsSub {
    /// Show one call: its state, attempts, errors and result.
    Get {
        id: String,
        /// Print only the output (of a call that succeeded).
        #[arg(long)]
        output: bool,
    },
    /// Run a failed call (a dead letter) again, from its first attempt.
    Replay { id: String },
    /// Remove a finished call, or cancel a queued one.
    Rm { id: String },
}

pub fn run(c: &mut Gateway, cmd: CallsCmd) -> Result<()> {
    match cmd.cmd {
        None => list(c, &cmd),
        Some(CallsSub::Get { id, output }) => {
            let v = call(c, "GET", &format!("/system/calls/{id}"))?;
            if output {
                let r = &v["result"];
                if let Some(e) = r["error"].as_str() {
                    bail!("call {id} failed: {e}: {}", r["message"].as_str().unwrap_or(""));
                }
                match (r["output"].as_str(), r["output_base64"].as_str()) {
                    (Some(t), _) => print!("{t}"),
                    (None, Some(b)) => {
                        use base64::Engine as _;
                        let bytes = base64::engine::general_purpose::STANDARD.decode(b)?;
                        std::io::Write::write_all(&mut std::io::stdout(), &bytes)?;
                    }
                    _ => bail!("call {id} has no output to show (state {})", v["state"].as_str().unwrap_or("?")),
                }
                return Ok(());
            }
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        Some(CallsSub::Replay { id }) => {
            call(c, "POST", &format!("/system/calls/{id}/replay"))?;
            println!("Replaying {id}: see `staccato calls get {id}`");
            Ok(())
        }
        Some(CallsSub::Rm { id }) => {
            call(c, "DELETE", &format!("/system/calls/{id}"))?;
            println!("Removed {id}");
            Ok(())
        }
    }
}

fn call(c: &mut Gateway, method: &str, path: &str) -> Result<Value> {
    let r = c.request(method, path, b"").context("cannot reach the gateway (is `staccato up` running?)")?;
    check(&r)
}

fn list(c: &mut Gateway, cmd: &CallsCmd) -> Result<()> {
    let mut q = vec![format!("limit={}", cmd.limit.clamp(1, 1000))];
    if let Some(f) = &cmd.function {
        crate::function_name(f)?;
        q.push(format!("function={f}"));
    }
    if let Some(s) = &cmd.state {
        if !matches!(s.as_str(), "queued" | "running" | "ok" | "failed") {
            bail!("--state {s:?}: use queued, running, ok or failed");
        }
        q.push(format!("state={s}"));
    }
    let v = call(c, "GET", &format!("/system/calls?{}", q.join("&")))?;
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let now = crate::key_cmd::now_ms();
    println!("{:<32}  {:<20} {:<8} {:>8} {:>8}  ERROR", "ID", "FUNCTION", "STATE", "ATTEMPTS", "AGE");
    for r in v["calls"].as_array().into_iter().flatten() {
        let age_s = now.saturating_sub(r["accepted_ms"].as_u64().unwrap_or(now)) / 1000;
        let error = r["result"]["error"].as_str().or(r["errors"].as_array().and_then(|e| e.last()?["error"].as_str()));
        println!(
            "{:<32}  {:<20} {:<8} {:>8} {:>8}  {}",
            r["id"].as_str().unwrap_or("?"),
            r["function"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            format!("{}/{}", r["attempts"], r["max_attempts"]),
            crate::key_cmd::age(age_s),
            error.unwrap_or("")
        );
    }
    let b = &v["by_state"];
    println!(
        "{} shown of {}; queued {}, running {}, ok {}, failed {}",
        v["calls"].as_array().map_or(0, Vec::len),
        v["total"],
        b["queued"],
        b["running"],
        b["ok"],
        b["failed"]
    );
    Ok(())
}
