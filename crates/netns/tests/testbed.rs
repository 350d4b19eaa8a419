//! Test hosts made of real namespaces joined by a real bridge: needs root
//! and `ip`, and skips (saying why) without them.
//!
//! Servers and clients are this test binary re-run inside a host as
//! `role_helper`, so no other program is needed. Every packet stays inside
//! the testbed's namespaces.

use staccato_netns::testbed::{host_addr, Testbed};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "STACCATO_TESTBED_ROLE";
const PORT: u16 = 7070;

fn root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|u| u.split_whitespace().nth(1));
    if euid != Some("0") {
        eprintln!("SKIPPED: needs root to make network namespaces");
    }
    euid == Some("0")
}

/// Inside a host: `serve:ADDR` greets one client, `connect:ADDR` prints
/// what connecting gave. Does nothing in a normal test run.
#[test]
fn role_helper() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let (what, addr) = role.split_once(':').expect("role:addr");
    let addr: SocketAddr = addr.parse().expect("address");
    match what {
        "serve" => {
            let l = TcpListener::bind(addr).expect("bind");
            println!("LISTENING");
            l.set_nonblocking(true).expect("nonblocking");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.write_all(b"hello");
                        return;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }
        _ => {
            let outcome = match TcpStream::connect_timeout(&addr, Duration::from_millis(1000)) {
                Ok(mut s) => {
                    let mut greeting = [0u8; 5];
                    match s.read_exact(&mut greeting) {
                        Ok(()) if &greeting == b"hello" => "greeted".to_string(),
                        r => format!("other: {r:?}"),
                    }
                }
                Err(e) => format!("failed: {e}"),
            };
            println!("OUTCOME {outcome}");
        }
    }
}

fn helper(bed: &Testbed, host: u32, role: &str) -> std::process::Command {
    let mut cmd = bed.command(host, &std::env::current_exe().unwrap().to_string_lossy());
    cmd.args(["--exact", "role_helper", "--nocapture", "--test-threads=1"]).env(ROLE_ENV, role);
    cmd
}

/// A greeter on host `host`, once it listens.
fn serve(bed: &Testbed, host: u32) -> Child {
    let role = format!("serve:{}:{PORT}", host_addr(host));
    let mut child = helper(bed, host, &role).stdout(Stdio::piped()).spawn().expect("ip netns exec");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("LISTENING"))), "the server did not start");
    // Read the rest, so the helper's last words meet no closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

/// What connecting from `from` to `to`'s greeter gives: "greeted" or why not.
fn connect(bed: &Testbed, from: u32, to: std::net::Ipv4Addr) -> String {
    let out = helper(bed, from, &format!("connect:{to}:{PORT}")).output().expect("ip netns exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.split_once("OUTCOME ").and_then(|(_, rest)| rest.lines().next()) {
        Some(o) => o.to_string(),
        None => format!("{stdout} {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn namespaces(lead: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(lead))
        .collect()
}

#[test]
fn hosts_reach_each_other_over_the_bridge_and_nothing_else() {
    if !root() {
        return;
    }
    let bed = Testbed::create("tbt", 3).expect("testbed");
    assert_eq!(
        bed.hosts().iter().map(|h| h.addr.to_string()).collect::<Vec<_>>(),
        ["10.210.0.1", "10.210.0.2", "10.210.0.3"]
    );

    // Nothing of it in our own namespace: no address, no interface.
    let ours = std::process::Command::new("ip").args(["-o", "addr", "show"]).output().unwrap();
    let ours = String::from_utf8_lossy(&ours.stdout);
    assert!(!ours.contains("10.210.0."), "{ours}");
    assert!(!ours.contains(" br0 ") && !ours.contains(" h0"), "{ours}");

    let server = serve(&bed, 2);
    assert_eq!(connect(&bed, 0, host_addr(2)), "greeted");
    stop(server);

    // A pulled cable: nothing gets through, then everything does again.
    let server = serve(&bed, 2);
    bed.set_link(2, false).expect("link down");
    let cut = connect(&bed, 0, host_addr(2));
    assert!(cut.starts_with("failed"), "{cut}");
    bed.set_link(2, true).expect("link up");
    let mut again = String::new();
    for _ in 0..20 {
        again = connect(&bed, 1, host_addr(2));
        if again == "greeted" {
            break;
        }
    }
    assert_eq!(again, "greeted");
    stop(server);

    // Another testbed has the same addresses on a separate bridge.
    let other = Testbed::create("tbu", 3).expect("second testbed");
    let server = serve(&bed, 2);
    let across = connect(&other, 0, host_addr(2));
    assert!(across.starts_with("failed"), "{across}");
    stop(server);
    other.destroy().expect("destroy");
    assert!(namespaces("stb-tbu-").is_empty());

    drop(bed);
    assert!(namespaces("stb-tbt-").is_empty(), "{:?}", namespaces("stb-tbt-"));
}

#[test]
fn a_crashed_runs_hosts_are_replaced() {
    if !root() {
        return;
    }
    // A run that died without its Drop leaves its namespaces behind.
    std::mem::forget(Testbed::create("tbc", 2).expect("testbed"));
    assert_eq!(namespaces("stb-tbc-").len(), 3);
    let bed = Testbed::create("tbc", 1).expect("testbed over leftovers");
    let mut left = namespaces("stb-tbc-");
    left.sort();
    assert_eq!(left, ["stb-tbc-0", "stb-tbc-sw"]);
    bed.destroy().expect("destroy");
    assert!(namespaces("stb-tbc-").is_empty());
}
