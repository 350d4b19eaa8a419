//! A function manifest (`staccato.yml`) as a deployer writes it: any text
//! parses to functions that pass validation, or to an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Sources resolve against the base; the fuzz directory exists, so
    // `source: .` and relative paths can succeed.
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Ok(functions) = api::manifest::parse(text, base) {
        for f in functions {
            f.spec.validate_settings().expect("a parsed manifest yields valid settings");
            assert!(f.source_dir.is_absolute());
        }
    }
});
