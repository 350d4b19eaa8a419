//! Benchmarks (programs, not timed tests).
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Microbenchmarks: pipes, message channels, internal and external calls.
    Micro,
}

pub fn run(_b: BenchCmd) -> Result<()> {
    anyhow::bail!("not built yet")
}
