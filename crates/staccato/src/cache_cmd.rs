//! `staccato cache ls|prune`: the package cache the engine fills when it
//! installs functions' requirements.txt and package.json (crates/pkgcache).
//! It works on the directory directly, so it needs no running engine.

use anyhow::{Context, Result};
use api::units::parse_size;
use clap::{Args, Subcommand};
use pkgcache::{format_size, Cache, DEFAULT_BUDGET_BYTES, DEFAULT_GRACE};
use std::path::PathBuf;
use std::time::SystemTime;

#[derive(Subcommand)]
pub enum CacheCmd {
    /// List cached packages: size, last use, and the functions that use them.
    Ls(CacheArgs),
    /// Remove cached packages that no deployed function uses.
    Prune {
        /// Remove every unused entry (without it: least recently used first, down to the budget).
        #[arg(long, conflicts_with = "max_size")]
        all: bool,
        /// Remove least recently used unused entries until the cache is at most this big (e.g. 500M, 2G).
        #[arg(long, value_parser = parse_size)]
        max_size: Option<u64>,
        #[command(flatten)]
        common: CacheArgs,
    },
}

#[derive(Args)]
pub struct CacheArgs {
    #[arg(long, env = "STACCATO_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The cache's size budget [default: 2G].
    #[arg(long, env = "STACCATO_CACHE_BUDGET", value_parser = parse_size)]
    budget: Option<u64>,
}

impl CacheArgs {
    /// `<state-dir>/cache`, where the engine started by `up` keeps it.
    fn open(&self) -> Result<Cache> {
        let root = crate::up::state_dir(self.state_dir.clone()).join("cache");
        Cache::open(&root, self.budget.unwrap_or(DEFAULT_BUDGET_BYTES))
            .with_context(|| format!("opening the package cache at {}", root.display()))
    }
}

pub fn run(cmd: CacheCmd) -> Result<()> {
    match cmd {
        CacheCmd::Ls(args) => ls(&args.open()?),
        CacheCmd::Prune { all, max_size, common } => prune(&common.open()?, all, max_size),
    }
}

fn ls(cache: &Cache) -> Result<()> {
    let entries = cache.list()?;
    println!("{:<7} {:<28} {:<14} {:>10} {:>10}  USERS", "KIND", "NAME", "VERSION", "SIZE", "LAST-USED");
    let now = SystemTime::now();
    for e in &entries {
        println!(
            "{:<7} {:<28} {:<14} {:>10} {:>10}  {}",
            e.kind.name(),
            clip(&e.name, 28),
            clip(&e.version, 14),
            format_size(e.size_bytes),
            ago(now, e.last_used),
            if e.users.is_empty() { "-".to_string() } else { e.users.join(",") }
        );
    }
    println!(
        "{} entries, {} of {} budget ({})",
        entries.len(),
        format_size(entries.iter().map(|e| e.size_bytes).sum()),
        format_size(cache.budget_bytes()),
        cache.root().display()
    );
    Ok(())
}

fn prune(cache: &Cache, all: bool, max_size: Option<u64>) -> Result<()> {
    let removed = match (all, max_size) {
        (true, _) => cache.prune(None)?,
        (false, Some(max)) => cache.prune(Some(max))?,
        (false, None) => cache.evict_to_budget()?,
    };
    for e in &removed {
        println!("Removed {} {} {} ({})", e.kind.name(), e.name, e.version, format_size(e.size_bytes));
    }
    let left = cache.list()?;
    let freed: u64 = removed.iter().map(|e| e.size_bytes).sum();
    println!(
        "Removed {} entries ({}); {} left in {} entries",
        removed.len(),
        format_size(freed),
        format_size(left.iter().map(|e| e.size_bytes).sum()),
        left.len()
    );
    let target = if all { Some(0) } else { max_size.or(Some(cache.budget_bytes())) };
    let left_bytes: u64 = left.iter().map(|e| e.size_bytes).sum();
    let now = SystemTime::now();
    let recent_unused = left
        .iter()
        .filter(|e| e.users.is_empty() && now.duration_since(e.last_used).unwrap_or_default() < DEFAULT_GRACE)
        .count();
    if recent_unused > 0 && target.is_some_and(|t| left_bytes > t) {
        println!(
            "Kept {recent_unused} unused entries used in the last {} minutes: a deploy may be about to pin them",
            DEFAULT_GRACE.as_secs() / 60
        );
    }
    Ok(())
}

fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut s: String = text.chars().take(width - 1).collect();
    s.push('…');
    s
}

fn ago(now: SystemTime, then: SystemTime) -> String {
    let s = now.duration_since(then).unwrap_or_default().as_secs();
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}
