//! `seglog recover DATA [--dry-run] [--backup-dir DIR] [--json]`: the startup recovery
//! (docs/FORMAT.md, Recovery), run offline. Without `--dry-run` it takes `DATA/LOCK`.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};

use super::verify::{exit_code, resolve_target, severity_name, topic_problem_json};
use super::{exit, ExitError, Global};
use crate::engine::maintenance::check::{
    check_partition, topic_problems, CheckMode, Problem, ProblemKind, Severity,
};
use crate::engine::maintenance::recovery::Backup;
use crate::engine::maintenance::recovery::{
    execute, plan, plan_topic_rebuild, rebuild_topic_json, relative, Action, ActionDone, Damage,
    PartitionPlan, PartitionReport, RecoveryPlan, RecoveryReport, TopicRebuild,
};
use crate::engine::maintenance::salvage::{
    execute_salvage, plan_salvage, LostOffsets, NotSalvaged, SalvagePlan, Salvaged, SegmentSalvage,
};
use crate::engine::storage::io::RealStorage;
use crate::engine::storage::layout::{PartitionRef, Target, TargetKind};
use crate::engine::storage::lock::{DirLock, LockError};
use crate::format::names::{
    index_file_name, log_file_name, tmp_file_name, validate_name, TOPICS_DIR,
};

