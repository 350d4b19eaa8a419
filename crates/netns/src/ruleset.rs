//! The nft table of one prefix. It is static: its rules match every host
//! veth of the prefix by name wildcard, so creating or destroying a netns
//! never touches nftables, and there are no per-netns rules to leak.

/// Replaces the table atomically: the leading `table` makes the `delete`
/// valid when the table does not exist yet, and `nft -f` applies the whole
/// file as one transaction, so no packet ever sees a half-built table.
///
/// * `dnat_to_loopback` (prerouting): a packet that arrives on one of our
///   veths addressed to the address of *that* veth (`fib daddr . iif type
///   local`) goes to 127.0.0.1, same port. This is how a function reaches
///   Redis or PostgreSQL listening on host loopback at STACCATO_HOST_IP.
///   The interface's route_localnet sysctl lets the kernel route the
///   rewritten packet instead of dropping it as a martian.
/// * `only_dnat_in` (input): besides replies, only those rewritten packets
///   may reach the host. Anything else from a netns is dropped: the host's
///   other addresses, other netns' host-side addresses, broadcasts, and a
///   forged packet sent to 127.0.0.1 directly (it lacks `ct status dnat`).
/// * `no_forward` (forward): nothing is routed between a netns and anything
///   else. net.ipv4.ip_forward is 0 here and must stay so, but the table
///   must not depend on another tenant of the machine keeping it so.
///
/// * `untracked_loopback` (raw, prerouting and output): a nat chain turns
///   connection tracking on for every packet of the host, and loopback
///   carries the gateway's and engine's own traffic; tracking it cost ~30%
///   of the external call throughput (BENCHMARKS.md). Packets on `lo` are
///   left untracked; the DNAT path never uses `lo` (it arrives on a veth,
///   its replies leave by one), so it is tracked as before.
///
/// No masquerade: no packet leaves the machine, and replies from 127.0.0.1
/// are rewritten back to the veth address by the DNAT's conntrack entry.
///
/// `ports`: None forwards every port; Some limits the DNAT to those TCP/UDP
/// ports, and the input chain then drops the rest like any other address.
pub(crate) fn install(table: &str, host_if_lead: &str, ports: Option<&[u16]>) -> String {
    let ours = format!("iifname \"{host_if_lead}*\"");
    let dnat = match ports {
        None => format!("\t\t{ours} meta nfproto ipv4 fib daddr . iif type local dnat ip to 127.0.0.1\n"),
        // nft rejects an empty set; no port means no DNAT at all.
        Some([]) => String::new(),
        Some(ports) => {
            let list: Vec<String> = ports.iter().map(u16::to_string).collect();
            format!(
                "\t\t{ours} meta nfproto ipv4 fib daddr . iif type local meta l4proto {{ tcp, udp }} \
                 th dport {{ {} }} dnat ip to 127.0.0.1\n",
                list.join(", ")
            )
        }
    };
    format!(
        "table inet {table}\n\
         delete table inet {table}\n\
         table inet {table} {{\n\
         \tchain untracked_loopback_in {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tiif lo notrack\n\
         \t}}\n\
         \tchain untracked_loopback_out {{\n\
         \t\ttype filter hook output priority raw; policy accept;\n\
         \t\toif lo notrack\n\
         \t}}\n\
         \tchain dnat_to_loopback {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         {dnat}\
         \t}}\n\
         \tchain only_dnat_in {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\t{ours} ct state established,related accept\n\
         \t\t{ours} meta nfproto ipv4 ip daddr 127.0.0.1 ct status dnat accept\n\
         \t\t{ours} drop\n\
         \t}}\n\
         \tchain no_forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\t{ours} drop\n\
         \t\toifname \"{host_if_lead}*\" drop\n\
         \t}}\n\
         }}\n"
    )
}

/// Removes the table if it exists (the leading `table` makes the delete
/// valid either way), in one exec.
pub(crate) fn remove(table: &str) -> String {
    format!("table inet {table}\ndelete table inet {table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_only_this_prefix() {
        let r = install("staccato_ab", "st-ab-", None);
        assert!(r.contains("iifname \"st-ab-*\" meta nfproto ipv4 fib daddr . iif type local dnat ip to 127.0.0.1"));
        assert!(r.contains("oifname \"st-ab-*\" drop"));
        // Every rule is guarded by our interface pattern: the table must
        // never affect traffic of other interfaces on this shared machine.
        for rule in r.lines().map(str::trim).filter(|l| l.ends_with("drop") || l.ends_with("accept")) {
            if !rule.starts_with("type ") {
                assert!(rule.starts_with("iifname \"st-ab-*\"") || rule.starts_with("oifname \"st-ab-*\""), "{rule}");
            }
        }
    }

    #[test]
    fn ports_limit_the_dnat() {
        let r = install("staccato_ab", "st-ab-", Some(&[6379, 5432]));
        assert!(r.contains("meta l4proto { tcp, udp } th dport { 6379, 5432 } dnat ip to 127.0.0.1"), "{r}");
        let r = install("staccato_ab", "st-ab-", Some(&[]));
        assert!(!r.contains("dnat ip"), "{r}");
        assert!(r.contains("type nat hook prerouting"), "{r}");
    }
}
