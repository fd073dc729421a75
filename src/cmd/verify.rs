//! `seglog verify`: the shared partition check over a data directory, topic,
//! partition or one `.log` file, as a table or one JSON object. Read-only: it opens
//! nothing for writing and takes no lock.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use comfy_table::{presets, CellAlignment, Table};
use serde_json::json;

use super::{exit, ExitError, Global};
use crate::engine::error::counted;
use crate::engine::maintenance::check::{
    check_partition_with, topic_problems, CheckMode, IndexState, PartitionCheck, Problem,
    ProblemKind, SegmentCheck, Severity, TopicProblem,
};
use crate::engine::storage::layout::{list_partition, resolve, LayoutError, Target, TargetKind};
use crate::engine::storage::lock::DirLock;

/// Data larger than this gets a progress bar (when stderr is a terminal).
pub const PROGRESS_BYTES_MIN: u64 = 256 * 1024 * 1024;

/// Arguments of `seglog verify`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Checks every segment header, record and CRC, every index file, segment \
continuity, leftover temporary files and compaction markers. Read-only: opens nothing for \
writing and may run beside a live broker; while a broker holds LOCK, bytes past an \
active segment's data that do not read as a record (a record being written, a reused \
file's old bytes) are info, not a torn tail.\n\n\
Damage inside a sealed segment hides only the records it touches: reading resumes at the \
next whole record of the segment's generation (docs/FORMAT.md, Reading around damage), the \
records after it count as read, and the problem names the range (in --json also \
first_unreadable_offset, first_unreadable_position, next_readable_offset, \
next_readable_position; a next position of null means the records resume in the next \
segment, or nowhere when the offset is null too).\n\n\
A topic whose topic.json is missing or unreadable, or whose partition directories do not \
match its partition count, is reported as corrupt and its partitions are not checked; every \
other topic is.\n\n\
Exit: 0 clean (information such as a zeroed tail after the active segment's data does not \
count); 1 problems `seglog recover` repairs without losing acknowledged data; 2 corruption; \
64 the path is not a seglog data directory, topic, partition or .log file; 74 I/O error.\n\n\
With --expect clean|repairable|corrupt the report is the same, and the exit is 0 when the \
severity found is the one expected, else 1 with one line on stderr: `seglog: expected X, found \
Y (…)`. Usage (64) and I/O (74) errors keep their codes."
)]
pub struct Args {
    /// Data directory, topic directory, partition directory or one .log file.
    pub path: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Only the startup check: a sealed segment whose index agrees with its first
    /// record and its tail is trusted without reading the rest.
    #[arg(long)]
    pub quick: bool,
    /// Exit 0 when the severity found is this one, else 1 with a line on stderr saying
    /// what was found instead (for CI that pins a fixture's state).
    #[arg(long, value_enum, value_name = "SEVERITY")]
    pub expect: Option<Expect>,
}

/// A severity `verify --expect` pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Expect {
    Clean,
    Repairable,
    Corrupt,
}

impl Expect {
    fn name(self) -> &'static str {
        match self {
            Expect::Clean => "clean",
            Expect::Repairable => "repairable",
            Expect::Corrupt => "corrupt",
        }
    }
}

/// The exit code of `verify --expect`: 0 when `found` is the severity expected, else
/// 1 and the line that says what was found instead.
pub fn expect_outcome(expect: Expect, worst: Option<Severity>) -> (u8, Option<String>) {
    let found = severity_name(worst);
    if found == expect.name() {
        (exit::OK, None)
    } else {
        (
            exit::REPAIRABLE,
            Some(format!(
                "expected {}, found {found} (verify without --expect exits {})",
                expect.name(),
                exit_code(worst)
            )),
        )
    }
}

/// Resolves a tool's PATH argument; a path that names nothing seglog knows is a usage
/// error (64), anything else that fails is an I/O error (74).
pub fn resolve_target(path: &Path) -> anyhow::Result<Target> {
    resolve(path).map_err(|e| match e {
        LayoutError::NotFound { .. }
        | LayoutError::NotSeglog { .. }
        | LayoutError::Spare { .. } => ExitError::usage(e.to_string()),
        other => anyhow::Error::new(other),
    })
}