/// Arguments of `seglog recover`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Runs exactly the recovery the broker runs at startup (docs/FORMAT.md, Recovery) \
and reports every action with its file, byte range and offsets. Every action is idempotent: \
a second run finds nothing to do. (An idempotent batch that a crash left only partly in its \
partition is cut off it by the producer journal at the broker's next start, not here.)\n\n\
A topic whose topic.json is missing or unreadable, or whose partition directories do not \
match its count, is reported and left alone (the broker keeps it offline); \
--rebuild-topic-json TOPIC writes a new topic.json for it. Leftover temporary files of \
atomic replaces are removed. A group file whose stored membership is refused is \
rewritten without it (atomically), its committed offsets kept; its members rejoin.\n\n\
Exit: 0 consistent afterwards; 2 corruption remains (left in place for an operator); \
64 not a seglog data directory (nothing is created there); 73 DATA/LOCK is held; \
74 I/O error. With --dry-run: the code `verify` gives (0 clean, 1 repairable, 2 corrupt)."
)]
pub struct Args {
    /// The data directory (a topic or partition directory also works).
    pub data: PathBuf,
    /// Print the plan and change nothing; exit with the code `verify` gives.
    #[arg(long)]
    pub dry_run: bool,
    /// Copy every byte range to be cut and every file to be removed here first
    /// (created if missing, its last component only: the parent must exist).
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// Rewrite each sealed segment with damage so it keeps every record that can
    /// still be read (the damaged bytes go to --backup-dir, which it requires).
    #[arg(long)]
    pub salvage: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write TOPIC's topic.json anew, with the default configuration and the partition
    /// count found on disk (one more than the highest partition directory), replacing
    /// a missing, unreadable or wrong one; then recover as usual. The topic's old
    /// configuration is lost: set it again with `seglog topics alter`.
    #[arg(long, value_name = "TOPIC")]
    pub rebuild_topic_json: Option<String>,
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let target = resolve_target(&args.data)?;
    if target.kind == TargetKind::LogFile {
        return Err(ExitError::usage(format!(
            "{}: recover works on a data, topic or partition directory, not one .log file",
            args.data.display()
        )));
    }
    if args.salvage && args.backup_dir.is_none() {
        return Err(ExitError::usage(
            "--salvage needs --backup-dir DIR: the damaged bytes of every rewritten segment are copied there first".to_string(),
        ));
    }
    let mut rebuild = match &args.rebuild_topic_json {
        Some(topic) => Some(plan_rebuild(&target, topic)?),
        None => None,
    };
    if args.dry_run {
        let plan = plan(&target).map_err(|e| ExitError::new(exit::IO, e.to_string()))?;
        let salvage = if args.salvage {
            let mut all = Vec::new();
            for p in &target.partitions {
                let s = plan_salvage(p).with_context(|| format!("checking {}", p.dir.display()))?;
                all.push((label_of(&plan, &p.dir), s));
            }
            Some(all)
        } else {
            None
        };
        // The exit code is what `verify` gives: a full check, which also sees what
        // the startup check trusts without reading (the middle of sealed segments).
        let mut verify = topic_problems(&target)
            .iter()
            .map(|t| t.problem.severity)
            .max();
        let mut beyond = Vec::new();
        for p in &target.partitions {
            let c = check_partition(p, CheckMode::Full)
                .with_context(|| format!("checking {}", p.dir.display()))?;
            verify = verify.max(c.severity());
            beyond.extend(
                c.all_problems()
                    .filter(|x| x.severity > Severity::Info)
                    .cloned(),
            );
        }
        // What the full check finds beyond the plan: recovery leaves it as it is.
        let planned = |x: &Problem| {
            plan.partitions.iter().any(|p| {
                p.corrupt.iter().any(|d| same_problem(&d.problem, x))
                    || p.not_joined.iter().any(|n| same_problem(n, x))
                    || p.actions.iter().any(|a| a.path() == x.file.as_path())
            })
        };
        beyond.retain(|x| !planned(x));
        print_plan(
            &plan,
            &target,
            rebuild.as_ref(),
            verify,
            &beyond,
            salvage.as_deref(),
            args.json,
        )?;
        return Ok(exit_code(verify));
    }
    let _lock = if target.root_is_data_dir {
        Some(DirLock::acquire(&target.root).map_err(|e| match e {
            LockError::Held { .. } => ExitError::new(exit::LOCKED, e.to_string()),
            other => ExitError::new(exit::IO, other.to_string()),
        })?)
    } else {
        None
    };
    if let Some(dir) = &args.backup_dir {
        // The nearest part of the path that exists must be a directory, or no
        // backup can be made there; a missing directory's parent must exist, as for
        // `serve --data-dir`: only the last component is created (checked before
        // anything is cut).
        if let Some(there) = dir.ancestors().find(|a| a.exists()) {
            if !there.is_dir() {
                return Err(ExitError::usage(format!(
                    "--backup-dir {}: {} is not a directory",
                    dir.display(),
                    there.display()
                )));
            }
        }
        if !dir.exists() {
            let parent = dir
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !parent.is_dir() {
                return Err(ExitError::new(
                    exit::IO,
                    format!(
                        "--backup-dir {}: the parent directory {} does not exist \
                         (recover creates only the last component)",
                        dir.display(),
                        parent.display()
                    ),
                ));
            }
        }
        if target.root_is_data_dir && absolute(dir).starts_with(absolute(&target.root)) {
            return Err(ExitError::usage(format!(
                "--backup-dir {} is inside the data directory {}",
                dir.display(),
                target.root.display()
            )));
        }
    }
    let target = match rebuild.take() {
        Some(r) => {
            // Planned again under the lock; written before recovery plans the rest.
            let r = plan_rebuild(&target, &r.topic)?;
            rebuild_topic_json(&RealStorage, &r)
                .map_err(|e| ExitError::new(exit::IO, e.to_string()))?;
            rebuild = Some(r);
            resolve_target(&args.data)?
        }
        None => target,
    };
    // Planned under the lock, so nothing changes between plan and execution.
    let plan = plan(&target).map_err(|e| ExitError::new(exit::IO, e.to_string()))?;
    let mut report = execute(&RealStorage, &plan, args.backup_dir.as_deref())
        .with_context(|| format!("recovery of {}", args.data.display()))?;
    let mut salvaged = Vec::new();
    if let (true, Some(dir)) = (args.salvage, args.backup_dir.as_deref()) {
        let backup = Backup {
            dir,
            root: &target.root,
        };
        for p in &target.partitions {
            let s = plan_salvage(p).with_context(|| format!("checking {}", p.dir.display()))?;
            let done = execute_salvage(&RealStorage, &s, backup)
                .with_context(|| format!("salvage in {}", p.dir.display()))?;
            salvaged.push((label_of(&plan, &p.dir), done, s.not_salvaged));
        }
        // Damage a rewrite removed is no longer left in place.
        let rewritten: Vec<&Path> = salvaged
            .iter()
            .flat_map(|(_, d, _)| d.iter().map(|x| x.salvage.files.log.as_path()))
            .collect();
        for p in &mut report.partitions {
            p.corrupt
                .retain(|d| !rewritten.contains(&d.problem.file.as_path()));
        }
    }
    // A full check afterwards (reads only): it also sees what the startup check
    // trusts without reading, so "consistent" means what `verify` would say.
    let mut after = Vec::new();
    for p in &target.partitions {
        let c = check_partition(p, CheckMode::Full)
            .with_context(|| format!("checking {}", p.dir.display()))?;
        after.extend(
            c.all_problems()
                .filter(|x| x.severity > Severity::Info)
                .cloned(),
        );
    }
    let reported = |x: &Problem| {
        report.partitions.iter().any(|p| {
            p.corrupt.iter().any(|d| same_problem(&d.problem, x))
                || p.not_joined.iter().any(|n| same_problem(n, x))
        })
    };
    after.retain(|x| !reported(x));
    print_report(
        &plan,
        &report,
        rebuild.as_ref(),
        &after,
        &salvaged,
        args.json,
    )?;
    let corrupt_after = after.iter().any(|x| x.severity == Severity::Corrupt);
    Ok(if report.is_consistent() && !corrupt_after {
        exit::OK
    } else {
        exit::CORRUPT
    })
}

