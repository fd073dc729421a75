//! `seglog serve`: bind the listen address, open the broker (recovery first), and
//! serve until SIGINT or SIGTERM; then stop accepting, let in-flight requests finish,
//! fsync, release the lock and exit 0. SIGHUP is logged and changes nothing (the broker
//! has no files to reopen: its log goes to stderr).
//!
//! The broker log goes to stderr through `tracing` (text or JSON lines, with
//! timestamps and levels); this is the only place a global subscriber is installed.
//! Besides the log, stderr always carries one plain line `seglog: listening on ADDR
//! (data DIR)`, also with `--quiet`: scripts read the port from it. With
//! `--metrics-listen`, a line `seglog: metrics listening on ADDR` comes before it.

use std::io::{IsTerminal, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::connect::{parse_interval_or_off, parse_listen_addr, parse_positive_duration};
use super::{exit, ExitError, Global};
use crate::engine::broker::{Broker, BrokerOptions};
use crate::engine::error::EngineError;
use crate::engine::keys::AuthMode;
use crate::engine::net::kafka::KafkaServer;
use crate::engine::net::limits::{Limits, RECORDS_PER_REQUEST_HARD_MAX};
use crate::engine::net::metrics::{self, MetricsServer, NetMetrics};
use crate::engine::net::server::{Server, ServerOptions};
use crate::engine::net::tls::ServerTls;
use crate::engine::storage::io::RealStorage;
use crate::format::topic::PARTITIONS_MAX;
use crate::format::wire::{FRAME_BYTES_MAX, FRAME_HEAD_LEN, RECORD_FIELD_BYTES_MAX, TOPICS_MAX};

/// Arguments of `seglog serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Data directory (created 0700 if missing; its parent must exist).
    #[arg(long, default_value = "./seglog-data")]
    pub data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free port. The bound address is printed on
    /// stderr as `seglog: listening on ADDR`, also with --quiet.
    #[arg(long, default_value = "127.0.0.1:9494", value_parser = parse_listen_addr)]
    pub listen: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default); port 0 picks
    /// a free port, printed on stderr as `seglog: metrics listening on ADDR`. Every
    /// other path answers 404.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr)]
    pub metrics_listen: Option<String>,
    /// required: every connection logs in with an API key (`seglog keys`); off: no
    /// login, every request allowed. Default: required as soon as DATA/api_keys.json
    /// holds a key.
    #[arg(long, value_enum, value_name = "MODE")]
    pub auth: Option<AuthFlag>,
    /// Also speak the Kafka protocol on ADDR (off by default; 127.0.0.1:9092 is the
    /// usual choice); port 0 picks a free port, printed on stderr as `seglog: kafka
    /// listening on ADDR`.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr)]
    pub kafka_listen: Option<String>,
    /// HOST:PORT given to Kafka clients in Metadata and FindCoordinator (default: the
    /// address --kafka-listen bound).
    #[arg(long, value_name = "HOST:PORT", requires = "kafka_listen")]
    pub kafka_advertised: Option<String>,
    /// 1: acknowledge each produce after an fsync covering it. N > 1: fsync once N
    /// records wait (acknowledgements do not wait for it).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_every_records: u64,
    /// Longest time written records wait for an fsync: 500ms, 1s, 1m.
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_positive_duration)]
    pub flush_interval: Duration,
    /// Where retention copies segments (log and index, fsynced) before deleting
    /// them: DIR/<topic>/<partition>/. A failed copy keeps the segment for the next
    /// round. Checked at startup: DIR must be a writable directory, or its parent
    /// must exist (DIR is then created 0700).
    #[arg(long)]
    pub cold_storage_dir: Option<PathBuf>,
    /// How often retention (and rolling by segment_ms) visits every partition.
    #[arg(long, allow_hyphen_values = true, default_value = "5m", value_parser = parse_positive_duration)]
    pub retention_check_interval: Duration,
    /// How often compaction visits every partition of a compacted topic.
    #[arg(long, allow_hyphen_values = true, default_value = "5m", value_parser = parse_positive_duration)]
    pub compaction_check_interval: Duration,
    /// How often the scrub reads every sealed segment through to find damage early
    /// (its first pass starts this long after the start, at most 10m): 12h, 30m, or
    /// off. Damage found is logged and shown by `topics describe`; a cluster node
    /// mends it from a peer.
    #[arg(long, allow_hyphen_values = true, default_value = "24h", value_parser = parse_interval_or_off)]
    pub scrub_interval: Duration,
    /// Bytes per second the scrub reads, for all partitions together.
    #[arg(long, default_value_t = crate::engine::broker::SCRUB_RATE_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scrub_rate: u64,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// Read handles of sealed segments kept open at once, least recently used first
    /// out (default: a quarter of the descriptor limit, 64..=16384). Each partition
    /// keeps 3 more open for its active segment.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub max_open_files: Option<u64>,
    /// Bytes reserved (fallocate) ahead of each active segment's writer, so appends
    /// do not grow the file; also the zero-ahead window. 0: off. Sealing a segment
    /// trims what it did not use.
    #[arg(long, default_value_t = crate::engine::partition::zero::PREALLOCATE_BYTES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub preallocate_bytes: u64,
    /// on: one background thread writes and fsyncs zeros ahead of each active
    /// segment's writer (in 4 MiB chunks, up to --preallocate-bytes ahead), so a
    /// produce's fsync overwrites written blocks. off: preallocation only.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub zero_ahead: OnOff,
    /// Bytes per second the zero-ahead worker writes, for all segments together.
    #[arg(long, default_value_t = crate::engine::partition::zero::ZERO_RATE_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub zero_rate: u64,
    /// Segment files retention would delete (without --cold-storage-dir) are kept in
    /// DATA/spares/ instead, up to this many per partition of the node, and reused by
    /// the next roll of any partition (their blocks already allocated). 0: off (a
    /// DATA/spares/ left by an earlier start is removed).
    #[arg(long, default_value_t = crate::engine::partition::spares::SPARES_PER_PARTITION_DEFAULT,
          value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub spares_per_partition: u64,
    /// Empty spare files kept ready in DATA/spares/ for rolls, made when retention
    /// and compaction return too few (they count against --spares-per-partition,
    /// and give up their place to a returned segment); 0 makes none.
    #[arg(long, default_value_t = crate::engine::partition::spares::NEW_SPARES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub new_spares: u64,
    /// Format of the broker log on stderr: text or json (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter: error, warn, info, debug, trace or off, or TARGET=LEVEL directives
    /// (`seglog=debug`), comma-separated. Default: RUST_LOG if set, else info (error
    /// with --quiet).
    #[arg(long)]
    pub log_level: Option<String>,
    /// Shortest session timeout a consumer-group member may ask for.
    #[arg(long, allow_hyphen_values = true, default_value = "6s", value_parser = parse_positive_duration)]
    pub group_min_session_timeout: Duration,
    /// Longest session timeout a consumer-group member may ask for.
    #[arg(long, allow_hyphen_values = true, default_value = "30m", value_parser = parse_positive_duration)]
    pub group_max_session_timeout: Duration,
    /// How long a consumer group without members keeps its committed offsets: 7d = 168h.
    #[arg(long, allow_hyphen_values = true, default_value = "168h", value_parser = parse_positive_duration)]
    pub offsets_retention: Duration,
    /// How long the broker remembers an idempotent producer it has not heard from
    /// (plain partitions; a replicated partition forgets after a fixed day of its
    /// Raft log's time, the same on every replica).
    #[arg(long, allow_hyphen_values = true, default_value = "24h", value_parser = parse_positive_duration)]
    pub producer_id_expiration: Duration,
    /// TLS: PEM file of the listener's certificate chain (with --tls-key). While TLS
    /// is on, plaintext connections are refused unless --allow-plaintext.
    #[arg(long, value_name = "PEM", requires = "tls_key", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: PEM file of the private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// TLS: require client certificates signed by this CA (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert", help_heading = "TLS")]
    pub tls_client_ca: Option<PathBuf>,
    /// TLS: serve plaintext connections too, on the same port.
    #[arg(long, requires = "tls_cert", help_heading = "TLS")]
    pub allow_plaintext: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// This node's id in its cluster (1..=32767, listed in --peers).
    #[arg(long, value_name = "N", requires_all = ["raft_listen", "peers"],
          value_parser = clap::value_parser!(u64).range(1..=32767), help_heading = "Cluster")]
    pub node_id: Option<u64>,
    /// Address the other nodes' Raft connections come to; port 0 picks a free port,
    /// printed on stderr as `seglog: raft listening on ADDR`.
    #[arg(long, value_name = "ADDR", requires_all = ["node_id", "peers"], help_heading = "Cluster",
          value_parser = parse_listen_addr)]
    pub raft_listen: Option<String>,
    /// Every node of the cluster, this one included: ID=HOST:PORT,... (Raft
    /// addresses). This node reaches node ID at the address given here.
    #[arg(long, value_name = "ID=ADDR,...", requires_all = ["node_id", "raft_listen"],
          help_heading = "Cluster")]
    pub peers: Option<String>,
    /// File holding the cluster secret (at least 16 bytes; a final newline is not
    /// part of it), the same on every node: each Raft connection is refused unless
    /// both nodes prove they hold it. Without one, anyone who reaches --raft-listen
    /// can act as a node of the cluster. Make one with
    /// `head -c 32 /dev/urandom | base64 > FILE` (mode 0600).
    #[arg(
        long,
        value_name = "FILE",
        requires = "peers",
        help_heading = "Cluster"
    )]
    pub cluster_secret_file: Option<PathBuf>,
    /// TLS on the Raft connections: PEM file of this node's certificate chain. It
    /// serves both ways (extended key usages serverAuth and clientAuth) and names
    /// the host of this node's address in --peers (DNS name or IP address); a
    /// second DNS name seglog-node-ID binds it to this node's id, and then every
    /// peer's must name its id too. With --raft-tls-key and --raft-tls-ca; every
    /// node must have them.
    #[arg(long, value_name = "PEM", requires_all = ["peers", "raft_tls_key", "raft_tls_ca"],
          help_heading = "Cluster")]
    pub raft_tls_cert: Option<PathBuf>,
    /// TLS on the Raft connections: PEM file of the private key of --raft-tls-cert.
    #[arg(long, value_name = "PEM", requires_all = ["peers", "raft_tls_cert", "raft_tls_ca"],
          help_heading = "Cluster")]
    pub raft_tls_key: Option<PathBuf>,
    /// TLS on the Raft connections: PEM file of the CA that signed every node's
    /// --raft-tls-cert. A node accepts and dials only peers whose certificate it
    /// signed.
    #[arg(long, value_name = "PEM", requires_all = ["peers", "raft_tls_cert", "raft_tls_key"],
          help_heading = "Cluster")]
    pub raft_tls_ca: Option<PathBuf>,
    /// Snapshot each replicated partition every N applied Raft entries, and purge
    /// its Raft log below the snapshot less 1000 entries (0: never; the Raft logs
    /// are then kept whole).
    #[arg(long, value_name = "N", default_value_t = crate::engine::replication::manager::SNAPSHOT_ENTRIES_DEFAULT,
          help_heading = "Cluster")]
    pub raft_snapshot_entries: u64,
}

