//! Times create, check and destroy of N network namespaces (default 30),
//! A/B interleaved with the spike's way of making one (9 execs: one `ip`
//! per step plus a per-namespace `nft add rule`, docs/notes/
//! issue4-runc-spike.md §4), so both see the same machine load.
//!
//!     cargo run --release -p staccato-netns --example timing [N]
//!
//! Needs root and nft. Uses prefix "tm" and the top 2N indexes.

use staccato_netns::{Net, Networks, NETS_MAX, NS_IF};
use std::error::Error;
use std::process::Command;
use std::time::{Duration, Instant};

const PREFIX: &str = "tm";

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

fn main() -> Result<()> {
    let n: u32 = std::env::args().nth(1).map_or(Ok(30), |a| a.parse()).map_err(|e| format!("N: {e}"))?;
    if n == 0 || 2 * n > 1000 {
        return Err("N must be 1..=500".into());
    }
    let nets = Networks::new(PREFIX)?;
    nets.cleanup()?;
    let result = measure(&nets, n);
    let cleaned = nets.cleanup();
    result?;
    Ok(cleaned?)
}

fn measure(nets: &Networks, n: u32) -> Result<()> {
    let base = NETS_MAX - 2 * n;
    let mut exec_only = Vec::new();
    let (mut create, mut create_spike, mut check, mut destroy) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut made = Vec::new();
    for i in 0..n {
        exec_only.push(timed(|| cmd(&["ip", "-V"]))?);
        let (t, net) = timed_value(|| nets.create(base + i))?;
        create.push(t);
        made.push(net);
        let spike = nets.net_at(base + n + i)?;
        create_spike.push(timed(|| create_like_spike(nets, &spike))?);
        made.push(spike);
    }
    for net in made.iter().step_by(2) {
        check.push(timed(|| nets.check(net))?);
    }
    for net in &made {
        destroy.push(timed(|| nets.destroy(net))?);
    }
    println!("n = {n} each, wall clock per call");
    report("exec of `ip -V` alone", &mut exec_only);
    let ours = report("create (2 ip execs, no nft)", &mut create);
    let spike = report("create, spike's way (9 execs)", &mut create_spike);
    report("check (1 ip exec)", &mut check);
    report("destroy (1 ip exec; both kinds)", &mut destroy);
    println!("create p50 ratio spike/ours: {:.1}x", spike.as_secs_f64() / ours.as_secs_f64());
    Ok(())
}

/// The spike's netns.sh, step for step, except that its nft rule is the
/// DNAT rule a namespace needs rather than the masquerade rule it tried.
fn create_like_spike(nets: &Networks, net: &Net) -> Result<()> {
    let (ns, h, host_ip, ns_ip) = (&net.name, &net.host_if, net.host_ip.to_string(), net.ns_ip.to_string());
    cmd(&["ip", "netns", "add", ns])?;
    cmd(&["ip", "link", "add", h, "type", "veth", "peer", "name", NS_IF, "netns", ns])?;
    cmd(&["ip", "addr", "add", &format!("{host_ip}/30"), "dev", h])?;
    cmd(&["ip", "link", "set", h, "up"])?;
    cmd(&["ip", "-n", ns, "addr", "add", &format!("{ns_ip}/30"), "dev", NS_IF])?;
    cmd(&["ip", "-n", ns, "link", "set", NS_IF, "up"])?;
    cmd(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    cmd(&["ip", "-n", ns, "route", "add", "default", "via", &host_ip])?;
    let rule = format!("iifname \"{h}\" ip daddr {host_ip} dnat ip to 127.0.0.1");
    cmd(&["nft", "add", "rule", "inet", nets.table(), "dnat_to_loopback", &rule])
}

fn cmd(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()).into());
    }
    Ok(())
}

fn timed<E: Into<Box<dyn Error>>>(f: impl FnOnce() -> Result<(), E>) -> Result<Duration> {
    timed_value(f).map(|(t, ())| t)
}

fn timed_value<T, E: Into<Box<dyn Error>>>(f: impl FnOnce() -> Result<T, E>) -> Result<(Duration, T)> {
    let start = Instant::now();
    let value = f().map_err(Into::into)?;
    Ok((start.elapsed(), value))
}

/// Prints p50/p90 (nearest rank) and returns p50.
fn report(what: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let rank = |p: usize| samples[(samples.len() * p).div_ceil(100).max(1) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p90) = (rank(50), rank(90));
    println!(
        "{what:<34} p50 {:6.2} ms  p90 {:6.2} ms  (min {:.2}, max {:.2})",
        ms(p50),
        ms(p90),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
    p50
}
