//! `seglog consume`.

use super::{ExitError, Global};

/// Arguments of `seglog consume`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args, _global: Global) -> anyhow::Result<u8> {
    Err(ExitError::new(
        super::exit::IO,
        "seglog consume is not built yet",
    ))
}