/// The configurable limits of `serve` (the README table "Limits"); each is at most
/// the protocol's hard cap, and the defaults are the caps.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Connections served at once from one source IP address (default: --max-connections);
    /// also spelled --max-connections-per-ip.
    #[arg(long, visible_alias = "max-connections-per-ip", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections_per_address: Option<u64>,
    /// Largest request frame in bytes (at most 67108864, the protocol's limit).
    #[arg(long, default_value_t = u64::from(FRAME_BYTES_MAX),
          value_parser = clap::value_parser!(u64).range(FRAME_HEAD_LEN as u64..=u64::from(FRAME_BYTES_MAX)))]
    pub max_frame_bytes: u64,
    /// Records in one produce request, all partitions together.
    #[arg(long, default_value_t = RECORDS_PER_REQUEST_HARD_MAX,
          value_parser = clap::value_parser!(u64).range(1..=RECORDS_PER_REQUEST_HARD_MAX))]
    pub max_records_per_request: u64,
    /// Bytes a connection may hold read but unanswered; it stops reading while it
    /// holds that many (default and minimum: --max-frame-bytes).
    #[arg(long, value_parser = clap::value_parser!(u64).range(FRAME_HEAD_LEN as u64..=u64::from(u32::MAX)))]
    pub max_inflight_bytes: Option<u64>,
    /// Topics the broker holds; creating one more is refused.
    #[arg(long, default_value_t = TOPICS_MAX, value_parser = clap::value_parser!(u32).range(1..=i64::from(TOPICS_MAX)))]
    pub max_topics: u32,
    /// Partitions a new topic may have.
    #[arg(long, default_value_t = PARTITIONS_MAX, value_parser = clap::value_parser!(u32).range(1..=i64::from(PARTITIONS_MAX)))]
    pub max_partitions_per_topic: u32,
    /// Largest record key in bytes.
    #[arg(long, default_value_t = RECORD_FIELD_BYTES_MAX, value_parser = clap::value_parser!(u32).range(0..=i64::from(RECORD_FIELD_BYTES_MAX)))]
    pub max_key_bytes: u32,
    /// Largest record value in bytes (a topic's max_record_bytes applies too).
    #[arg(long, default_value_t = RECORD_FIELD_BYTES_MAX, value_parser = clap::value_parser!(u32).range(0..=i64::from(RECORD_FIELD_BYTES_MAX)))]
    pub max_value_bytes: u32,
    /// Close a connection that sends no request for this long: 30s, 10m (default: never).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_positive_duration)]
    pub idle_timeout: Option<Duration>,
    /// Longest a peer may stall in the middle of a request, or take to read a
    /// response, before its connection is dropped.
    #[arg(long, allow_hyphen_values = true, default_value = "30s", value_parser = parse_positive_duration)]
    pub io_timeout: Duration,
}

