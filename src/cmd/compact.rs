//! `seglog compact PATH [--dry-run] [--now-ms MS] [--tombstone-retention-ms MS] [--json]`:
//! runs the broker's compaction (`engine::maintenance::compaction`) offline, on every topic whose
//! `cleanup_policy` compacts (PATH a data directory) or on the named topic or
//! partition whatever its policy.
//!
//! Takes `DATA/LOCK` unless `--dry-run` (73 while held). A partition that needs
//! recovery first (a marker, temporary files, a torn tail, a missing index, corrupt
//! data: anything the startup check reports) is refused before anything is
//! compacted, with the exit code `verify` would give (1 repairable, 2 corrupt).
//! A compaction that fails aborts that partition unchanged and the run goes on with
//! the next; the exit code is then 2 for unreadable records, else 74.

use std::cell::OnceCell;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use comfy_table::{presets::ASCII_FULL_CONDENSED, Table};

use crate::engine::maintenance::check::{check_partition, CheckMode, Severity};
use crate::engine::maintenance::compaction::{
    compact_partition_with_progress, sealed_segments_unchanged, CompactionError, CompactionOptions,
    CompactionReport,
};
use crate::engine::storage::io::RealStorage;
use crate::engine::storage::layout::{resolve, LayoutError, PartitionRef, Target, TargetKind};
use crate::engine::storage::lock::{DirLock, LockError};

use super::{exit, ExitError, Global};

