//! `staccato testbed`: a Staccato cluster on test hosts made of network
//! namespaces (`staccato_bench::bed`), for a demo of the cluster on one
//! machine and for the cluster tests. Needs root.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use staccato_bench::bed::{self, Bed, Layout};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct Where {
    /// The testbed's name: its hosts are the network namespaces stb-NAME-*
    /// (1-6 of a-z 0-9).
    #[arg(long, default_value = "demo")]
    prefix: String,
    /// Its state (testbed.json, logs, engines' state); default
    /// /tmp/staccato-testbed-PREFIX.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Where {
    fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| PathBuf::from(format!("/tmp/staccato-testbed-{}", self.prefix)))
    }

    fn load(&self) -> Result<Bed> {
        Bed::load(&self.dir())
    }
}

#[derive(Subcommand)]
pub enum TestbedCmd {
    /// Make the hosts and start gateways (and etcd, for several), engines
    /// that join them, and a client host; returns when all are ready.
    Up {
        #[command(flatten)]
        at: Where,
        #[arg(long, default_value_t = 1)]
        gateways: u32,
        #[arg(long, default_value_t = 3)]
        engines: u32,
        /// Hosts left empty, for engines started later (`testbed start`).
        #[arg(long, default_value_t = 0)]
        spare: u32,
        /// An engine on gateway gw0's host too (named `local`).
        #[arg(long)]
        colocated: bool,
        /// More arguments for every engine, e.g. --engine-arg=--isolation=process.
        #[arg(long = "engine-arg", allow_hyphen_values = true)]
        engine_args: Vec<String>,
        /// More arguments for every gateway.
        #[arg(long = "gateway-arg", allow_hyphen_values = true)]
        gateway_args: Vec<String>,
        /// Print testbed.json instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Stop everything in the testbed and remove its hosts.
    Down {
        #[command(flatten)]
        at: Where,
    },
    /// Run a command in a member's host (default: the client host), with
    /// STACCATO_GATEWAY and STACCATO_TOKEN set for gateway gw0.
    Exec {
        #[command(flatten)]
        at: Where,
        /// gw0, engine1, client, ...
        #[arg(long, default_value = "client")]
        host: String,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Pull a member's host's cable out (down) or plug it back in (up).
    Link {
        #[command(flatten)]
        at: Where,
        member: String,
        #[arg(value_parser = ["up", "down"])]
        state: String,
    },
    /// Start an engine on its host: a spare one (joining late) or one that
    /// was stopped; waits until every gateway lists it ready.
    Start {
        #[command(flatten)]
        at: Where,
        engine: String,
        /// Return once started, without waiting for it to be ready.
        #[arg(long)]
        no_wait: bool,
    },
    /// Send a signal to a member's process (default KILL).
    Kill {
        #[command(flatten)]
        at: Where,
        member: String,
        #[arg(long, default_value = "KILL", value_parser = ["KILL", "TERM", "STOP", "CONT"])]
        signal: String,
    },
    /// Print testbed.json.
    Show {
        #[command(flatten)]
        at: Where,
    },
}

pub fn run(cmd: TestbedCmd) -> Result<()> {
    if sys::process::euid() != 0 {
        bail!("a testbed makes network namespaces: run it as root");
    }
    match cmd {
        TestbedCmd::Up { at, gateways, engines, spare, colocated, engine_args, gateway_args, json } => {
            let layout = Layout {
                prefix: at.prefix.clone(),
                dir: at.dir(),
                gateways,
                engines,
                spare,
                colocated,
                engine_args,
                gateway_args,
            };
            let b = Bed::up(&layout, &|s| eprintln!("==> {s}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&b)?);
            } else {
                summary(&b, &at);
            }
            Ok(())
        }
        TestbedCmd::Down { at } => {
            eprintln!("==> stopping testbed {} and removing its hosts", at.prefix);
            bed::down(&at.prefix, Some(&at.dir()))
        }
        TestbedCmd::Exec { at, host, command } => {
            let b = at.load()?;
            let path = b.netns_path(&host)?;
            let err = std::process::Command::new("nsenter")
                .arg(format!("--net={}", path.display()))
                .arg("--")
                .args(&command)
                .env("STACCATO_GATEWAY", b.url(0))
                .env("STACCATO_TOKEN", &b.token)
                .exec();
            bail!("running nsenter: {err}")
        }
        TestbedCmd::Link { at, member, state } => {
            let b = at.load()?;
            let host = b.member(&member)?.host;
            netns::testbed::Testbed::existing(&b.prefix)?.set_link(host, state == "up")?;
            eprintln!("==> host of {member}: link {state}");
            Ok(())
        }
        TestbedCmd::Start { at, engine, no_wait } => {
            let mut b = at.load()?;
            let pid = b.start_engine(&engine)?;
            eprintln!("==> engine {engine} started (pid {pid})");
            if !no_wait {
                b.wait_ready(&[&engine], Duration::from_secs(60))?;
                eprintln!("==> every gateway lists {engine} ready");
            }
            Ok(())
        }
        TestbedCmd::Kill { at, member, signal } => {
            let mut b = at.load()?;
            let sig = match signal.as_str() {
                "TERM" => libc::SIGTERM,
                "STOP" => libc::SIGSTOP,
                "CONT" => libc::SIGCONT,
                _ => libc::SIGKILL,
            };
            b.signal(&member, sig)
        }
        TestbedCmd::Show { at } => {
            println!("{}", serde_json::to_string_pretty(&at.load()?)?);
            Ok(())
        }
    }
}

fn summary(b: &Bed, at: &Where) {
    println!("Testbed {} is up; its state is in {}", b.prefix, b.dir.display());
    println!("{:<10} {:<8} {:<18} {:<16} PID", "MEMBER", "ROLE", "ADDRESS", "NAMESPACE");
    for m in &b.members {
        let pid = m.pid.map_or_else(|| "-".to_string(), |p| p.to_string());
        println!("{:<10} {:<8} {:<18} {:<16} {pid}", m.name, m.role, m.addr, m.netns);
    }
    let p = if at.prefix == "demo" { String::new() } else { format!(" --prefix {}", at.prefix) };
    println!("\nThe hosts reach each other, never this machine's network. Try:");
    println!("  staccato testbed exec{p} -- staccato engines");
    println!("  staccato testbed exec{p} -- staccato deploy examples/hello");
    println!("  staccato testbed exec{p} -- staccato invoke hello -d world -v");
    println!("  staccato testbed link{p} engine1 down     # pull a server's cable");
    println!("  staccato testbed down{p}");
}