/// The exit code for a worst severity.
pub fn exit_code(worst: Option<Severity>) -> u8 {
    match worst {
        None | Some(Severity::Info) => exit::OK,
        Some(Severity::Repairable) => exit::REPAIRABLE,
        Some(Severity::Corrupt) => exit::CORRUPT,
    }
}

/// `"clean"`, `"repairable"` or `"corrupt"`.
pub fn severity_name(worst: Option<Severity>) -> &'static str {
    match worst {
        None | Some(Severity::Info) => "clean",
        Some(s) => s.as_str(),
    }
}

/// A problem as a JSON object; `path` relative to the target's data directory.
/// Damage inside a sealed segment adds the range it makes unreadable:
/// `first_unreadable_offset`/`_position`, `next_readable_offset`/`_position` (a next
/// position of null: the records resume in the next segment, or nowhere when the
/// offset is null too).
pub fn problem_json(target: &Target, p: &Problem) -> serde_json::Value {
    let mut v = json!({
        "kind": p.kind,
        "severity": p.severity.as_str(),
        "path": target.relative(&p.file),
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

/// A problem as one line of text.
pub fn problem_line(target: &Target, p: &Problem) -> String {
    let mut s = format!(
        "{:<10} {} in {}",
        p.severity.as_str(),
        p.kind,
        target.relative(&p.file)
    );
    if let Some(pos) = p.position {
        let _ = write!(s, " at byte {pos}");
    }
    if let Some(off) = p.offset {
        let _ = write!(s, " (offset {off})");
    }
    s.push_str(": ");
    s.push_str(&p.detail);
    s
}

/// A topic-level problem as one line of text.
pub fn topic_problem_line(target: &Target, t: &TopicProblem) -> String {
    format!(
        "{}: {}",
        t.topic.as_deref().unwrap_or("."),
        problem_line(target, &t.problem)
    )
}

/// A topic-level problem as a JSON object: the problem with its `topic`.
pub fn topic_problem_json(target: &Target, t: &TopicProblem) -> serde_json::Value {
    let mut v = problem_json(target, &t.problem);
    v["topic"] = json!(t.topic);
    v["partition"] = serde_json::Value::Null;
    v
}

fn index_state_name(s: &IndexState) -> &'static str {
    match s {
        IndexState::Valid => "valid",
        IndexState::Missing => "missing",
        IndexState::Invalid(_) => "invalid",
        IndexState::NotChecked => "not_checked",
    }
}

fn segment_severity(s: &SegmentCheck) -> Option<Severity> {
    s.problems.iter().map(|p| p.severity).max()
}

/// Total size of the `.log` files below the target (a cheap directory listing).
fn total_log_bytes(target: &Target) -> u64 {
    let mut total = 0;
    for p in &target.partitions {
        let Ok(listing) = list_partition(&p.dir) else {
            continue;
        };
        for s in listing.segments {
            if p.only_segment.is_none_or(|b| b == s.base_offset) {
                total += std::fs::metadata(&s.log).map_or(0, |m| m.len());
            }
        }
    }
    total
}

/// Checks every partition of the target, with a progress bar on a terminal when the
/// data is large.
pub fn check_target(
    target: &Target,
    mode: CheckMode,
    global: Global,
) -> anyhow::Result<Vec<PartitionCheck>> {
    let bar = if !global.quiet && io::stderr().is_terminal() {
        let total = total_log_bytes(target);
        (total > PROGRESS_BYTES_MIN).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "verify {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        })
    } else {
        None
    };
    let mut checks = Vec::new();
    for p in &target.partitions {
        let c = check_partition_with(p, mode, &mut |s| {
            s.release_scan_index();
            if let Some(b) = &bar {
                b.inc(s.file_len);
            }
        })
        .with_context(|| format!("checking {}", p.dir.display()))?;
        checks.push(c);
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(checks)
}

/// While a broker holds `LOCK` it is appending to each active segment: a record being
/// written there reads as a torn one, and a reused file's old bytes after the new
/// data as damage. Its startup recovery already cut any tail a crash left, so such a
/// tail is information, not a repair to make (`recover` would wait for the lock).
fn excuse_live_writers(checks: &mut [PartitionCheck]) {
    for seg in checks.iter_mut().flat_map(|c| c.segments.iter_mut()) {
        if !seg.active {
            continue;
        }
        for p in &mut seg.problems {
            if p.kind == ProblemKind::TornTail && p.severity == Severity::Repairable {
                p.severity = Severity::Info;
                p.detail.push_str(
                    " (LOCK is held: a broker is writing here; its startup recovery cut any tail a crash left)",
                );
            }
        }
    }
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    let target = resolve_target(&args.path)?;
    let mode = if args.quick {
        CheckMode::Quick
    } else {
        CheckMode::Full
    };
    let mut checks = check_target(&target, mode, global)?;
    if target.root_is_data_dir && DirLock::is_held(&target.root) {
        excuse_live_writers(&mut checks);
    }
    let topics = topic_problems(&target);
    let worst = checks
        .iter()
        .filter_map(PartitionCheck::severity)
        .chain(topics.iter().map(|t| t.problem.severity))
        .max();
    let mut out = io::stdout().lock();
    if args.json {
        let v = render_json(&target, &checks, &topics, &args, worst);
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for t in &topics {
            writeln!(out, "{}", topic_problem_line(&target, t))?;
        }
        render_human(&mut out, &target, &checks, &topics, worst)?;
    }
    out.flush()?;
    if let Some(expect) = args.expect {
        let (code, line) = expect_outcome(expect, worst);
        if let Some(line) = line {
            writeln!(io::stderr(), "seglog: {line}")?;
        }
        return Ok(code);
    }
    Ok(exit_code(worst))
}

fn kind_name(k: &TargetKind) -> &'static str {
    match k {
        TargetKind::DataDir => "data_dir",
        TargetKind::Topic => "topic",
        TargetKind::Partition => "partition",
        TargetKind::LogFile => "log_file",
    }
}

fn segment_json(target: &Target, c: &PartitionCheck, s: &SegmentCheck) -> serde_json::Value {
    json!({
        "path": target.relative(&s.files.log),
        "topic": c.partition.topic,
        "partition": c.partition.partition,
        "base_offset": s.base_offset(),
        "first_offset": s.first_offset,
        "last_offset": s.last_offset,
        "records": s.records,
        "bytes": s.file_len,
        "data_end": s.data_end,
        "active": s.active,
        "generation": s.generation(),
        "trusted_by_index": s.trusted_by_index,
        "index": index_state_name(&s.index),
        "severity": severity_name(segment_severity(s)),
        "problems": s.problems.iter().map(|p| problem_json(target, p)).collect::<Vec<_>>(),
    })
}

fn render_json(
    target: &Target,
    checks: &[PartitionCheck],
    topics: &[TopicProblem],
    args: &Args,
    worst: Option<Severity>,
) -> serde_json::Value {
    let mut segments = Vec::new();
    let mut problems = Vec::new();
    let mut partitions = Vec::new();
    let mut counts = [0u64; 3];
    for t in topics {
        counts[t.problem.severity as usize] += 1;
        problems.push(topic_problem_json(target, t));
    }
    let (mut records, mut bytes, mut trusted) = (0u64, 0u64, 0u64);
    for c in checks {
        for p in c.all_problems() {
            counts[p.severity as usize] += 1;
        }
        for s in &c.segments {
            segments.push(segment_json(target, c, s));
            records += s.records.unwrap_or(0);
            bytes += s.file_len;
            trusted += u64::from(s.trusted_by_index);
        }
        for p in &c.problems {
            let mut v = problem_json(target, p);
            v["topic"] = json!(c.partition.topic);
            v["partition"] = json!(c.partition.partition);
            problems.push(v);
        }
        partitions.push(json!({
            "path": target.relative(&c.partition.dir),
            "topic": c.partition.topic,
            "partition": c.partition.partition,
            "severity": severity_name(c.severity()),
            "segments": c.segments.len(),
            "next_offset": c.next_offset(),
        }));
    }
    json!({
        "path": args.path.display().to_string(),
        "kind": kind_name(&target.kind),
        "mode": if args.quick { "quick" } else { "full" },
        "severity": severity_name(worst),
        "partitions": partitions,
        "segments": segments,
        "problems": problems,
        "totals": {
            "partitions": checks.len(),
            "segments": segments.len(),
            "records": records,
            "segments_trusted_by_index": trusted,
            "bytes": bytes,
            "info": counts[Severity::Info as usize],
            "repairable": counts[Severity::Repairable as usize],
            "corrupt": counts[Severity::Corrupt as usize],
        },
    })
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn status(s: &SegmentCheck) -> String {
    let worst = s
        .problems
        .iter()
        .filter(|p| p.severity > Severity::Info)
        .map(|p| p.severity)
        .max();
    let kinds = |min: Severity| {
        s.problems
            .iter()
            .filter(|p| p.severity >= min)
            .map(|p| p.kind.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match worst {
        Some(w) => format!("{}: {}", w.as_str(), kinds(Severity::Repairable)),
        None if !s.problems.is_empty() => format!("ok ({})", kinds(Severity::Info)),
        None if s.trusted_by_index => "ok (trusted by index)".to_string(),
        None => "ok".to_string(),
    }
}

fn render_human(
    out: &mut impl Write,
    target: &Target,
    checks: &[PartitionCheck],
    topics: &[TopicProblem],
    worst: Option<Severity>,
) -> io::Result<()> {
    let (mut segments, mut records, mut bytes) = (0usize, 0u64, 0u64);
    let mut counts = [0u64; 3];
    for t in topics {
        counts[t.problem.severity as usize] += 1;
    }
    for c in checks {
        let label = target.relative(&c.partition.dir);
        let label = if label.is_empty() { "." } else { &label };
        writeln!(
            out,
            "{label}: {} ({}, next offset {})",
            severity_name(c.severity()),
            counted(c.segments.len() as u64, "segment", "segments"),
            opt(c.next_offset())
        )?;
        if !c.segments.is_empty() {
            let mut t = Table::new();
            t.load_preset(presets::ASCII_BORDERS_ONLY_CONDENSED);
            t.set_header(vec!["segment", "offsets", "records", "bytes", "status"]);
            for s in &c.segments {
                let name = s
                    .files
                    .log
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let offsets = match (s.first_offset, s.last_offset) {
                    (Some(a), Some(b)) => format!("{a}..={b}"),
                    _ => "-".to_string(),
                };
                t.add_row(vec![
                    name,
                    offsets,
                    opt(s.records),
                    s.file_len.to_string(),
                    status(s),
                ]);
                segments += 1;
                records += s.records.unwrap_or(0);
                bytes += s.file_len;
            }
            for col in [1, 2, 3] {
                if let Some(c) = t.column_mut(col) {
                    c.set_cell_alignment(CellAlignment::Right);
                }
            }
            writeln!(out, "{t}")?;
        }
        for p in c.all_problems() {
            counts[p.severity as usize] += 1;
            writeln!(out, "  {}", problem_line(target, p))?;
        }
    }
    writeln!(
        out,
        "{}: {} partition(s), {segments} segment(s), {} read, {bytes} bytes; {} corrupt, {} repairable, {} info",
        severity_name(worst),
        checks.len(),
        counted(records, "record", "records"),
        counts[Severity::Corrupt as usize],
        counts[Severity::Repairable as usize],
        counts[Severity::Info as usize],
    )
}