/// `path` made absolute and free of `.`/`..` and symlinks as far as it exists.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => absolute(if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        })
        .join(name),
        _ => path.to_path_buf(),
    }
}

/// The rebuild of `topic`'s `topic.json`: only in a data directory, for a topic
/// directory that exists.
fn plan_rebuild(target: &Target, topic: &str) -> anyhow::Result<TopicRebuild> {
    if !target.root_is_data_dir || target.kind != TargetKind::DataDir {
        return Err(ExitError::usage(
            "--rebuild-topic-json needs the data directory as the path".to_string(),
        ));
    }
    validate_name(topic).map_err(|e| ExitError::usage(format!("--rebuild-topic-json: {e}")))?;
    let dir = target.root.join(TOPICS_DIR).join(topic);
    if !dir.is_dir() {
        return Err(ExitError::usage(format!(
            "--rebuild-topic-json: no topic directory {}",
            dir.display()
        )));
    }
    plan_topic_rebuild(&dir).map_err(|e| ExitError::new(exit::IO, e.to_string()))
}

fn rebuild_json(root: &Path, r: &TopicRebuild, done: bool) -> Value {
    json!({
        "topic": r.topic,
        "path": relative(root, &r.path),
        "partitions": r.partitions,
        "partition_dirs": r.partition_dirs,
        "existed": r.existed,
        "replaced_partitions": r.replaced.as_ref().map(|m| m.partitions),
        "config": "default",
        "done": done,
        "description": r.describe(root),
    })
}

/// What recover does with a problem of a partition whose compaction swap it finishes
/// first (FORMAT, Recovery step 1): the swap renames its temporary files into place; a
/// temporary file the marker does not name is removed once the swap is finished (the
/// partition is then planned again); anything else is planned again after the swap.
/// `None` when the partition has no swap to finish, or for corruption (never hidden
/// among what recover repairs). Returns the partition's label with it.
fn after_swap(plan: &RecoveryPlan, x: &Problem) -> Option<(String, String)> {
    if x.severity == Severity::Corrupt {
        return None;
    }
    let p = plan
        .partitions
        .iter()
        .find(|p| x.file.parent() == Some(p.dir.as_path()))?;
    let Some(Action::FinishCompaction { marker, .. }) = p.actions.first() else {
        return None;
    };
    let then = if x.kind == ProblemKind::LeftoverTempFile {
        let name = x.file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let renamed = marker
            .new
            .iter()
            .flat_map(|&n| [log_file_name(n), index_file_name(n)])
            .find(|f| tmp_file_name(f) == name);
        match renamed {
            Some(f) => format!("finishing the compaction swap renames it to {f}"),
            None => "the marker does not name it: recover removes it once the swap is finished"
                .to_string(),
        }
    } else {
        "recover finishes the compaction swap first, then checks the partition again and repairs what that check finds".to_string()
    };
    Some((p.label.clone(), then))
}

