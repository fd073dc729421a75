//! `seglog recover`.

use super::{ExitError, Global};

/// Arguments of `seglog recover`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args, _global: Global) -> anyhow::Result<u8> {
    Err(ExitError::new(
        super::exit::IO,
        "seglog recover is not built yet",
    ))
}
