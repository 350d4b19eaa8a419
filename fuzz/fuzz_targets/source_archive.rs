//! A function's source as a client uploads it (a tar.gz): it is refused
//! whole, or it unpacks entirely inside the destination; what `check`
//! accepts (the gateway stores it) `unpack` unpacks (the engine).
#![no_main]

use api::archive::{check, unpack, Limits};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const LIMITS: Limits =
    Limits { archive_bytes_max: 1 << 20, unpacked_bytes_max: 4 << 20, entries_max: 500, depth_max: 8 };

/// Everything under `dir` is a plain file or directory inside it.
fn contained(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        assert!(t.is_file() || t.is_dir(), "{:?} is neither a file nor a directory", e.path());
        if t.is_dir() {
            contained(&e.path());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(summary) = check(data, &LIMITS) else { return };
    assert!(summary.bytes <= LIMITS.unpacked_bytes_max);
    let root = std::env::temp_dir().join(format!("staccato-fuzz-archive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let dest = root.join("src");
    // What check accepted unpacks, and only below dest.
    if let Err(e) = unpack(data, &dest, &LIMITS) {
        panic!("check accepted what unpack refuses: {e}");
    }
    contained(&root);
    std::fs::remove_dir_all(&root).unwrap();
});