/// The problems of an index file, which `seglog reindex` rebuilds.
fn is_index_problem(kind: ProblemKind) -> bool {
    matches!(
        kind,
        ProblemKind::MissingIndex
            | ProblemKind::PartialIndexEntry
            | ProblemKind::IndexNotIncreasing
            | ProblemKind::IndexPastData
            | ProblemKind::WrongIndexEntry
            | ProblemKind::WrongIndexLength
    )
}

fn same_problem(a: &Problem, b: &Problem) -> bool {
    a.kind == b.kind && a.file == b.file && a.position == b.position
}

/// The label recovery gives the partition in `dir`.
fn label_of(plan: &RecoveryPlan, dir: &Path) -> String {
    plan.partitions
        .iter()
        .find(|p| p.dir == dir)
        .map_or_else(|| relative(&plan.root, dir), |p| p.label.clone())
}

/// Lost offsets as text: `a..b` (b exclusive), or `from a`.
fn lost_text(l: &LostOffsets) -> String {
    match l.next {
        Some(n) if n > l.first => format!("{}..={}", l.first, n - 1),
        Some(_) => format!("none (resumes at {})", l.first),
        None => format!("from {}", l.first),
    }
}

fn salvage_line(
    root: &Path,
    label: &str,
    s: &SegmentSalvage,
    backups: &[PathBuf],
    would: bool,
) -> String {
    let lost: Vec<String> = s.lost_offsets.iter().map(lost_text).collect();
    let bytes: Vec<String> = s
        .lost_bytes
        .iter()
        .map(|(f, t)| format!("{f}..{t}"))
        .collect();
    let mut line = format!(
        "{label}: {}salvage {}: keep {} record(s) ({} of {} bytes){}; drop bytes {}; offsets lost {}",
        if would { "would " } else { "" },
        relative(root, &s.files.log),
        s.records_kept,
        s.new_len,
        s.old_len,
        if s.header_rebuilt {
            format!(", header rebuilt (base {}, generation {})", s.files.base_offset, s.generation)
        } else {
            String::new()
        },
        bytes.join(", "),
        if lost.is_empty() { "none".to_string() } else { lost.join(", ") },
    );
    if !backups.is_empty() {
        let names: Vec<String> = backups.iter().map(|b| b.display().to_string()).collect();
        let _ = write!(line, " [backup: {}]", names.join(", "));
    }
    line
}

fn salvage_json(root: &Path, label: &str, s: &SegmentSalvage, backups: &[PathBuf]) -> Value {
    json!({
        "partition": label,
        "path": relative(root, &s.files.log),
        "base_offset": s.files.base_offset,
        "generation": s.generation,
        "header_rebuilt": s.header_rebuilt,
        "records_kept": s.records_kept,
        "bytes_before": s.old_len,
        "bytes_after": s.new_len,
        "bytes_lost": s.lost_bytes.iter().map(|(f, t)| [f, t]).collect::<Vec<_>>(),
        "offsets_lost": s.lost_offsets.iter().map(|l| json!({"first": l.first, "next": l.next})).collect::<Vec<_>>(),
        "backups": backups.iter().map(|b| b.display().to_string()).collect::<Vec<_>>(),
    })
}

