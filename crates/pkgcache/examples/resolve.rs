//! Resolves dependencies through a cache by hand, printing progress:
//! `cargo run -p staccato-pkgcache --example resolve -- CACHE_DIR (requirements.txt | package-dir)`.

use staccato_pkgcache::{Cache, DEFAULT_BUDGET_BYTES};
use std::path::PathBuf;

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [root, target] = &args[..] else {
        eprintln!("usage: resolve CACHE_DIR (requirements.txt | package-dir)");
        std::process::exit(2);
    };
    let cache = Cache::open(root, DEFAULT_BUDGET_BYTES).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let python = std::env::var_os("PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let mut progress = |line: &str| println!("  {line}");
    let result =
        if target.is_dir() { cache.node(target, &mut progress) } else { cache.python(&python, target, &mut progress) };
    match result {
        Ok(r) => r.dirs.iter().for_each(|d| println!("{}", d.display())),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
