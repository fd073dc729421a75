//! `seglog reindex`.

use super::{ExitError, Global};

/// Arguments of `seglog reindex`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args, _global: Global) -> anyhow::Result<u8> {
    Err(ExitError::new(
        super::exit::IO,
        "seglog reindex is not built yet",
    ))
}