fn not_salvaged_json(root: &Path, label: &str, n: &NotSalvaged) -> Value {
    json!({ "partition": label, "path": relative(root, &n.log), "reason": n.reason })
}

fn print_plan(
    plan: &RecoveryPlan,
    target: &Target,
    rebuild: Option<&TopicRebuild>,
    verify: Option<Severity>,
    beyond: &[Problem],
    salvage: Option<&[(String, SalvagePlan)]>,
    as_json: bool,
) -> io::Result<()> {
    // Problems of a partition whose compaction swap recover finishes first: the swap
    // handles them, or recover plans them again after it.
    let mut swap: Vec<(&Problem, (String, String))> = Vec::new();
    let mut rest: Vec<&Problem> = Vec::new();
    for x in beyond {
        match after_swap(plan, x) {
            Some(then) => swap.push((x, then)),
            None => rest.push(x),
        }
    }
    let beyond = rest;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if as_json {
        let mut actions = Vec::new();
        for t in &plan.topics {
            for a in &t.actions {
                actions.push(located(action_json(&plan.root, a, &[]), None, t.label()));
            }
        }
        for p in &plan.partitions {
            for a in &p.actions {
                actions.push(located(
                    action_json(&plan.root, a, &[]),
                    Some(&p.partition),
                    &p.label,
                ));
            }
        }
        let partitions: Vec<Value> = plan
            .partitions
            .iter()
            .map(|p| {
                located(
                    plan_partition_json(&plan.root, p),
                    Some(&p.partition),
                    &p.label,
                )
            })
            .collect();
        let after_corrupt = plan.has_offline_topics()
            || plan
                .partitions
                .iter()
                .any(|p| !p.corrupt.is_empty() || !p.not_joined.is_empty() || p.refuses_writes)
            || beyond.iter().any(|x| x.severity == Severity::Corrupt);
        let offline: Vec<Value> = topic_problems(target)
            .iter()
            .filter(|t| t.problem.severity == Severity::Corrupt)
            .map(|t| topic_problem_json(target, t))
            .collect();
        let v = json!({
            "dry_run": true,
            "root": plan.root.display().to_string(),
            "rebuild_topic_json": rebuild.map(|r| rebuild_json(&plan.root, r, false)),
            "actions": actions,
            "partitions": partitions,
            "offline_topics": offline,
            "severity_before": severity_name(plan.severity_before()),
            "severity_after": if after_corrupt { "corrupt" } else { "clean" },
            "verify_severity": severity_name(verify),
            "cannot_repair": cannot_repair_json(plan, &beyond),
            "after_swap": swap.iter().map(|(x, (label, then))| {
                let mut v = problem_json(&plan.root, x);
                v["label"] = json!(label);
                v["then"] = json!(then);
                v
            }).collect::<Vec<_>>(),
        });
        let mut v = v;
        if let (Some(salvage), Some(obj)) = (salvage, v.as_object_mut()) {
            let segs: Vec<Value> = salvage
                .iter()
                .flat_map(|(l, s)| {
                    s.segments
                        .iter()
                        .map(move |x| salvage_json(&plan.root, l, x, &[]))
                })
                .collect();
            let not: Vec<Value> = salvage
                .iter()
                .flat_map(|(l, s)| {
                    s.not_salvaged
                        .iter()
                        .map(move |x| not_salvaged_json(&plan.root, l, x))
                })
                .collect();
            obj.insert("salvage".into(), json!(segs));
            obj.insert("not_salvaged".into(), json!(not));
        }
        writeln!(out, "{v}")?;
    } else {
        if let Some(r) = rebuild {
            writeln!(out, "{}: would {}", r.topic, r.describe(&plan.root))?;
        }
        let salvages = salvage
            .unwrap_or(&[])
            .iter()
            .any(|(_, s)| !s.segments.is_empty());
        let mut lines = plan.lines();
        if (salvages || !beyond.is_empty()) && lines.last().is_some_and(|l| l == NOTHING_TO_DO) {
            lines.pop();
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
        for (label, s) in salvage.unwrap_or(&[]) {
            for x in &s.segments {
                writeln!(out, "{}", salvage_line(&plan.root, label, x, &[], true))?;
            }
            for n in &s.not_salvaged {
                writeln!(
                    out,
                    "{label}: cannot salvage {}: {}",
                    relative(&plan.root, &n.log),
                    n.reason
                )?;
            }
        }
        for (x, (label, then)) in &swap {
            writeln!(
                out,
                "{label}: {}: {} ({}); {then}",
                relative(&plan.root, &x.file),
                x.detail,
                x.kind
            )?;
        }
        for x in &beyond {
            let what = if x.severity == Severity::Corrupt {
                "recover cannot repair it; it stays in place for an operator"
            } else if is_index_problem(x.kind) {
                "recover leaves it; `seglog reindex` repairs it"
            } else {
                "recover leaves it as it is"
            };
            writeln!(
                out,
                "found by a full check, beyond what the startup check reads: {}{}: {} ({}); {what}",
                relative(&plan.root, &x.file),
                x.position
                    .map(|p| format!(" at byte {p}"))
                    .unwrap_or_default(),
                x.detail,
                x.kind
            )?;
        }
        if plan.action_count() == 0 && !beyond.is_empty() {
            writeln!(
                out,
                "nothing recover can repair: {} problem(s) above stay as they are (see `seglog verify`)",
                beyond.len()
            )?;
        }
    }
    out.flush()
}

type SalvageDone = (String, Vec<Salvaged>, Vec<NotSalvaged>);

/// The summary line of a plan or report without actions; left out when the only work
/// is a salvage.
const NOTHING_TO_DO: &str = "nothing to do";

fn print_report(
    plan: &RecoveryPlan,
    report: &RecoveryReport,
    rebuild: Option<&TopicRebuild>,
    after: &[Problem],
    salvaged: &[SalvageDone],
    as_json: bool,
) -> io::Result<()> {
    let worst_after = after.iter().map(|x| x.severity).max();
    let severity_after = if !report.is_consistent() || worst_after == Some(Severity::Corrupt) {
        "corrupt"
    } else if worst_after.is_some() {
        "repairable"
    } else {
        "clean"
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if as_json {
        let mut actions = Vec::new();
        for t in &report.topics {
            for ActionDone { action, backups } in &t.actions {
                actions.push(located(
                    action_json(&report.root, action, backups),
                    None,
                    t.label(),
                ));
            }
        }
        for p in &report.partitions {
            for ActionDone { action, backups } in &p.actions {
                actions.push(located(
                    action_json(&report.root, action, backups),
                    partition_ref(plan, &p.label),
                    &p.label,
                ));
            }
        }
        let partitions: Vec<Value> = report
            .partitions
            .iter()
            .map(|p| {
                located(
                    report_partition_json(&report.root, p),
                    partition_ref(plan, &p.label),
                    &p.label,
                )
            })
            .collect();
        let offline: Vec<Value> = report
            .topics
            .iter()
            .flat_map(|t| {
                t.offline.iter().map(|p| {
                    let mut v = problem_json(&report.root, p);
                    v["topic"] = json!(t.topic);
                    v
                })
            })
            .collect();
        let v = json!({
            "dry_run": false,
            "root": report.root.display().to_string(),
            "rebuild_topic_json": rebuild.map(|r| rebuild_json(&report.root, r, true)),
            "actions": actions,
            "partitions": partitions,
            "offline_topics": offline,
            "severity_before": severity_name(plan.severity_before()),
            "severity_after": severity_after,
            "problems_after": after.iter().map(|x| problem_json(&report.root, x)).collect::<Vec<_>>(),
        });
        let mut v = v;
        if let (false, Some(obj)) = (salvaged.is_empty(), v.as_object_mut()) {
            let segs: Vec<Value> = salvaged
                .iter()
                .flat_map(|(l, d, _)| {
                    d.iter()
                        .map(move |x| salvage_json(&report.root, l, &x.salvage, &x.backups))
                })
                .collect();
            let not: Vec<Value> = salvaged
                .iter()
                .flat_map(|(l, _, n)| n.iter().map(move |x| not_salvaged_json(&report.root, l, x)))
                .collect();
            obj.insert("salvaged".into(), json!(segs));
            obj.insert("not_salvaged".into(), json!(not));
        }
        writeln!(out, "{v}")?;
    } else {
        if let Some(r) = rebuild {
            writeln!(out, "{}: {}", r.topic, r.describe(&report.root))?;
        }
        let salvages = salvaged.iter().any(|(_, done, _)| !done.is_empty());
        for line in report.lines() {
            if salvages && line == NOTHING_TO_DO {
                continue;
            }
            writeln!(out, "{line}")?;
        }
        for (label, done, not) in salvaged {
            for x in done {
                writeln!(
                    out,
                    "{}",
                    salvage_line(&report.root, label, &x.salvage, &x.backups, false)
                )?;
            }
            for n in not {
                writeln!(
                    out,
                    "{label}: cannot salvage {}: {}",
                    relative(&report.root, &n.log),
                    n.reason
                )?;
            }
        }
        for x in after {
            let hint = if x.severity == Severity::Corrupt {
                "left for an operator"
            } else if is_index_problem(x.kind) {
                "`seglog reindex` repairs it"
            } else {
                "left as it is"
            };
            writeln!(
                out,
                "found by a full check, beyond what the startup check reads: {}: {} ({}); {hint}",
                relative(&report.root, &x.file),
                x.detail,
                x.kind
            )?;
        }
    }
    out.flush()
}

/// The plan's partition behind a report's `label`.
fn partition_ref<'a>(plan: &'a RecoveryPlan, label: &str) -> Option<&'a PartitionRef> {
    plan.partitions
        .iter()
        .find(|p| p.label == label)
        .map(|p| &p.partition)
}

