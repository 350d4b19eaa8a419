//! Names and addresses, all derived from (prefix, index) so that cleanup can
//! find a crashed engine's leftovers from names alone, with no state file.

use crate::Error;
use std::net::Ipv4Addr;

/// 10.200.0.0/16 carved into /30s: index i owns 10.200.0.0 + 4i.
pub const NETS_MAX: u32 = 1 << 14;
/// Prefix length of every veth pair's subnet.
pub const SUBNET_PREFIX_LEN: u8 = 30;
/// The veth end inside the namespace. It lives alone in its namespace, so a
/// fixed, conventional name is safe and is what a function expects to see.
pub const NS_IF: &str = "eth0";
/// `st-<prefix>-<index>` must fit IFNAMSIZ - 1 = 15 bytes with a 5-digit
/// index: 3 + 6 + 1 + 5.
pub const PREFIX_LEN_MAX: usize = 6;

const BLOCK: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 0);
/// Where `ip netns` keeps its names. iproute2 uses /run/netns; /var/run is a
/// symlink to /run on every current distribution, and naming the real
/// directory avoids depending on that symlink.
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// Only [a-z0-9]: the prefix goes into interface names, netns names and an
/// nft table name, and must never contain '-', which ends it in every name
/// (so prefix "a" can never match "ab"'s leftovers).
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let ok_chars = prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if prefix.is_empty() || prefix.len() > PREFIX_LEN_MAX || !ok_chars {
        return Err(Error::BadPrefix(prefix.to_string()));
    }
    Ok(())
}

pub(crate) fn validate_index(index: u32) -> Result<(), Error> {
    if index >= NETS_MAX {
        return Err(Error::IndexOutOfRange(index));
    }
    Ok(())
}

pub(crate) fn table_name(prefix: &str) -> String {
    format!("staccato_{prefix}")
}

pub(crate) fn netns_lead(prefix: &str) -> String {
    format!("stc-{prefix}-")
}

pub(crate) fn host_if_lead(prefix: &str) -> String {
    format!("st-{prefix}-")
}

pub(crate) fn netns_name(prefix: &str, index: u32) -> String {
    format!("{}{index}", netns_lead(prefix))
}

pub(crate) fn host_if(prefix: &str, index: u32) -> String {
    format!("{}{index}", host_if_lead(prefix))
}

/// The index in `name` if it is `lead` followed by digits only; anything
/// else is not ours, even if it starts the same way.
pub(crate) fn index_in(name: &str, lead: &str) -> Option<u32> {
    let digits = name.strip_prefix(lead)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// (subnet, host side, namespace side) of index `index` (< NETS_MAX).
pub(crate) fn addresses(index: u32) -> (Ipv4Addr, Ipv4Addr, Ipv4Addr) {
    let subnet = u32::from(BLOCK) + 4 * index;
    (Ipv4Addr::from(subnet), Ipv4Addr::from(subnet + 1), Ipv4Addr::from(subnet + 2))
}

pub(crate) fn mask(prefix_len: u8) -> u32 {
    match prefix_len {
        0 => 0,
        n => u32::MAX << (32 - u32::from(n.min(32))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_documented_scheme() {
        // index i → 10.200.(i/64).(4*(i%64)+1) on the host side.
        for i in [0, 1, 63, 64, 1000, NETS_MAX - 1] {
            let (net, host, ns) = addresses(i);
            assert_eq!(host, Ipv4Addr::new(10, 200, (i / 64) as u8, (4 * (i % 64) + 1) as u8));
            assert_eq!(u32::from(net) + 1, u32::from(host));
            assert_eq!(u32::from(host) + 1, u32::from(ns));
        }
        assert_eq!(addresses(NETS_MAX - 1).2, Ipv4Addr::new(10, 200, 255, 254));
    }

    #[test]
    fn longest_names_fit_ifnamsiz() {
        let host = host_if("abcdef", NETS_MAX - 1);
        assert_eq!(host, "st-abcdef-16383");
        assert!(host.len() <= 15);
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("a1").is_ok());
        assert!(validate_prefix("abcdef").is_ok());
        for bad in ["", "abcdefg", "a-b", "A", "a b", "a*", "é"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
        assert!(validate_index(NETS_MAX).is_err());
    }

    #[test]
    fn only_exact_names_are_ours() {
        assert_eq!(index_in("st-ab-12", &host_if_lead("ab")), Some(12));
        assert_eq!(index_in("st-ab-12", &host_if_lead("a")), None);
        assert_eq!(index_in("st-ab-", &host_if_lead("ab")), None);
        assert_eq!(index_in("st-ab-1x", &host_if_lead("ab")), None);
        assert_eq!(index_in("stc-ab-7", &netns_lead("ab")), Some(7));
    }

    #[test]
    fn masks() {
        assert_eq!(mask(0), 0);
        assert_eq!(mask(16), 0xffff_0000);
        assert_eq!(mask(30), 0xffff_fffc);
        assert_eq!(mask(32), u32::MAX);
    }
}
