//! `staccato secret create|update|ls|rm`: secrets functions read at
//! `/var/secrets/NAME` (a manifest's `secrets: [NAME]`), through the
//! gateway's management API. Values go up once and never come back down.

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use clap::{Args, Subcommand};
use client::{check, Gateway, Requester};
use std::io::Read;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum SecretCmd {
    /// Make a secret.
    Create {
        name: String,
        #[command(flatten)]
        value: ValueArgs,
    },
    /// Give a secret a new value (functions get it at their next deploy).
    Update {
        name: String,
        #[command(flatten)]
        value: ValueArgs,
    },
    /// List secrets: names, ages, the functions that name them (never values).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a secret no deployed function names.
    Rm { name: String },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct ValueArgs {
    /// The value is this file's content (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    from_file: Option<PathBuf>,
    /// The value itself (it stays in your shell's history: prefer a file).
    #[arg(long, value_name = "VALUE")]
    from_literal: Option<String>,
}

impl ValueArgs {
    fn read(&self) -> Result<Vec<u8>> {
        let v = match (&self.from_file, &self.from_literal) {
            (Some(p), _) if p.as_os_str() == "-" => {
                let mut b = Vec::new();
                std::io::stdin().read_to_end(&mut b)?;
                b
            }
            (Some(p), _) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            (None, Some(v)) => v.as_bytes().to_vec(),
            (None, None) => bail!("give the value with --from-file or --from-literal"),
        };
        if v.len() > api::secrets::SECRET_BYTES_MAX {
            bail!("a secret is at most {} bytes, this one {}", api::secrets::SECRET_BYTES_MAX, v.len());
        }
        Ok(v)
    }
}

fn name_ok(name: &str) -> Result<()> {
    if !api::secrets::valid_name(name) {
        bail!("invalid secret name {name:?}: {}", api::secrets::name_rule());
    }
    Ok(())
}

pub fn run(c: &mut Gateway, cmd: SecretCmd) -> Result<()> {
    let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
    match cmd {
        SecretCmd::Create { name, value } => {
            name_ok(&name)?;
            let body = serde_json::json!({ "name": name, "value": b64(&value.read()?) }).to_string();
            let r = c
                .request_with_headers(
                    "POST",
                    "/system/secrets",
                    body.as_bytes(),
                    &[("Content-Type", "application/json")],
                )
                .context("cannot reach the gateway")?;
            check(&r)?;
            println!("Created secret {name}");
        }
        SecretCmd::Update { name, value } => {
            name_ok(&name)?;
            let body = serde_json::json!({ "value": b64(&value.read()?) }).to_string();
            let path = format!("/system/secrets/{name}");
            let r = c
                .request_with_headers("PUT", &path, body.as_bytes(), &[("Content-Type", "application/json")])
                .context("cannot reach the gateway")?;
            let v = check(&r)?;
            println!("Updated secret {name}");
            let redeploy: Vec<&str> =
                v["redeploy"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).collect();
            if !redeploy.is_empty() {
                eprintln!("functions that name it get the new value when deployed again: {}", redeploy.join(", "));
            }
        }
        SecretCmd::Ls { json } => {
            let r = c.request("GET", "/system/secrets", b"").context("cannot reach the gateway")?;
            let v = check(&r)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            println!("{:<32} {:<24} USED BY", "NAME", "UPDATED");
            for s in v.as_array().into_iter().flatten() {
                let used: Vec<&str> =
                    s["used_by"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).collect();
                let updated = s["updated_ms"].as_u64().map_or("-".to_string(), |ms| format!("{} s ago", age_s(ms)));
                println!("{:<32} {:<24} {}", s["name"].as_str().unwrap_or("?"), updated, used.join(", "));
            }
        }
        SecretCmd::Rm { name } => {
            name_ok(&name)?;
            let r = c.request("DELETE", &format!("/system/secrets/{name}"), b"").context("cannot reach the gateway")?;
            check(&r)?;
            println!("Removed secret {name}");
        }
    }
    Ok(())
}

fn age_s(ms: u64) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    now.saturating_sub(ms) / 1000
}