/// `v` with the vocabulary verify and dump use: `topic` (string) and `partition`
/// (number), `null` where the path does not say (a partition directory outside a
/// data directory); `label` keeps the `topic/partition` text of the human output.
fn located(mut v: Value, r: Option<&PartitionRef>, label: &str) -> Value {
    if let Some(obj) = v.as_object_mut() {
        obj.insert("topic".into(), json!(r.and_then(|r| r.topic.as_deref())));
        obj.insert("partition".into(), json!(r.and_then(|r| r.partition)));
        obj.insert("label".into(), json!(label));
    }
    v
}

fn action_json(root: &Path, a: &Action, backups: &[PathBuf]) -> Value {
    let mut v = json!({
        "kind": a.kind(),
        "path": relative(root, a.path()),
        "from": a.byte_range().map(|r| r.0),
        "to": a.byte_range().map(|r| r.1),
        "bytes": a.byte_range().map(|(f, t)| t - f),
        "description": a.describe(root),
        "backups": backups.iter().map(|b| b.display().to_string()).collect::<Vec<_>>(),
    });
    let extra = match a {
        Action::FinishCompaction { marker, .. } => json!({
            "new": marker.new, "replaced": marker.replaced,
        }),
        Action::CutTail {
            next_offset,
            kind,
            records_cut,
            reason,
            ..
        } => json!({
            "next_offset": next_offset, "tail": kind.map_or("tail", |k| k.as_str()), "reason": reason,
            "records_cut": records_cut.map(|r| json!({
                "first_offset": r.first_offset, "last_offset": r.last_offset, "count": r.count,
            })),
        }),
        Action::RebuildIndex {
            log,
            base_offset,
            entries,
            reason,
            ..
        } => json!({
            "log": relative(root, log), "base_offset": base_offset,
            "entries": entries.len(), "reason": reason,
        }),
        Action::RemoveNeverDurable {
            index,
            base_offset,
            to_spares,
            reason,
            ..
        } => json!({
            "index": index.as_ref().map(|i| relative(root, i)),
            "base_offset": base_offset, "reason": reason,
            "to_spares": to_spares.as_ref().map(|d| relative(root, d)),
        }),
        Action::RewriteGroupFile {
            group,
            offsets,
            bytes,
            reason,
            ..
        } => json!({
            "group": group, "offsets": offsets, "file_bytes": bytes, "reason": reason,
        }),
        Action::TrimSeal { reason, .. }
        | Action::CutJournal { reason, .. }
        | Action::RemoveMarker { reason, .. }
        | Action::RemoveTempFile { reason, .. } => json!({ "reason": reason }),
        _ => json!({}),
    };
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), extra) {
        obj.extend(extra);
    }
    v
}

