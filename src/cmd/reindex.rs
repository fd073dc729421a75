//! `seglog reindex`: rebuilds missing or invalid index files (every one with `--all`)
//! from their logs; `--check` only says whether any would change.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::json;

use super::verify::resolve_target;
use super::{exit, ExitError, Global};
use crate::engine::error::counted;
use crate::engine::maintenance::reindex::{reindex_partition, Action, PartitionPlan, SegmentPlan};
use crate::engine::storage::io::RealStorage;
use crate::engine::storage::layout::Target;
use crate::engine::storage::lock::{DirLock, LockError};

/// Arguments of `seglog reindex`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Rebuilds every missing or invalid index file from its log, through a temporary \
file, fsync, rename and directory fsync. A rebuilt index is byte-identical to the one the \
writer makes. Takes DATA/LOCK (exit 73 while a broker holds it). A segment whose header is \
unreadable gets no index; a corrupt sealed segment gets the index of its readable records. \
A partition with a compaction.marker is left alone (run `seglog recover` first).\n\n\
Exit: 0 done (with --check: no index would change); 1 with --check when an index would \
change, and with or without --check when a partition was left alone (the summary line says \
so and why); 64 the path is not a seglog data directory, topic, partition or .log file; \
73 locked; 74 I/O error."
)]
pub struct Args {
    /// Data directory, topic directory, partition directory or one .log file.
    pub path: PathBuf,
    /// Write nothing; exit 1 if any index would change (or a partition is left alone).
    #[arg(long)]
    pub check: bool,
    /// Rewrite every index, valid ones included.
    #[arg(long)]
    pub all: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    let target = resolve_target(&args.path)?;
    let _lock = if args.check || !target.root_is_data_dir {
        None
    } else {
        Some(DirLock::acquire(&target.root).map_err(|e| match e {
            LockError::Held { path } => ExitError::new(
                exit::LOCKED,
                format!(
                    "{} is held by a running broker or another tool; stop it before reindexing (reindex --check works beside it)",
                    path.display()
                ),
            ),
            other => anyhow::Error::new(other),
        })?)
    };
    let mut plans = Vec::new();
    for p in &target.partitions {
        let plan = reindex_partition(&RealStorage, p, args.all, !args.check)
            .with_context(|| format!("reindexing {}", p.dir.display()))?;
        plans.push((p.topic.clone(), p.partition, plan));
    }
    let would_change = plans
        .iter()
        .flat_map(|(_, _, p)| p.segments.iter())
        .any(SegmentPlan::changes_file);
    let blocked = plans.iter().any(|(_, _, p)| p.blocked.is_some());
    let code = if blocked || (args.check && would_change) {
        exit::REPAIRABLE
    } else {
        exit::OK
    };
    let mut out = io::stdout().lock();
    if args.json {
        let v = render_json(&target, &plans, &args);
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        render_human(&mut out, &target, &plans, &args, global)?;
    }
    out.flush()?;
    Ok(code)
}

fn action_name(s: &SegmentPlan, check: bool) -> &'static str {
    match (&s.action, check) {
        (Action::Keep, _) => "keep",
        (Action::SkipBadHeader, _) => "skip_bad_header",
        (Action::Write { .. }, true) if s.changes_file() => "would_rebuild",
        (Action::Write { .. }, true) => "would_rewrite_unchanged",
        (Action::Write { .. }, false) if s.changes_file() => "rebuilt",
        (Action::Write { .. }, false) => "rewritten_unchanged",
    }
}

