//! Runs the shared message vectors (testvectors/message_v1.json): valid cases
//! decode to the listed fields and re-encode byte for byte; invalid ones are
//! rejected. Every language runtime runs the same file.

use serde_json::Value;
use staccato_wire::message::{decode_header, Header, Kind, Message};

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit")).collect()
}

fn kind_named(name: &str) -> Kind {
    (1..=8).map(|c| Kind::from_code(c).expect("known")).find(|k| format!("{k:?}") == name).expect("kind name")
}

fn u64_field(f: &Value, key: &str) -> u64 {
    f[key].as_str().expect("u64 fields are strings").parse().expect("decimal u64")
}

fn header_from(f: &Value) -> Header {
    let n = |k: &str| f[k].as_u64().expect("number");
    Header {
        kind: kind_named(f["kind"].as_str().expect("kind")),
        flags: n("flags") as u16,
        payload_len: n("payload_len") as u32,
        call_id: u64_field(f, "call_id"),
        parent_call_id: u64_field(f, "parent_call_id"),
        worker_id: n("worker_id") as u32,
        name_len: n("name_len") as u16,
        error_kind: n("error_kind") as u16,
        deadline_us: u64_field(f, "deadline_us"),
        send_ts_ns: u64_field(f, "send_ts_ns"),
        aux: n("aux") as u32,
    }
}

#[test]
fn shared_message_vectors() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testvectors/message_v1.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("json");
    let tests = doc["tests"].as_array().expect("tests");
    assert_eq!(tests.len() as u64, doc["numberOfTests"].as_u64().expect("count"));
    let (mut valid, mut invalid) = (0, 0);
    for t in tests {
        let id = &t["tcId"];
        let raw = unhex(t["msg"].as_str().expect("msg"));
        match t["result"].as_str().expect("result") {
            "valid" => {
                let f = &t["fields"];
                let want = header_from(f);
                let got = decode_header(&raw).unwrap_or_else(|e| panic!("tc {id}: rejected: {e}"));
                assert_eq!(got, want, "tc {id}");
                let inline = unhex(f["inline"].as_str().expect("inline"));
                let m = Message::new(&want, &inline);
                assert_eq!(m.buf.as_slice(), raw.as_slice(), "tc {id}: re-encoding differs");
                assert_eq!(m.inline(&got), inline.as_slice(), "tc {id}");
                valid += 1;
            }
            "invalid" => {
                assert!(decode_header(&raw).is_err(), "tc {id}: accepted an invalid message");
                invalid += 1;
            }
            other => panic!("tc {id}: unknown result {other}"),
        }
    }
    assert!(valid > 10 && invalid > 10, "vector file lost cases: {valid} valid, {invalid} invalid");
}

fn contract() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testvectors/contract_v1.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read contract")).expect("contract JSON")
}

/// The error kinds, their names and HTTP statuses are exactly the contract's.
#[test]
fn error_kinds_are_the_contracts() {
    use staccato_wire::ErrorKind;
    let c = contract();
    let want: Vec<(u16, String, u16)> = c["error_kinds"]
        .as_array()
        .expect("error_kinds")
        .iter()
        .map(|k| {
            let n = |f: &str| k[f].as_u64().expect("number") as u16;
            (n("code"), k["name"].as_str().expect("name").to_string(), n("http_status"))
        })
        .collect();
    let ours: Vec<(u16, String, u16)> =
        ErrorKind::ALL.iter().map(|k| (k.code(), k.name().to_string(), k.http_status())).collect();
    assert_eq!(ours, want);
    assert_eq!(ErrorKind::from_code(want.len() as u16 + 1), None);
}

#[test]
fn payload_file_names_are_the_contracts() {
    let c = contract();
    for f in c["payload_files"].as_array().expect("payload_files") {
        let call_id: u64 = f["call_id"].as_str().expect("string").parse().expect("u64");
        let kind = kind_named(f["kind"].as_str().expect("kind"));
        let path = format!("shm/{}", staccato_wire::message::shm_file_name(call_id, kind));
        assert_eq!(path, f["path"].as_str().expect("path"));
    }
}