/// Every problem recovery leaves in place: the plan's corruption and gaps, and what
/// only the full check finds.
fn cannot_repair_json(plan: &RecoveryPlan, beyond: &[&Problem]) -> Vec<Value> {
    let mut v = Vec::new();
    for p in &plan.partitions {
        for d in &p.corrupt {
            v.push(located(
                damage_json(&plan.root, d),
                Some(&p.partition),
                &p.label,
            ));
        }
        for x in &p.not_joined {
            v.push(located(
                problem_json(&plan.root, x),
                Some(&p.partition),
                &p.label,
            ));
        }
    }
    // Damage the startup check trusts without reading, with the range it hides, as
    // the plan's own damage.
    v.extend(beyond.iter().map(|x| match &x.unreadable {
        Some(r) => damage_json(
            &plan.root,
            &Damage {
                problem: (*x).clone(),
                bytes: Some((r.first_position, r.end_position)),
                offsets: r.lost_offsets(),
            },
        ),
        None => problem_json(&plan.root, x),
    }));
    v
}

/// A problem as JSON; damage inside a sealed segment adds the range it makes
/// unreadable, as `verify --json` does.
fn problem_json(root: &Path, p: &Problem) -> Value {
    let mut v = json!({
        "kind": p.kind,
        "severity": p.severity.as_str(),
        "path": relative(root, &p.file),
        "position": p.position,
        "offset": p.offset,
        "detail": p.detail,
    });
    if let Some(r) = &p.unreadable {
        v["first_unreadable_offset"] = json!(r.first_offset);
        v["first_unreadable_position"] = json!(r.first_position);
        v["next_readable_offset"] = json!(r.next_offset());
        v["next_readable_position"] = json!(r.next.map(|n| n.position));
    }
    v
}