impl LimitArgs {
    /// The limits to serve with; exit 64 for a combination the broker refuses.
    fn limits(&self, max_connections: u64) -> anyhow::Result<Limits> {
        let frame = u32::try_from(self.max_frame_bytes).unwrap_or(FRAME_BYTES_MAX);
        let limits = Limits {
            connections_per_address_max: usize::try_from(
                self.max_connections_per_address.unwrap_or(max_connections),
            )
            .unwrap_or(usize::MAX),
            frame_bytes_max: frame,
            records_per_request_max: self.max_records_per_request,
            inflight_bytes_max: self.max_inflight_bytes.unwrap_or(u64::from(frame)),
            topics_max: self.max_topics,
            partitions_per_topic_max: self.max_partitions_per_topic,
            key_bytes_max: self.max_key_bytes,
            value_bytes_max: self.max_value_bytes,
            idle_timeout: self.idle_timeout,
        };
        limits.validate().map_err(|e| {
            let hint = if e.name == "inflight_bytes_max" {
                " (--max-inflight-bytes must be at least --max-frame-bytes)"
            } else {
                ""
            };
            ExitError::usage(format!("invalid limit: {e}{hint}"))
        })?;
        Ok(limits)
    }
}

/// The listener's TLS settings, loaded before the broker opens (exit 64 for a file
/// that cannot be used, 74 for one that cannot be read).
fn server_tls(args: &Args) -> anyhow::Result<Option<ServerTls>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    ServerTls::from_pem_files(
        cert,
        key,
        args.tls_client_ca.as_deref(),
        args.allow_plaintext,
    )
    .map(Some)
    .map_err(|e| super::connect::tls_setup_error(&e, "cannot set up TLS"))
}

/// The Raft connections' TLS settings (exit 64 for a file that cannot be used, 74
/// for one that cannot be read).
fn peer_tls(
    args: &Args,
    node: u64,
    others: &[u64],
) -> anyhow::Result<Option<crate::engine::replication::peer_tls::PeerTls>> {
    let (Some(cert), Some(key), Some(ca)) =
        (&args.raft_tls_cert, &args.raft_tls_key, &args.raft_tls_ca)
    else {
        return Ok(None);
    };
    crate::engine::replication::peer_tls::PeerTls::from_pem_files(cert, key, ca, node, others)
        .map(Some)
        .map_err(|e| {
            super::connect::tls_setup_error(&e, "cannot set up TLS for Raft (--raft-tls-*)")
        })
}

/// Reads `--cluster-secret-file` (exit 74 when unreadable, 64 when it holds no
/// usable secret); also returns its permission bits.
fn cluster_secret(
    path: Option<&Path>,
) -> anyhow::Result<Option<(crate::engine::replication::secret::ClusterSecret, u32)>> {
    use crate::engine::replication::secret::ClusterSecret;
    let Some(path) = path else {
        return Ok(None);
    };
    let (secret, mode) = ClusterSecret::read(path).map_err(|e| {
        let code = if e.is_unreadable() {
            exit::IO
        } else {
            exit::USAGE
        };
        ExitError::new(code, e.to_string())
    })?;
    Ok(Some((secret, mode)))
}