/// Arguments of `seglog compact`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 done; 1 or 2 a partition needs `seglog recover` first \
(1 repairable, 2 corrupt; nothing was compacted), or 2 a sealed segment holds unreadable records \
(that partition is left unchanged); 64 usage; 73 the data directory is locked; 74 I/O error."
)]
pub struct Args {
    /// Data directory (every topic whose cleanup_policy compacts), topic directory or
    /// partition directory (compacted whatever its policy).
    pub path: PathBuf,
    /// Read and count only: report what compaction would do, write nothing, take no lock.
    #[arg(long)]
    pub dry_run: bool,
    /// The clock for tombstone expiry, in milliseconds since the Unix epoch (default: now).
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub now_ms: Option<i64>,
    /// Overrides every topic's tombstone_retention_ms.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(i64).range(0..))]
    pub tombstone_retention_ms: Option<i64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A partition whose passes read more than this gets a progress bar (when stderr is
/// a terminal and not `--quiet`).
pub const PROGRESS_BYTES_MIN: u64 = 256 * 1024 * 1024;

/// Moves the partition's bar, making it at the first report if the work is large.
fn show_progress(
    cell: &OnceCell<Option<indicatif::ProgressBar>>,
    label: &str,
    enabled: bool,
    done: u64,
    total: u64,
) {
    let bar = cell.get_or_init(|| {
        (enabled && total > PROGRESS_BYTES_MIN).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "compact {label} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        })
    });
    if let Some(b) = bar {
        b.set_position(done);
    }
}

struct Row {
    partition: PartitionRef,
    path: String,
    result: Result<CompactionReport, CompactionError>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn resolve_target(path: &Path) -> anyhow::Result<Target> {
    let target = resolve(path).map_err(|e| match e {
        LayoutError::NotFound { .. }
        | LayoutError::NotSeglog { .. }
        | LayoutError::Spare { .. } => ExitError::usage(e.to_string()),
        other => ExitError::new(exit::IO, other.to_string()),
    })?;
    if target.kind == TargetKind::LogFile {
        return Err(ExitError::usage(format!(
            "{}: compact works on whole partitions; give a data, topic or partition directory",
            path.display()
        )));
    }
    Ok(target)
}

/// Refuses the run if any partition needs recovery first.
fn check_recovered(partitions: &[PartitionRef]) -> anyhow::Result<()> {
    for p in partitions {
        let check = check_partition(p, CheckMode::Quick)
            .with_context(|| format!("cannot check {}", p.dir.display()))?;
        let Some(severity) = check.severity() else {
            continue;
        };
        if severity < Severity::Repairable {
            continue;
        }
        let code = if severity == Severity::Corrupt {
            exit::CORRUPT
        } else {
            exit::REPAIRABLE
        };
        let first = check
            .all_problems()
            .filter(|pr| pr.severity == severity)
            .map(|pr| format!("{} in {}: {}", pr.kind, pr.file.display(), pr.detail))
            .next()
            .unwrap_or_default();
        return Err(ExitError::new(
            code,
            format!(
                "{} needs recovery before it can be compacted ({first}); run seglog recover first, nothing was compacted",
                p.label()
            ),
        ));
    }
    Ok(())
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    let target = resolve_target(&args.path)?;
    let partitions: Vec<PartitionRef> = target
        .partitions
        .iter()
        .filter(|p| target.kind != TargetKind::DataDir || p.config.cleanup_policy.compacts())
        .cloned()
        .collect();
    let _lock = if args.dry_run || !target.root_is_data_dir {
        None
    } else {
        Some(DirLock::acquire(&target.root).map_err(|e| match e {
            LockError::Held { .. } => ExitError::new(exit::LOCKED, e.to_string()),
            other => ExitError::new(exit::IO, other.to_string()),
        })?)
    };
    check_recovered(&partitions)?;
    let now = args.now_ms.unwrap_or_else(now_ms);
    let bars = !global.quiet && io::stderr().is_terminal();
    let mut rows = Vec::with_capacity(partitions.len());
    for p in partitions {
        let mut opts = CompactionOptions::for_topic(&p.config, now);
        opts.dry_run = args.dry_run;
        if let Some(ms) = args.tombstone_retention_ms {
            opts.tombstone_retention_ms = ms;
        }
        let dir = p.dir.clone();
        let (bar, label) = (OnceCell::new(), p.label());
        let result = compact_partition_with_progress(
            &RealStorage,
            &p,
            &opts,
            &|read| sealed_segments_unchanged(&dir, read),
            &mut |_| {},
            &|done, total| show_progress(&bar, &label, bars, done, total),
        );
        if let Some(Some(b)) = bar.get() {
            b.finish_and_clear();
        }
        if let Err(e) = &result {
            let _ = writeln!(io::stderr(), "seglog: {}: {e}", p.label());
        }
        rows.push(Row {
            path: target.relative(&p.dir),
            partition: p,
            result,
        });
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        render_json(&mut out, &rows, args.dry_run, now)?;
    } else {
        render_table(&mut out, &rows, global)?;
    }
    out.flush()?;
    Ok(rows
        .iter()
        .filter_map(|r| r.result.as_ref().err())
        .map(|e| match e {
            CompactionError::Unreadable { .. } => exit::CORRUPT,
            CompactionError::NeedsRecovery { .. } => exit::REPAIRABLE,
            _ => exit::IO,
        })
        .max()
        .unwrap_or(exit::OK))
}

fn status(result: &Result<CompactionReport, CompactionError>) -> &'static str {
    match result {
        Ok(r) if r.skipped => "skipped",
        Ok(r) if r.dry_run => "dry_run",
        Ok(_) => "compacted",
        Err(_) => "error",
    }
}

fn render_json(
    out: &mut impl Write,
    rows: &[Row],
    dry_run: bool,
    now_ms: i64,
) -> anyhow::Result<()> {
    let partitions: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let mut v = serde_json::json!({
                "topic": row.partition.topic,
                "partition": row.partition.partition,
                "path": row.path,
                "status": status(&row.result),
                "error": row.result.as_ref().err().map(ToString::to_string),
            });
            if let (Ok(r), Some(obj)) = (&row.result, v.as_object_mut()) {
                let fields = serde_json::json!({
                    "records_read": r.records_read,
                    "records_kept": r.records_kept,
                    "records_dropped": r.records_dropped,
                    "tombstones_dropped": r.tombstones_dropped,
                    "keys": r.keys,
                    "bytes_before": r.bytes_before,
                    "bytes_after": r.bytes_after,
                    "segments_before": r.segments_before,
                    "segments_after": r.segments_after,
                    "skipped": r.skipped,
                });
                if let Some(f) = fields.as_object() {
                    obj.extend(f.clone());
                }
            }
            v
        })
        .collect();
    let doc = serde_json::json!({
        "dry_run": dry_run,
        "now_ms": now_ms,
        "partitions": partitions,
    });
    writeln!(out, "{doc}")?;
    Ok(())
}

fn render_table(out: &mut impl Write, rows: &[Row], global: Global) -> anyhow::Result<()> {
    if rows.is_empty() {
        if !global.quiet {
            let _ = writeln!(io::stderr(), "seglog: no partition to compact");
        }
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(ASCII_FULL_CONDENSED).set_header(vec![
        "partition",
        "records read",
        "kept",
        "dropped",
        "tombstones dropped",
        "bytes before",
        "bytes after",
        "segments",
        "result",
    ]);
    for row in rows {
        let label = row.partition.label();
        match &row.result {
            Ok(r) => table.add_row(vec![
                label,
                r.records_read.to_string(),
                r.records_kept.to_string(),
                r.records_dropped.to_string(),
                r.tombstones_dropped.to_string(),
                r.bytes_before.to_string(),
                r.bytes_after.to_string(),
                format!("{} -> {}", r.segments_before, r.segments_after),
                match status(&row.result) {
                    "skipped" => "skipped (nothing to drop)".to_string(),
                    "dry_run" => "dry run (nothing written)".to_string(),
                    s => s.to_string(),
                },
            ]),
            Err(_) => table.add_row(vec![
                label,
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                "error (see stderr)".to_string(),
            ]),
        };
    }
    writeln!(out, "{table}")?;
    Ok(())
}
