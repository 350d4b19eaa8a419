//! The engine's side of the cross-language contract
//! (testvectors/contract_v1.json): the STACCATO_* variables it gives
//! launchers are exactly the contract's, and it uses no other but its own.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `"STACCATO_…"` string literal in the `.rs` files under `dir`.
fn literals(dir: &Path, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).expect("source dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            literals(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).expect("source");
            for (i, _) in text.match_indices("\"STACCATO_") {
                let name: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if text[i + 1 + name.len()..].starts_with('"') {
                    out.insert(name);
                }
            }
        }
    }
}

fn names(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_array().expect("a list").iter().map(|n| n.as_str().expect("a name").to_string()).collect()
}

#[test]
fn the_engine_sets_the_contracts_launcher_variables_and_no_others() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("testvectors/contract_v1.json")).expect("contract"))
            .expect("JSON");
    let launcher = names(&c["env"]["launcher"]);
    let own = names(&c["env"]["runtime"]["engine"]);
    let mut used = BTreeSet::new();
    for dir in ["crates/engine/src", "crates/sandbox/src"] {
        literals(&root.join(dir), &mut used);
    }
    let unknown: Vec<_> = used.iter().filter(|n| !launcher.contains(*n) && !own.contains(*n)).collect();
    assert!(unknown.is_empty(), "not in testvectors/contract_v1.json: {unknown:?}");
    let unset: Vec<_> = launcher.iter().filter(|n| !used.contains(*n)).collect();
    assert!(unset.is_empty(), "the contract names launcher variables the engine never sets: {unset:?}");
}