fn damage_json(root: &Path, d: &Damage) -> Value {
    let mut v = problem_json(root, &d.problem);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("bytes_lost".into(), json!(d.bytes.map(|(f, t)| [f, t])));
        obj.insert(
            "offsets_lost".into(),
            json!(d.offsets.map(|(a, b)| json!([a, b]))),
        );
    }
    v
}

fn plan_partition_json(root: &Path, p: &PartitionPlan) -> Value {
    json!({
        "path": relative(root, &p.dir),
        "actions": p.actions.len(),
        "next_offset": p.next_offset,
        "recheck_after_marker": p.recheck_after_marker,
        "refuses_writes": p.refuses_writes,
        "corrupt": p.corrupt.iter().map(|d| damage_json(root, d)).collect::<Vec<_>>(),
        "not_joined": p.not_joined.iter().map(|x| problem_json(root, x)).collect::<Vec<_>>(),
        "severity_before": severity_name(p.severity_before),
    })
}

fn report_partition_json(root: &Path, p: &PartitionReport) -> Value {
    json!({
        "path": relative(root, &p.dir),
        "actions": p.actions.len(),
        "next_offset": p.next_offset,
        "refuses_writes": p.refuses_writes,
        "corrupt": p.corrupt.iter().map(|d| damage_json(root, d)).collect::<Vec<_>>(),
        "not_joined": p.not_joined.iter().map(|x| problem_json(root, x)).collect::<Vec<_>>(),
        "consistent": p.is_consistent(),
    })
}
