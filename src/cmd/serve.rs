//! `seglog serve`: open the broker (recovery first), listen, and serve until SIGINT
//! or SIGTERM; then stop accepting, let in-flight requests finish, fsync, release
//! the lock and exit 0.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::connect::parse_positive_duration;
use super::{exit, ExitError, Global};
use crate::engine::broker::{Broker, BrokerOptions};
use crate::engine::error::EngineError;
use crate::engine::net::server::{Server, ServerOptions};
use crate::engine::storage::io::RealStorage;

/// Arguments of `seglog serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Data directory (created 0700 if missing).
    #[arg(long, default_value = "./seglog-data")]
    pub data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free port (printed on stderr).
    #[arg(long, default_value = "127.0.0.1:9494")]
    pub listen: String,
    /// 1: acknowledge each produce after an fsync covering it. N > 1: fsync once N
    /// records wait (acknowledgements do not wait for it).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_every_records: u64,
    /// Longest time written records wait for an fsync: 500ms, 1s, 1m.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub flush_interval: Duration,
    /// Where retention copies segments (log and index, fsynced) before deleting
    /// them: DIR/<topic>/<partition>/. A failed copy keeps the segment for the next
    /// round.
    #[arg(long)]
    pub cold_storage_dir: Option<PathBuf>,
    /// How often retention (and rolling by segment_ms) visits every partition.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub retention_check_interval: Duration,
    /// How often compaction visits every partition of a compacted topic.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub compaction_check_interval: Duration,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
}

/// Set by SIGINT/SIGTERM; the accept loop polls it.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

#[expect(unsafe_code, reason = "installing a signal handler through libc")]
fn install_signal_handlers() -> anyhow::Result<()> {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only stores to a static atomic, which is
        // async-signal-safe; `signal` installs it for the whole process.
        let previous = unsafe { libc::signal(signal, handler as libc::sighandler_t) };
        if previous == libc::SIG_ERR {
            return Err(ExitError::new(
                exit::IO,
                format!("cannot install a handler for signal {signal}"),
            ));
        }
    }
    Ok(())
}

fn open_error(e: EngineError, data_dir: &std::path::Path) -> anyhow::Error {
    match e {
        EngineError::Locked { .. } => ExitError::new(exit::LOCKED, e.to_string()),
        EngineError::InvalidRequest { .. } => ExitError::new(exit::USAGE, e.to_string()),
        other => ExitError::new(
            exit::IO,
            format!(
                "cannot open the data directory {}: {other}",
                data_dir.display()
            ),
        ),
    }
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    install_signal_handlers()?;
    let opts = BrokerOptions {
        flush_every_records: args.flush_every_records,
        flush_interval: args.flush_interval,
        cold_storage_dir: args.cold_storage_dir.clone(),
        retention_check_interval: args.retention_check_interval,
        compaction_check_interval: args.compaction_check_interval,
    };
    let broker = Broker::open(&args.data_dir, Arc::new(RealStorage), opts)
        .map_err(|e| open_error(e, &args.data_dir))?;
    let mut err = std::io::stderr().lock();
    if !global.quiet {
        for line in broker.startup_report() {
            writeln!(err, "seglog: {line}")?;
        }
    }
    let server_opts = ServerOptions {
        max_connections: args.max_connections as usize,
        log_errors: !global.quiet,
        ..ServerOptions::default()
    };
    let server = match Server::bind(&args.listen, Arc::clone(&broker), server_opts) {
        Ok(s) => s,
        Err(e) => {
            let _ = broker.shutdown();
            return Err(ExitError::new(
                exit::IO,
                format!("cannot listen on {}: {e}", args.listen),
            ));
        }
    };
    // Tests and scripts wait for this line; it carries the real port.
    writeln!(
        err,
        "seglog: listening on {} (data {})",
        server.local_addr(),
        args.data_dir.display()
    )?;
    drop(err);
    let served = server.run(&STOP);
    if !global.quiet {
        eprintln!("seglog: shutting down");
    }
    let shut = broker.shutdown();
    served.map_err(|e| {
        ExitError::new(
            exit::IO,
            format!("serving on {} failed: {e}", server.local_addr()),
        )
    })?;
    shut.map_err(|e| ExitError::new(exit::IO, format!("shutting down the broker failed: {e}")))?;
    Ok(exit::OK)
}