fn render_json(
    target: &Target,
    plans: &[(Option<String>, Option<u32>, PartitionPlan)],
    args: &Args,
) -> serde_json::Value {
    let mut segments = Vec::new();
    let mut partitions = Vec::new();
    let (mut written, mut changed, mut skipped) = (0u64, 0u64, 0u64);
    for (topic, partition, plan) in plans {
        partitions.push(json!({
            "topic": topic, "partition": partition, "path": target.relative(&plan.dir),
            "blocked": plan.blocked,
        }));
        for s in &plan.segments {
            let (reason, detail, readable_only) = match &s.action {
                Action::Write {
                    reason,
                    readable_only,
                    ..
                } => (Some(reason.kind()), Some(reason.detail()), *readable_only),
                Action::SkipBadHeader => (
                    None,
                    Some("segment header is unreadable; no index can be built".to_string()),
                    false,
                ),
                Action::Keep => (None, None, false),
            };
            written += u64::from(matches!(s.action, Action::Write { .. }));
            changed += u64::from(s.changes_file());
            skipped += u64::from(s.action == Action::SkipBadHeader);
            segments.push(json!({
                "topic": topic, "partition": partition,
                "path": target.relative(&s.files.index),
                "log": target.relative(&s.files.log),
                "base_offset": s.files.base_offset,
                "active": s.active,
                "action": action_name(s, args.check),
                "reason": reason,
                "detail": detail,
                "changes_file": s.changes_file(),
                "entries": s.entries(),
                "records": s.records,
                "readable_only": readable_only,
            }));
        }
    }
    json!({
        "path": args.path.display().to_string(),
        "check": args.check,
        "all": args.all,
        "partitions": partitions,
        "segments": segments,
        "totals": {
            "segments": segments.len(),
            "written": if args.check { 0 } else { written },
            "would_change": changed,
            "skipped_bad_header": skipped,
            "blocked_partitions": plans.iter().filter(|(_, _, p)| p.blocked.is_some()).count(),
        },
    })
}

fn render_human(
    out: &mut impl Write,
    target: &Target,
    plans: &[(Option<String>, Option<u32>, PartitionPlan)],
    args: &Args,
    global: Global,
) -> io::Result<()> {
    let (mut written, mut changed, mut kept) = (0u64, 0u64, 0u64);
    for (_, _, plan) in plans {
        if let Some(why) = &plan.blocked {
            writeln!(out, "left alone {}: {why}", target.relative(&plan.dir))?;
        }
        for s in &plan.segments {
            let path = target.relative(&s.files.index);
            match &s.action {
                Action::Keep => kept += 1,
                Action::SkipBadHeader => writeln!(
                    out,
                    "skipped    {path}: the header of {} is unreadable, no index can be built",
                    target.relative(&s.files.log)
                )?,
                Action::Write {
                    reason,
                    readable_only,
                    ..
                } => {
                    written += 1;
                    changed += u64::from(s.changes_file());
                    let verb = if args.check {
                        "would fix "
                    } else {
                        "rebuilt   "
                    };
                    let only = if *readable_only {
                        format!(
                            " (segment is corrupt: covers only the readable records before byte {})",
                            s.data_end
                        )
                    } else {
                        String::new()
                    };
                    writeln!(
                        out,
                        "{verb} {path}: {}; {} for {}{only}",
                        reason.detail(),
                        counted(s.entries() as u64, "entry", "entries"),
                        counted(s.records, "record", "records")
                    )?;
                }
            }
        }
    }
    // A partition left alone makes the exit 1: the summary says so, and why.
    let left_alone = plans
        .iter()
        .filter_map(|(_, _, p)| p.blocked.as_deref())
        .collect::<Vec<_>>();
    let alone = match left_alone.first() {
        Some(why) => format!(
            "; {} partition(s) left alone, their indexes not checked: {why}",
            left_alone.len()
        ),
        None => String::new(),
    };
    if !global.quiet || args.check || !left_alone.is_empty() {
        if args.check {
            writeln!(
                out,
                "{changed} index file(s) would change, {kept} valid{alone}"
            )?;
        } else {
            writeln!(
                out,
                "{written} index file(s) written ({changed} changed), {kept} valid and kept{alone}"
            )?;
        }
    }
    Ok(())
}