/// `--auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthFlag {
    Required,
    Off,
}

/// A switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// How the broker log is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event: time, level, message, fields.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the event's fields.
    Json,
}

/// Bounds of the default `--max-open-files`.
const OPEN_FILES_DEFAULT_MIN: u64 = 64;
const OPEN_FILES_DEFAULT_MAX: u64 = 16384;
/// The soft descriptor limit tried when the hard limit is unlimited.
const NOFILE_UNLIMITED_TRY: u64 = 1 << 20;

/// Set by SIGINT/SIGTERM; the accept loop polls it.
static STOP: AtomicBool = AtomicBool::new(false);
/// Set by SIGHUP; a watcher thread logs it and clears it.
static HUP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_hup(_signal: libc::c_int) {
    HUP.store(true, Ordering::SeqCst);
}

#[expect(unsafe_code, reason = "installing a signal handler through libc")]
fn install_signal_handlers() -> anyhow::Result<()> {
    let stop = on_signal as extern "C" fn(libc::c_int);
    let hup = on_hup as extern "C" fn(libc::c_int);
    for (signal, handler) in [
        (libc::SIGINT, stop),
        (libc::SIGTERM, stop),
        (libc::SIGHUP, hup),
    ] {
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

/// The levels `--log-level` takes, alone or after `TARGET=`.
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Refuses (64) a `--log-level` with a directive that is not a level (`info`) or
/// `TARGET=LEVEL` (`seglog=debug`), comma-separated: env-filter reads a bare word such
/// as `infoo` as a target, and the broker would then log nothing.
fn check_log_level(value: &str) -> anyhow::Result<()> {
    let is_level = |l: &str| LOG_LEVELS.iter().any(|x| x.eq_ignore_ascii_case(l.trim()));
    let directives: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(ExitError::usage(format!(
            "--log-level {value:?} names no level (one of {})",
            LOG_LEVELS.join(", ")
        )));
    }
    for d in directives {
        let ok = match d.rsplit_once('=') {
            Some((target, level)) => !target.trim().is_empty() && is_level(level),
            None => is_level(d),
        };
        if !ok {
            return Err(ExitError::usage(format!(
                "--log-level {value:?}: {d:?} is not a level ({}) or TARGET=LEVEL (seglog=debug)",
                LOG_LEVELS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Installs the process's log subscriber (stderr, text or JSON).
fn install_log(args: &Args, global: Global) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let directives = match (&args.log_level, std::env::var("RUST_LOG")) {
        (Some(level), _) => {
            check_log_level(level)?;
            level.clone()
        }
        (None, Ok(env)) if !env.trim().is_empty() => env,
        _ if global.quiet => "error".to_string(),
        _ => "info".to_string(),
    };
    let filter = EnvFilter::try_new(&directives).map_err(|e| {
        ExitError::new(
            exit::USAGE,
            format!("invalid log filter {directives:?} (--log-level or RUST_LOG): {e}"),
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    installed.map_err(|e| ExitError::new(exit::IO, format!("cannot start the log: {e}")))
}

/// Raises the soft descriptor limit to the hard one and logs both; returns the soft
/// limit in force (`None`: unlimited).
fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let want = before.maximum.unwrap_or(NOFILE_UNLIMITED_TRY);
    let mut now = before.current;
    if before.current.is_some_and(|soft| soft < want) {
        let raised = Rlimit {
            current: Some(want),
            maximum: before.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => now = Some(want),
            Err(e) => tracing::warn!(
                soft = %shown(before.current),
                hard = %shown(before.maximum),
                error = %e,
                "cannot raise the file descriptor limit"
            ),
        }
    }
    tracing::info!(
        soft_before = %shown(before.current),
        soft = %shown(now),
        hard = %shown(before.maximum),
        "file descriptor limit (soft raised to hard)"
    );
    now
}

fn shown(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_string(), |n| n.to_string())
}

/// The default `--max-open-files`: a quarter of the descriptor limit.
fn default_open_files(soft: Option<u64>) -> u64 {
    (soft.unwrap_or(NOFILE_UNLIMITED_TRY) / 4).clamp(OPEN_FILES_DEFAULT_MIN, OPEN_FILES_DEFAULT_MAX)
}

/// Refuses a `--data-dir` that is not a directory, or whose parent is missing: only
/// the last component is created.
pub(crate) fn check_data_dir(data_dir: &Path) -> anyhow::Result<()> {
    if data_dir.is_dir() {
        return Ok(());
    }
    if data_dir.exists() {
        return Err(ExitError::new(
            exit::IO,
            format!(
                "the data directory {} is not a directory",
                data_dir.display()
            ),
        ));
    }
    if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(ExitError::new(
                exit::IO,
                format!(
                    "the parent directory {} of the data directory {} does not exist \
                     (only the last component is created)",
                    parent.display(),
                    data_dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a `--cold-storage-dir` that retention could not copy into, as
/// `--data-dir` is refused: a path that is not a directory, a directory this process
/// cannot write, or a missing directory whose parent is missing or not writable (only
/// the last component is created, 0700, when the broker opens).
fn check_cold_storage_dir(dir: &Path) -> anyhow::Result<()> {
    use rustix::fs::{access, Access};
    let refuse = |why: String| {
        ExitError::new(
            exit::IO,
            format!("--cold-storage-dir {}: {why}", dir.display()),
        )
    };
    let writable = |p: &Path| access(p, Access::WRITE_OK | Access::EXEC_OK).is_ok();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => match writable(dir) {
            true => Ok(()),
            false => Err(refuse("the directory is not writable".into())),
        },
        Ok(_) => Err(refuse("not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = dir
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !parent.is_dir() {
                return Err(refuse(format!(
                    "the parent directory {} does not exist (serve creates only the last component)",
                    parent.display()
                )));
            }
            match writable(parent) {
                true => Ok(()),
                false => Err(refuse(format!(
                    "cannot create it: the parent directory {} is not writable",
                    parent.display()
                ))),
            }
        }
        Err(e) => Err(refuse(e.to_string())),
    }
}

/// Creates a missing `--cold-storage-dir` (its last component only, 0700, as the
/// data directory) and makes the name durable, once the listen addresses are bound.
fn create_cold_storage_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    let failed = |e: std::io::Error| {
        ExitError::new(
            exit::IO,
            format!(
                "--cold-storage-dir {}: cannot create it: {e}",
                dir.display()
            ),
        )
    };
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(failed)?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::engine::storage::io::Storage::sync_dir(&RealStorage, parent).map_err(failed)
}

/// Refuses (73) a data directory whose `LOCK` another broker or tool holds, before
/// anything is bound: a second broker on the same directory and address is told of
/// the lock, not of the address in use. Only probes an existing `LOCK` (creates
/// nothing); the broker takes the lock for good when it opens.
fn check_data_dir_unlocked(data_dir: &Path) -> anyhow::Result<()> {
    use crate::engine::storage::lock::{DirLock, LockError};
    if !data_dir.join(crate::format::names::LOCK_FILE).is_file() {
        return Ok(());
    }
    match DirLock::acquire(data_dir) {
        Ok(_probe) => Ok(()),
        Err(e @ LockError::Held { .. }) => Err(ExitError::new(exit::LOCKED, e.to_string())),
        // Anything else is for the open to report, with its context.
        Err(_) => Ok(()),
    }
}

/// Exit 64 when no session timeout fits between the group limits: a broker that
/// would refuse every `consume --group`.
fn check_session_timeouts(args: &Args) -> anyhow::Result<()> {
    let (min, max) = (
        args.group_min_session_timeout,
        args.group_max_session_timeout,
    );
    if min > max {
        return Err(ExitError::usage(format!(
            "--group-min-session-timeout {min:?} is longer than --group-max-session-timeout \
             {max:?}: no consumer group member could join"
        )));
    }
    Ok(())
}

/// Largest node id (a node's producer ids start at `id << 48`).
const NODE_ID_MAX: u64 = 32767;

/// Parses `--peers` (`ID=HOST:PORT,...`), which must list `self_id`, checked
/// before anything is bound or written: every entry an id of 1..=32767 with a
/// HOST:PORT address ([`parse_listen_addr`]), no id and no address twice, no empty
/// entry, and this node's own entry on the port of `--raft-listen` (`raft_listen`;
/// the hosts may differ, e.g. `0.0.0.0` there and a routable name here; a
/// `--raft-listen` port of 0 leaves the own entry's port unchecked).
fn parse_peers(list: &str, self_id: u64, raft_listen: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let usage = |m: String| ExitError::new(exit::USAGE, format!("--peers: {m}"));
    if list.trim().is_empty() {
        return Err(usage(
            "empty: list every node of the cluster, this one included, as ID=HOST:PORT,...".into(),
        ));
    }
    let mut nodes: Vec<(u64, String)> = Vec::new();
    for (n, item) in list.split(',').enumerate() {
        if item.trim().is_empty() {
            return Err(usage(format!(
                "entry {} of {list:?} is empty (two commas, or one at an end)",
                n + 1
            )));
        }
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| usage(format!("{item:?} is not ID=HOST:PORT")))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| (1..=NODE_ID_MAX).contains(id))
            .ok_or_else(|| usage(format!("{id:?} is not a node id (1..={NODE_ID_MAX})")))?;
        let addr = addr.trim();
        if addr.is_empty() {
            return Err(usage(format!("node {id} has no address")));
        }
        parse_listen_addr(addr).map_err(|e| usage(format!("node {id}: {e}")))?;
        if nodes.iter().any(|(n, _)| *n == id) {
            return Err(usage(format!("node {id} is listed twice")));
        }
        if let Some((other, _)) = nodes.iter().find(|(_, a)| a == addr) {
            return Err(usage(format!(
                "nodes {other} and {id} have the same address {addr}"
            )));
        }
        nodes.push((id, addr.to_string()));
    }
    let Some((_, own)) = nodes.iter().find(|(n, _)| *n == self_id) else {
        return Err(usage(format!(
            "this node's id {self_id} (--node-id) is not listed"
        )));
    };
    let port = |a: &str| a.rsplit_once(':').map(|(_, p)| p.parse::<u16>().ok());
    let listen_port = port(raft_listen).flatten();
    if listen_port != Some(0) && listen_port != port(own).flatten() {
        return Err(usage(format!(
            "this node's entry {self_id}={own} and --raft-listen {raft_listen} name different \
             ports (the other nodes reach this one at the address listed here)"
        )));
    }
    Ok(nodes)
}

/// Logs each SIGHUP; ends when the process does.
fn watch_hangups() {
    let _ = std::thread::Builder::new()
        .name("seglog-sighup".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_millis(100));
            if HUP.swap(false, Ordering::SeqCst) {
                tracing::info!("SIGHUP received: nothing to reopen, still serving");
            }
        });
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

/// A data directory holding `cluster.json` belongs to a cluster node: served
/// without `--peers` it would serve its replicated topics alone, possibly stale.
fn check_not_cluster_dir(data_dir: &std::path::Path) -> anyhow::Result<()> {
    if !data_dir.is_dir() {
        return Ok(());
    }
    let file = crate::engine::replication::network::read_cluster_file(data_dir)
        .map_err(|e| ExitError::new(exit::IO, format!("cannot read the cluster id: {e}")))?;
    let Some((cluster_id, node)) = file else {
        return Ok(());
    };
    let node = match node {
        Some(n) => format!("node {n}"),
        None => "a node".to_string(),
    };
    Err(ExitError::usage(format!(
        "{} belongs to cluster {cluster_id} as {node} ({}): start it with --node-id, \
         --raft-listen and --peers as before, not as a standalone broker",
        data_dir.display(),
        crate::engine::replication::network::CLUSTER_FILE
    )))
}

/// A cluster node's data directory records its node id (`cluster.json`): started
/// with another `--node-id` it would take that node's place in every Raft group with
/// this node's logs, so it is refused.
fn check_cluster_node(data_dir: &std::path::Path, node_id: u64) -> anyhow::Result<()> {
    if !data_dir.is_dir() {
        return Ok(());
    }
    let file = crate::engine::replication::network::read_cluster_file(data_dir)
        .map_err(|e| ExitError::new(exit::IO, format!("cannot read the cluster id: {e}")))?;
    match file {
        Some((cluster_id, Some(recorded))) if recorded != node_id => {
            Err(ExitError::usage(format!(
                "{} belongs to cluster {cluster_id} as node {recorded} ({}), not node {node_id}: start it with --node-id {recorded}",
                data_dir.display(),
                crate::engine::replication::network::CLUSTER_FILE
            )))
        }
        _ => Ok(()),
    }
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    check_session_timeouts(&args)?;
    // Checked before anything is bound or written (a bad list must not leave a
    // cluster.json behind).
    let peers = match (&args.node_id, &args.raft_listen, &args.peers) {
        (Some(id), Some(raft_addr), Some(peers)) => {
            let peers = parse_peers(peers, *id, raft_addr)?;
            check_cluster_node(&args.data_dir, *id)?;
            let secret = cluster_secret(args.cluster_secret_file.as_deref())?;
            let ids: Vec<u64> = peers.iter().map(|(id, _)| *id).collect();
            let tls = peer_tls(&args, *id, &ids)?;
            Some((*id, raft_addr, peers, (secret, tls)))
        }
        _ => {
            check_not_cluster_dir(&args.data_dir)?;
            None
        }
    };
    install_log(&args, global)?;
    install_signal_handlers()?;
    watch_hangups();
    let soft = raise_nofile_limit();
    check_data_dir(&args.data_dir)?;
    if let Some(dir) = &args.cold_storage_dir {
        check_cold_storage_dir(dir)?;
    }
    check_data_dir_unlocked(&args.data_dir)?;
    let limits = args.limits.limits(args.max_connections)?;
    let tls = server_tls(&args)?;
    // Bound before the data directory is touched: a busy port creates nothing.
    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| ExitError::new(exit::IO, format!("cannot listen on {}: {e}", args.listen)))?;
    let metrics_listener = match &args.metrics_listen {
        Some(addr) => Some(TcpListener::bind(addr).map_err(|e| {
            ExitError::new(
                exit::IO,
                format!("cannot listen on {addr} (--metrics-listen): {e}"),
            )
        })?),
        None => None,
    };
    let kafka_listener = match &args.kafka_listen {
        Some(addr) => Some(TcpListener::bind(addr).map_err(|e| {
            ExitError::new(
                exit::IO,
                format!("cannot listen on {addr} (--kafka-listen): {e}"),
            )
        })?),
        None => None,
    };
    let cluster = match peers {
        Some((id, raft_addr, nodes, secret)) => {
            let l = TcpListener::bind(raft_addr).map_err(|e| {
                ExitError::new(
                    exit::IO,
                    format!("cannot listen on {raft_addr} (--raft-listen): {e}"),
                )
            })?;
            Some((id, nodes, l, secret))
        }
        None => None,
    };
    let max_open_files = args
        .max_open_files
        .unwrap_or_else(|| default_open_files(soft));
    tracing::info!(max_open_files, "sealed segment handles kept open at most");
    let opts = BrokerOptions {
        flush_every_records: args.flush_every_records,
        flush_interval: args.flush_interval,
        cold_storage_dir: args.cold_storage_dir.clone(),
        retention_check_interval: args.retention_check_interval,
        compaction_check_interval: args.compaction_check_interval,
        scrub_interval: Some(args.scrub_interval).filter(|d| !d.is_zero()),
        scrub_rate: args.scrub_rate,
        max_open_files: usize::try_from(max_open_files).unwrap_or(usize::MAX),
        preallocate_bytes: args.preallocate_bytes,
        zero_ahead: args.zero_ahead == OnOff::On,
        zero_rate: args.zero_rate,
        spares_per_partition: args.spares_per_partition,
        new_spares: args.new_spares,
        groups: crate::engine::groups::GroupOptions {
            session_timeout_min: args.group_min_session_timeout,
            session_timeout_max: args.group_max_session_timeout,
            offsets_retention: args.offsets_retention,
        },
        producer_id_expiration: args.producer_id_expiration,
    };
    if let Some(dir) = &args.cold_storage_dir {
        create_cold_storage_dir(dir)?;
    }
    // The startup report (recovery actions, unavailable partitions) is logged as
    // the broker opens.
    let broker = Broker::open(&args.data_dir, Arc::new(RealStorage), opts)
        .map_err(|e| open_error(e, &args.data_dir))?;
    broker.keys().set_mode(match args.auth {
        Some(AuthFlag::Required) => AuthMode::Required,
        Some(AuthFlag::Off) => AuthMode::Off,
        None => AuthMode::Auto,
    });
    let net_metrics = metrics_listener
        .as_ref()
        .map(|_| Arc::new(NetMetrics::default()));
    let server_opts = ServerOptions {
        max_connections: args.max_connections as usize,
        log_errors: true,
        metrics: net_metrics.clone(),
        io_timeout: args.limits.io_timeout,
        limits: limits.clone(),
        tls: tls.clone(),
    };
    let server = match Server::from_listener(listener, Arc::clone(&broker), server_opts) {
        Ok(s) => s,
        Err(e) => {
            let _ = broker.shutdown();
            return Err(ExitError::new(
                exit::IO,
                format!("cannot listen on {}: {e}", args.listen),
            ));
        }
    };
    let addr = server.local_addr();
    // The Kafka address peers give their Kafka clients for this node: the
    // advertised one, else the one bound.
    let kafka_addr = match (&args.kafka_advertised, &kafka_listener) {
        (Some(a), _) => Some(a.clone()),
        (None, Some(l)) => Some(l.local_addr()?.to_string()),
        (None, None) => None,
    };
    let (server, cluster) = match cluster {
        Some((id, nodes, l, (secret, raft_tls))) => {
            let has_secret = secret.is_some();
            let has_tls = raft_tls.is_some();
            let node_bound = raft_tls
                .as_ref()
                .is_some_and(crate::engine::replication::peer_tls::PeerTls::node_bound);
            if let (Some((_, mode)), Some(path)) = (&secret, &args.cluster_secret_file) {
                if mode & 0o077 != 0 {
                    tracing::warn!(
                        path = %path.display(),
                        mode = format!("{mode:04o}"),
                        "--cluster-secret-file may be read by others than its owner: chmod 600 it"
                    );
                }
            }
            let secret = secret.map(|(s, _)| s);
            let started = crate::engine::replication::node::start_with(
                Arc::clone(&broker),
                id,
                &addr.to_string(),
                kafka_addr.as_deref(),
                &nodes,
                args.raft_snapshot_entries,
                crate::engine::replication::node::PeerSecurity {
                    secret,
                    tls: raft_tls,
                },
            );
            match started {
                Ok(node) => {
                    let raddr = l.local_addr()?;
                    writeln!(
                        std::io::stderr().lock(),
                        "seglog: raft listening on {raddr}"
                    )?;
                    tracing::info!(
                        raft_listen = %raddr,
                        node_id = id,
                        tls = has_tls,
                        tls_node_bound = node_bound,
                        "serving Raft"
                    );
                    if !has_secret && !has_tls && !raddr.ip().is_loopback() {
                        tracing::warn!(
                            raft_listen = %raddr,
                            "the Raft listener is beyond loopback with neither \
                             --cluster-secret-file nor --raft-tls-*: anyone who reaches it can \
                             act as a node of the cluster"
                        );
                    }
                    if !has_tls && !raddr.ip().is_loopback() {
                        tracing::warn!(
                            raft_listen = %raddr,
                            "the Raft listener is beyond loopback without --raft-tls-*: records \
                             travel between the nodes unencrypted"
                        );
                    }
                    let r = Arc::clone(&node.replicator);
                    (server.with_replication(r), Some((node, l)))
                }
                Err(e) => {
                    let _ = broker.shutdown();
                    return Err(ExitError::new(exit::IO, e));
                }
            }
        }
        None => (server, None),
    };
    if !addr.ip().is_loopback() && !broker.keys().required() {
        tracing::warn!(
            listen = %addr,
            "listening beyond loopback without logins (no API key, or --auth off): anyone \
             who reaches this address can read, write and delete topics"
        );
    }
    let kafka_metrics = net_metrics.clone();
    let metrics_server = match (metrics_listener, net_metrics) {
        (Some(l), Some(net)) => {
            let replication = cluster
                .as_ref()
                .map(|(node, _)| Arc::clone(&node.replicator));
            let registry = metrics::registry(Arc::clone(&broker), net, replication);
            let started = MetricsServer::start(l, registry, server.stop_handle());
            match started {
                Ok(m) => {
                    let maddr = m.local_addr();
                    tracing::info!(metrics_listen = %maddr, "serving metrics at /metrics");
                    writeln!(
                        std::io::stderr().lock(),
                        "seglog: metrics listening on {maddr}"
                    )?;
                    Some(m)
                }
                Err(e) => {
                    let _ = broker.shutdown();
                    return Err(ExitError::new(
                        exit::IO,
                        format!("cannot serve metrics: {e}"),
                    ));
                }
            }
        }
        _ => None,
    };
    let kafka = match kafka_listener {
        Some(l) => match KafkaServer::from_listener(
            l,
            Arc::clone(&broker),
            args.kafka_advertised.as_deref(),
            args.max_connections as usize,
            true,
        )
        .map(|k| {
            k.with_tls(tls)
                .with_limits(limits, args.limits.io_timeout)
                .with_metrics(kafka_metrics)
                .with_replication(cluster.as_ref().map(|(n, _)| Arc::clone(&n.replicator)))
        }) {
            Ok(k) => {
                let kaddr = k.local_addr();
                tracing::info!(kafka_listen = %kaddr, "serving the Kafka protocol");
                writeln!(
                    std::io::stderr().lock(),
                    "seglog: kafka listening on {kaddr}"
                )?;
                Some(k)
            }
            Err(e) => {
                let _ = broker.shutdown();
                return Err(ExitError::new(
                    exit::USAGE,
                    format!("cannot serve the Kafka protocol: {e}"),
                ));
            }
        },
        None => None,
    };
    tracing::info!(
        listen = %addr,
        data_dir = %args.data_dir.display(),
        tls = args.tls_cert.is_some(),
        client_certs = args.tls_client_ca.is_some(),
        allow_plaintext = args.allow_plaintext,
        "listening"
    );
    // Tests and scripts wait for this line; it carries the real port.
    writeln!(
        std::io::stderr().lock(),
        "seglog: listening on {addr} (data {})",
        args.data_dir.display()
    )?;
    let stop = server.stop_handle();
    let kafka_serving = async {
        match &kafka {
            Some(k) => k.serve(Arc::clone(&stop), &STOP).await,
            None => Ok(()),
        }
    };
    let raft_serving = async {
        match cluster {
            Some((node, l)) => node.run(l, Arc::clone(&stop), &STOP).await,
            None => Ok(()),
        }
    };
    let served = server.run_with(&STOP, async {
        let (k, r) = tokio::join!(kafka_serving, raft_serving);
        k.and(r)
    });
    if let Some(m) = metrics_server {
        m.join();
    }
    tracing::info!("shutting down");
    let shut = broker.shutdown();
    served.map_err(|e| ExitError::new(exit::IO, format!("serving on {addr} failed: {e}")))?;
    shut.map_err(|e| ExitError::new(exit::IO, format!("shutting down the broker failed: {e}")))?;
    tracing::info!("stopped");
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit code and message of a refused `--peers`.
    fn refused(list: &str, self_id: u64, raft_listen: &str) -> (u8, String) {
        let e = parse_peers(list, self_id, raft_listen).expect_err(list);
        let code = e.downcast_ref::<ExitError>().map_or(0, |x| x.code);
        (code, e.to_string())
    }

    #[test]
    fn peers_lists_are_checked_entry_by_entry() {
        let ok = parse_peers(
            "1=127.0.0.1:9701, 2=h2:9702,3=[::1]:9703",
            1,
            "0.0.0.0:9701",
        )
        .expect("a good list");
        assert_eq!(
            ok,
            vec![
                (1, "127.0.0.1:9701".to_string()),
                (2, "h2:9702".to_string()),
                (3, "[::1]:9703".to_string())
            ]
        );
        // Port 0 (a free port) cannot be known in advance: the own entry's port is
        // not checked then.
        assert!(parse_peers("1=127.0.0.1:9701", 1, "127.0.0.1:0").is_ok());
        let cases: &[(&str, u64, &str, &str)] = &[
            ("1=127.0.0.1:9701,2=127.0.0.1:99999", 1, "127.0.0.1:9701", "node 2: \"127.0.0.1:99999\" is not HOST:PORT"),
            ("1=127.0.0.1:9701,2=127.0.0.1", 1, "127.0.0.1:9701", "node 2: \"127.0.0.1\" is not HOST:PORT"),
            ("1=127.0.0.1,2=127.0.0.1:9702", 1, "127.0.0.1:9701", "node 1: \"127.0.0.1\" is not HOST:PORT"),
            ("1=127.0.0.1:70000,2=127.0.0.1:9702", 1, "127.0.0.1:9701", "node 1: \"127.0.0.1:70000\" is not HOST:PORT"),
            ("1=127.0.0.1:9701,,2=127.0.0.1:9702", 1, "127.0.0.1:9701", "entry 2 of"),
            ("1=127.0.0.1:9701,2=127.0.0.1:9702,", 1, "127.0.0.1:9701", "entry 3 of"),
            ("1=127.0.0.1:9701,2=127.0.0.1:9701", 1, "127.0.0.1:9701", "nodes 1 and 2 have the same address 127.0.0.1:9701"),
            ("1=127.0.0.1:9701,2=127.0.0.1:9702", 1, "127.0.0.1:9799", "this node's entry 1=127.0.0.1:9701 and --raft-listen 127.0.0.1:9799 name different ports"),
            ("", 1, "127.0.0.1:9701", "--peers: empty"),
            ("x=", 1, "127.0.0.1:9701", "\"x\" is not a node id"),
            ("1=127.0.0.1:9701,2=", 1, "127.0.0.1:9701", "node 2 has no address"),
            ("1=127.0.0.1:9701,1=127.0.0.1:9702", 1, "127.0.0.1:9701", "node 1 is listed twice"),
            ("2=127.0.0.1:9702", 1, "127.0.0.1:9701", "this node's id 1 (--node-id) is not listed"),
        ];
        for (list, id, listen, want) in cases {
            let (code, message) = refused(list, *id, listen);
            assert_eq!(code, exit::USAGE, "{list}: {message}");
            assert!(message.starts_with("--peers: "), "{list}: {message}");
            assert!(message.contains(want), "{list}: {message}");
            assert!(!message.contains('\n'), "{list}: {message}");
        }
    }

    #[test]
    fn log_levels_are_levels_or_target_equals_level() {
        for ok in [
            "info",
            "INFO",
            "off",
            "seglog=debug",
            "warn,seglog=trace",
            "seglog::engine=debug, info",
            "info,",
        ] {
            assert!(check_log_level(ok).is_ok(), "{ok}");
        }
        for (bad, named) in [
            ("infoo", "\"infoo\""),
            ("seglog", "\"seglog\""),
            ("info,seglog=verbose", "\"seglog=verbose\""),
            ("=debug", "\"=debug\""),
            ("", "no level"),
            (",", "no level"),
        ] {
            let e = check_log_level(bad).unwrap_err();
            let x = e.downcast_ref::<ExitError>().unwrap();
            assert_eq!(x.code, exit::USAGE, "{bad}");
            assert!(x.message.contains(named), "{bad}: {}", x.message);
            assert!(x.message.contains("--log-level"), "{bad}: {}", x.message);
        }
    }
}
