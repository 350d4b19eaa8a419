//! `staccato key create|ls|rm|rotate`: invoke keys of functions deployed
//! with `auth: key`, through the gateway's management API (so they need
//! the management token; an invoke key never manages anything).

use anyhow::{Context, Result};
use clap::Subcommand;
use client::{check, Gateway, Requester};
use serde_json::Value;

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Make an invoke key for FUNCTION. The key is printed once, on
    /// standard output; only its digest is kept.
    Create {
        function: String,
        #[arg(long)]
        json: bool,
    },
    /// List FUNCTION's invoke keys (their ids and ages, never the keys).
    Ls {
        function: String,
        #[arg(long)]
        json: bool,
    },
    /// Revoke invoke key ID of FUNCTION: calls with it fail at once.
    Rm { function: String, id: String },
    /// Make a new key for FUNCTION, then revoke every older one.
    Rotate {
        function: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(c: &mut Gateway, cmd: KeyCmd) -> Result<()> {
    match cmd {
        KeyCmd::Create { function, json } => {
            crate::function_name(&function)?;
            let made = create(c, &function)?;
            print_made(&made, json)
        }
        KeyCmd::Ls { function, json } => {
            crate::function_name(&function)?;
            let v = list(c, &function)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            println!("function {function} (auth: {})", v["auth"].as_str().unwrap_or("?"));
            println!("{:<10} {:>12}", "ID", "AGE");
            let now = now_ms();
            for k in v["keys"].as_array().into_iter().flatten() {
                let age_s = now.saturating_sub(k["created_ms"].as_u64().unwrap_or(now)) / 1000;
                println!("{:<10} {:>12}", k["id"].as_str().unwrap_or("?"), age(age_s));
            }
            Ok(())
        }
        KeyCmd::Rm { function, id } => {
            crate::function_name(&function)?;
            remove(c, &function, &id)?;
            println!("Revoked key {id} of {function}");
            Ok(())
        }
        KeyCmd::Rotate { function, json } => {
            crate::function_name(&function)?;
            let made = create(c, &function).context("making the new key (at 16 keys, remove one first)")?;
            // The new key first: whatever happens next, it is not lost.
            print_made(&made, json)?;
            let new_id = made["id"].as_str().unwrap_or_default().to_string();
            // Listed after the new key was made: a key made meanwhile by
            // someone else goes too ("every older one").
            for k in list(c, &function)?["keys"].as_array().into_iter().flatten() {
                let id = k["id"].as_str().unwrap_or_default();
                if id == new_id {
                    continue;
                }
                let r = c
                    .request("DELETE", &format!("/system/keys/{function}/{id}"), b"")
                    .context("cannot reach the gateway")?;
                // 404: revoked already (another rotate).
                if r.status != 404 {
                    check(&r)?;
                }
                eprintln!("revoked key {id} of {function}");
            }
            Ok(())
        }
    }
}

fn create(c: &mut Gateway, function: &str) -> Result<Value> {
    let r = c.request("POST", &format!("/system/keys/{function}"), b"").context("cannot reach the gateway")?;
    check(&r)
}

fn list(c: &mut Gateway, function: &str) -> Result<Value> {
    let r = c.request("GET", &format!("/system/keys/{function}"), b"").context("cannot reach the gateway")?;
    check(&r)
}

fn remove(c: &mut Gateway, function: &str, id: &str) -> Result<Value> {
    let r = c.request("DELETE", &format!("/system/keys/{function}/{id}"), b"").context("cannot reach the gateway")?;
    check(&r)
}

/// The key alone on standard output (for `KEY=$(staccato key create f)`),
/// what it is on standard error.
fn print_made(made: &Value, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(made)?);
        return Ok(());
    }
    let (f, id) = (made["function"].as_str().unwrap_or("?"), made["id"].as_str().unwrap_or("?"));
    eprintln!("invoke key {id} of {f} (shown only now: keep it; call with Authorization: Bearer <key>)");
    if let Some(note) = made["note"].as_str() {
        eprintln!("note: {note}");
    }
    println!("{}", made["key"].as_str().unwrap_or_default());
    Ok(())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn age(s: u64) -> String {
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}
