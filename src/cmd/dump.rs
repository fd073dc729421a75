//! `seglog dump`: records in offset order, one line each (or JSON Lines), streamed
//! segment by segment with the windowed reader so memory stays flat on any size.
//!
//! Dump checks what it reads with the shared classification ([`crate::engine::maintenance::check`]):
//! per partition it first runs the quick check (headers, indexes, sealed tails,
//! the active segment, continuity, markers), then names what ends each segment's
//! records with [`classify_scan_end`]. A problem becomes a `{"type": "problem"}`
//! line and the dump goes on; the exit code is the one `verify` gives for what dump
//! met. Damage inside a sealed segment does not end its dump: the reader
//! resynchronises after it ([`resync`], the same search fetch and salvage use), the
//! problem line names the damaged range, and the records after it follow.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::json;

mod state;

use super::verify::{exit_code, problem_json, problem_line, resolve_target, topic_problem_line};
use super::{BytesAs, ExitError, Global};
use crate::engine::maintenance::check::{
    check_partition_with, classify_scan_end, read_index_bytes, segment_header, topic_problems,
    CheckMode, DamagedRange, IndexState, PartitionCheck, Problem, ProblemKind, SegmentCheck,
    Severity, TopicProblem,
};
use crate::engine::storage::layout::{PartitionRef, Target};
use crate::engine::storage::map::SealedMap;
use crate::engine::storage::reader::{
    not_regular_file, open_log, read_header, Next, RecordReader, ScanEnd,
};
use crate::format::index::{lookup_bytes, IndexEntry};
use crate::format::{RecordView, SegmentHeader, HEADER_LEN, INDEX_ENTRY_LEN};

/// Longest key shown in human output, in characters.
const KEY_SHOWN_MAX: usize = 32;
/// Longest value shown in human output, in characters.
const VALUE_SHOWN_MAX: usize = 80;

/// Arguments of `seglog dump`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Prints records in offset order: one line per record (offset, time, key, value, \
shortened), or JSON Lines with --json: {\"type\": \"record\", \"path\", \"position\", \"offset\", \
\"timestamp_ms\", \"key\", \"value\", \"base_offset\", \"topic\", \"partition\"}; --index adds \
{\"type\": \"index\"} lines and --header {\"type\": \"header\"} lines. A problem met on the way \
is a {\"type\": \"problem\"} line (on stderr without --json) and the dump goes on. Damage inside a \
sealed segment does not end it: its problem line also names the damaged range (first_unreadable_offset, first_unreadable_position, next_readable_offset, next_readable_position; a next position of null means the records resume in the next segment, or nowhere when the offset is null too) and the records after the damage follow. Read-only.\n\n\
Exit: 0, or the code `seglog verify` gives for what dump met (1 repairable, 2 corrupt); \
74 I/O error. A closed stdout ends the dump quietly with exit 0.\n\n\
With --from/--to, dump reports (and its exit code counts) only the problems that concern \
offsets of the range, whether it read past them or not: damage by the offsets it makes \
unreadable, what ends a segment's records by the offsets after the last record before it, \
segments that do not join or overlap by the offsets missing or shared, a lost segment by its \
offsets, a segment's header or index when the segment holds offsets of the range; what \
concerns no offset (topic metadata, a compaction marker, temporary or stray files) is \
reported whatever the range. Nothing after where the dump stopped (--to, --limit) is read or \
reported. `seglog verify` checks the rest.\n\n\
--canonical: output for golden files, byte-identical for the same bytes on disk wherever the \
directory is and whenever it is read. It is --json --header --index with: every object's \
\"type\" first and its other keys in byte order of their names (nested objects too), one object \
per line, no spaces; paths relative to the data directory (to the partition directory for a \
loose copy) and no absolute path in any detail text; the records' own timestamp_ms (data, not \
the time of the run); and a last line {\"type\": \"end\", \"records\", \"severity\"}. It holds \
no time of the run, no PATH as given, no process id, host or version. --from, --to, --limit \
and --bytes apply as usual.\n\n\
State files: PATH may also be DATA/producers.journal (one line per entry: \
{\"type\": \"journal_entry\", \"path\", \"position\", \"kind\" (batch or init), \"producer_id\", \
\"epoch\", \"topic\", \"partition\", \"base_sequence\", \"last_sequence\", \"base_offset\", \
\"last_offset\", \"timestamp_ms\"}, with --header a {\"type\": \"journal_header\"} line first; a torn \
tail or corrupt entry is a problem line with its byte position), DATA/producers.json (a \
{\"type\": \"snapshot\"} line, then one {\"type\": \"producer\"} line per producer with its batches), \
DATA/groups/GROUP.json or DATA/groups (per group a {\"type\": \"group\"} line with \"members\" \
(0 without a stored membership) and, for a Stable group's stored membership, \"protocol\" and \
\"leader\"; then one {\"type\": \"member\", \"member_id\", \"instance_id\", \"leader\", \
\"client_id\", \"client_host\", \"session_timeout_ms\", \"rebalance_timeout_ms\", \
\"assignment_bytes\", \"metadata_bytes\" (of the chosen protocol), \"protocols\"} line per member, \
byte strings as their sizes; then one {\"type\": \"offset\"} line per committed offset, by topic \
and partition; a membership the broker refuses is a group_membership_refused problem line). \
--json and --canonical apply (the end line counts the entries, producers, members and offsets); \
--limit caps those; --from, --to, --index and --bytes do not apply."
)]
pub struct Args {
    /// Data directory, topic directory, partition directory or one .log file.
    pub path: PathBuf,
    /// First offset to print (inclusive).
    #[arg(long, value_name = "OFFSET")]
    pub from: Option<u64>,
    /// Last offset to print (inclusive).
    #[arg(long, value_name = "OFFSET")]
    pub to: Option<u64>,
    /// Print at most N records.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// JSON Lines, every line an object with a "type".
    #[arg(long)]
    pub json: bool,
    /// Also print each segment's index entries.
    #[arg(long)]
    pub index: bool,
    /// Also print each segment's header.
    #[arg(long)]
    pub header: bool,
    /// How keys and values are written in JSON.
    #[arg(long, value_enum, default_value_t = BytesAs::Auto)]
    pub bytes: BytesAs,
    /// Byte-stable JSON Lines for golden diffs: implies --json --header --index, keys
    /// in a fixed order, nothing that depends on the run, and a closing "end" line.
    #[arg(long)]
    pub canonical: bool,
}

struct Dumper<'a, W: Write> {
    args: &'a Args,
    target: &'a Target,
    out: W,
    /// Read sealed segments through a memory map (as the check does); off only to
    /// compare with positional reads.
    map_sealed: bool,
    printed: u64,
    worst: Option<Severity>,
    /// Problems already met in the current partition (printed, or left out as
    /// outside the range): (kind, file, position).
    seen: HashSet<(ProblemKind, PathBuf, Option<u64>)>,
    /// The segment being read and the first byte of it the dump did not read, once
    /// it stopped early (`--to`, `--limit`): problems from there on are not reported.
    stopped: Option<(PathBuf, u64)>,
    /// Label lines between partitions (human output, several partitions).
    labels: bool,
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    if let (Some(from), Some(to)) = (args.from, args.to) {
        if from > to {
            return Err(ExitError::usage(format!(
                "--from {from} is after --to {to}"
            )));
        }
    }
    let args = Args {
        json: args.json || args.canonical,
        header: args.header || args.canonical,
        index: args.index || args.canonical,
        ..args
    };
    let out = BufWriter::with_capacity(256 * 1024, io::stdout().lock());
    dump_to(&args, out, true)
}

/// Dumps what `args` names to `out`; `map_sealed` reads sealed segments through a
/// memory map, else with positional reads (the output is the same).
fn dump_to(args: &Args, out: impl Write, map_sealed: bool) -> anyhow::Result<u8> {
    if let Some((kind, data_dir)) = state::classify(&args.path) {
        return state::dump_state(args, kind, data_dir, out);
    }
    let target = resolve_target(&args.path)?;
    let mut d = Dumper {
        args,
        target: &target,
        out,
        map_sealed,
        printed: 0,
        worst: None,
        seen: HashSet::new(),
        stopped: None,
        labels: target.partitions.len() > 1,
    };
    // A topic whose metadata is damaged has no partitions to read: its problem is
    // all that says it is left out.
    for t in topic_problems(&target) {
        d.topic_problem(&t)?;
    }
    for p in &target.partitions {
        if d.done() {
            break;
        }
        d.partition(p)?;
    }
    if args.canonical {
        let end = json!({
            "type": "end",
            "records": d.printed,
            "severity": super::verify::severity_name(d.worst),
        });
        write_json(&mut d.out, &end)?;
    }
    d.out.flush()?;
    Ok(exit_code(d.worst))
}

impl<W: Write> Dumper<'_, W> {
    /// With --canonical, a problem's detail without the directory the dump was given
    /// (details name files relative to it).
    fn canonical_detail(&self, v: &mut serde_json::Value) {
        if !self.args.canonical {
            return;
        }
        let Some(detail) = v.get("detail").and_then(|d| d.as_str()) else {
            return;
        };
        let mut root = self.target.root.display().to_string();
        if !root.ends_with('/') {
            root.push('/');
        }
        if root == "./" || root == "/" {
            return;
        }
        let text = detail.replace(&root, "");
        v["detail"] = json!(text);
    }

    fn done(&self) -> bool {
        self.args.limit.is_some_and(|l| self.printed >= l)
    }

    fn partition(&mut self, p: &PartitionRef) -> anyhow::Result<()> {
        let check = check_partition_with(p, CheckMode::Quick, &mut |s| s.release_scan_index())
            .with_context(|| format!("checking {}", p.dir.display()))?;
        self.seen.clear();
        if self.labels && !self.args.json {
            writeln!(self.out, "# {}", self.target.relative(&p.dir))?;
        }
        for prob in &check.problems {
            let span = partition_problem_span(&check, prob);
            self.problem(&check, prob, span)?;
        }
        for (i, seg) in check.segments.iter().enumerate() {
            let next_base = check.segments.get(i + 1).map(SegmentCheck::base_offset);
            if let (Some(from), Some(next)) = (self.args.from, next_base) {
                if next <= from {
                    continue;
                }
            }
            if self.args.to.is_some_and(|t| seg.base_offset() > t) || self.done() {
                break;
            }
            self.segment(&check, seg, next_base)
                .with_context(|| format!("reading {}", seg.files.log.display()))?;
        }
        Ok(())
    }

    /// Whether offsets `first..=last` (`last` `None`: unbounded) meet the range
    /// `--from`/`--to`.
    fn in_range(&self, (first, last): (u64, Option<u64>)) -> bool {
        let after = self.args.to.is_some_and(|t| first > t);
        let before = matches!((self.args.from, last), (Some(f), Some(l)) if l < f);
        !(after || before)
    }

    /// A problem of a topic's metadata or of a file outside every partition.
    fn topic_problem(&mut self, t: &TopicProblem) -> anyhow::Result<()> {
        let line = topic_problem_line(self.target, t);
        self.emit(&t.problem, json!(t.topic), serde_json::Value::Null, &line)
    }

    /// Prints a problem of a partition once, unless it lies outside what was asked:
    /// `span`, the offsets it concerns (first, last if bounded), misses the
    /// `--from`/`--to` range, or it sits where the dump stopped reading.
    fn problem(
        &mut self,
        check: &PartitionCheck,
        p: &Problem,
        span: Option<(u64, Option<u64>)>,
    ) -> anyhow::Result<()> {
        if !self.seen.insert((p.kind, p.file.clone(), p.position)) {
            return Ok(());
        }
        let span = p.unreadable.as_deref().and_then(damaged_span).or(span);
        if span.is_some_and(|s| !self.in_range(s)) {
            return Ok(());
        }
        if let (Some((file, from)), Some(position)) = (&self.stopped, p.position) {
            if *file == p.file && position >= *from {
                return Ok(());
            }
        }
        let line = problem_line(self.target, p);
        let (topic, partition) = (&check.partition.topic, check.partition.partition);
        self.emit(p, json!(topic), json!(partition), &line)
    }

    /// Prints a problem: a `problem` line with `--json`, else (when it is more than
    /// information) `line` on stderr; counts its severity.
    fn emit(
        &mut self,
        p: &Problem,
        topic: serde_json::Value,
        partition: serde_json::Value,
        line: &str,
    ) -> anyhow::Result<()> {
        if p.severity > Severity::Info {
            self.worst = self.worst.max(Some(p.severity));
        }
        if self.args.json {
            let mut v = problem_json(self.target, p);
            v["type"] = json!("problem");
            v["topic"] = topic;
            v["partition"] = partition;
            self.canonical_detail(&mut v);
            write_json(&mut self.out, &v)?;
        } else if p.severity > Severity::Info {
            // Diagnostics go to stderr; flush the records before it so a terminal
            // shows them in order.
            self.out.flush()?;
            writeln!(io::stderr(), "seglog: {}", line.trim_start())?;
        }
        Ok(())
    }

    fn segment(
        &mut self,
        check: &PartitionCheck,
        seg: &SegmentCheck,
        next_base: Option<u64>,
    ) -> anyhow::Result<()> {
        let (file, file_len) = match open_log(&seg.files.log) {
            Ok(f) => f,
            // No regular file (a FIFO, a directory): the check's problem, never read.
            Err(e) if not_regular_file(&e).is_some() => return self.rest_of_problems(check, seg),
            Err(e) => return Err(e.into()),
        };
        let decoded = read_header(&file, file_len)?;
        if self.args.header {
            self.header_line(check, seg, &decoded, file_len)?;
        }
        let header = match segment_header(&seg.files, seg.active, file_len, &decoded) {
            Ok(h) => h,
            Err(p) => {
                self.problem(check, &p, None)?;
                return self.rest_of_problems(check, seg);
            }
        };
        let index = if self.args.index || self.args.from.is_some() {
            // An index over the size limit is not read (the check reports it).
            read_index_bytes(&seg.files.index)?.and_then(Result::ok)
        } else {
            None
        };
        if self.args.index {
            self.index_lines(check, seg, index.as_deref().unwrap_or(&[]))?;
        }
        let mut start = self.start_position(seg, index.as_deref(), &file, &header, file_len)?;
        drop(index);
        let mut last = None;
        while let Some((end, seen)) =
            self.records(check, seg, &file, &header, (start, last), file_len)?
        {
            let Some(mut p) = classify_scan_end(
                &seg.files, seg.active, &file, &end, seen, file_len, next_base,
            )?
            else {
                break;
            };
            let (Some(position), false, Severity::Corrupt) =
                (end.position(), seg.active, p.severity)
            else {
                // What ends the data concerns the offsets after the last record read:
                // up to the next segment's base, or on (the active segment).
                let first = seen.map_or(Some(header.base_offset), |o| o.checked_add(1));
                let span = first.map(|f| (f, next_base.map(|b| b.saturating_sub(1).max(f))));
                self.problem(check, &p, span)?;
                break;
            };
            // Damage inside a sealed segment: find where its records resume.
            let range = DamagedRange::find(&file, &header, position, file_len, seen, next_base)?;
            let found = range.next;
            p.detail = range.describe(&end);
            p.unreadable = Some(Box::new(range));
            self.problem(check, &p, None)?;
            let Some(r) = found else {
                break;
            };
            start = r.position;
            last = seen;
        }
        self.rest_of_problems(check, seg)
    }

    /// The problems the quick check found in a segment that reading it did not meet
    /// again (index problems, a tail past where the dump stopped).
    fn rest_of_problems(
        &mut self,
        check: &PartitionCheck,
        seg: &SegmentCheck,
    ) -> anyhow::Result<()> {
        for p in &seg.problems {
            self.problem(check, p, None)?;
        }
        self.stopped = None;
        Ok(())
    }

    /// Where to start reading: with `--from`, the index entry at or before it when the
    /// index is known to be valid; else the first record.
    ///
    /// The quick check trusts an index by its first and last entries, so the entry
    /// used is taken only when the record at its position is the one it names.
    fn start_position(
        &self,
        seg: &SegmentCheck,
        index: Option<&[u8]>,
        file: &File,
        header: &SegmentHeader,
        file_len: u64,
    ) -> io::Result<u64> {
        let (Some(from), Some(bytes)) = (self.args.from, index) else {
            return Ok(HEADER_LEN as u64);
        };
        if seg.index != IndexState::Valid {
            return Ok(HEADER_LEN as u64);
        }
        let Some(e) = from
            .checked_sub(seg.base_offset())
            .and_then(|rel| lookup_bytes(bytes, rel))
        else {
            return Ok(HEADER_LEN as u64);
        };
        let mut reader = RecordReader::new(file, header.generation, e.position, file_len);
        let named = seg.base_offset().checked_add(e.relative_offset);
        Ok(match reader.next_record()? {
            Next::Record { record, .. } if Some(record.offset) == named => e.position,
            _ => HEADER_LEN as u64,
        })
    }

    /// Streams the records of one segment from `start`, `last` the offset of the
    /// valid record before it (if any). Returns what ended the data and the last valid
    /// offset, or `None` when the dump stopped before the end
    /// (`--to`, `--limit`).
    fn records(
        &mut self,
        check: &PartitionCheck,
        seg: &SegmentCheck,
        file: &File,
        header: &SegmentHeader,
        (start, mut last): (u64, Option<u64>),
        file_len: u64,
    ) -> anyhow::Result<Option<(ScanEnd, Option<u64>)>> {
        // Never the active segment, whose length changes while it is read.
        let map = (self.map_sealed && !seg.active)
            .then(|| SealedMap::sealed(file, file_len))
            .flatten();
        let mut reader =
            RecordReader::sealed(file, map.as_ref(), header.generation, start, file_len);
        let path = self.target.relative(&seg.files.log);
        let end = loop {
            let (position, record) = match reader.next_record()? {
                Next::Record { position, record } => (position, record),
                Next::End(None) => break ScanEnd::Eof,
                Next::End(Some(e)) => break ScanEnd::Record(e),
            };
            let in_order = match last {
                Some(prev) => record.offset > prev,
                None => record.offset >= header.base_offset,
            };
            if !in_order {
                break ScanEnd::OffsetOrder {
                    position,
                    offset: record.offset,
                    previous: last,
                    base_offset: header.base_offset,
                };
            }
            last = Some(record.offset);
            if self.args.from.is_some_and(|f| record.offset < f) {
                continue;
            }
            if self.args.to.is_some_and(|t| record.offset > t) {
                self.stopped = Some((seg.files.log.clone(), position));
                return Ok(None);
            }
            write_record(
                &mut self.out,
                self.args,
                check,
                &path,
                header.base_offset,
                position,
                &record,
            )?;
            self.printed += 1;
            if self.done() {
                // Nothing after the start of the last record printed was read.
                self.stopped = Some((seg.files.log.clone(), position.saturating_add(1)));
                return Ok(None);
            }
        };
        Ok(Some((end, last)))
    }

    fn header_line(
        &mut self,
        check: &PartitionCheck,
        seg: &SegmentCheck,
        decoded: &Result<SegmentHeader, crate::format::HeaderError>,
        file_len: u64,
    ) -> anyhow::Result<()> {
        let path = self.target.relative(&seg.files.log);
        if self.args.json {
            let mut v = json!({
                "type": "header",
                "topic": check.partition.topic,
                "partition": check.partition.partition,
                "path": path,
                "file_bytes": file_len,
                "active": seg.active,
            });
            match decoded {
                Ok(h) => {
                    v["version"] = json!(crate::format::FORMAT_VERSION);
                    v["base_offset"] = json!(h.base_offset);
                    v["generation"] = json!(h.generation);
                    v["flags"] = json!(h.flags);
                    v["error"] = json!(null);
                }
                Err(e) => v["error"] = json!(e.to_string()),
            }
            write_json(&mut self.out, &v)?;
        } else {
            match decoded {
                Ok(h) => writeln!(
                    self.out,
                    "# header {path}: version {} base_offset {} generation {} flags {} ({file_len} bytes)",
                    crate::format::FORMAT_VERSION,
                    h.base_offset,
                    h.generation,
                    h.flags
                )?,
                Err(e) => writeln!(self.out, "# header {path}: {e}")?,
            }
        }
        Ok(())
    }

    fn index_lines(
        &mut self,
        check: &PartitionCheck,
        seg: &SegmentCheck,
        bytes: &[u8],
    ) -> anyhow::Result<()> {
        let path = self.target.relative(&seg.files.index);
        for (i, chunk) in bytes.chunks_exact(INDEX_ENTRY_LEN).enumerate() {
            let Some(IndexEntry {
                relative_offset,
                position,
            }) = IndexEntry::decode(chunk)
            else {
                break;
            };
            let offset = seg.base_offset().checked_add(relative_offset);
            if self.args.json {
                let v = json!({
                    "type": "index",
                    "topic": check.partition.topic,
                    "partition": check.partition.partition,
                    "path": path,
                    "entry": i,
                    "at": i * INDEX_ENTRY_LEN,
                    "relative_offset": relative_offset,
                    "offset": offset,
                    "position": position,
                });
                write_json(&mut self.out, &v)?;
            } else {
                writeln!(
                    self.out,
                    "# index {path} entry {i}: offset {} (relative {relative_offset}) at position {position}",
                    offset.map_or_else(|| "?".to_string(), |o| o.to_string())
                )?;
            }
        }
        Ok(())
    }
}

/// The offsets damage inside a sealed segment concerns: those it makes unreadable,
/// or, when it hides none, the offset of the record that follows it.
fn damaged_span(r: &DamagedRange) -> Option<(u64, Option<u64>)> {
    r.lost_offsets()
        .or_else(|| r.first_offset.map(|f| (f, Some(f))))
}

/// The offsets a partition-level problem concerns: the offsets missing between two
/// segments that do not join, those two overlapping segments share (from the later
/// one's first), a lost segment's; `None` for what concerns no offset (a marker,
/// temporary files, stray files), which is reported whatever the range.
fn partition_problem_span(check: &PartitionCheck, p: &Problem) -> Option<(u64, Option<u64>)> {
    let at = check.segments.iter().position(|s| s.files.log == p.file);
    match p.kind {
        ProblemKind::SegmentsDoNotJoin => {
            let base = check.segments.get(at?)?.base_offset();
            Some((p.offset?, Some(base.saturating_sub(1))))
        }
        ProblemKind::SegmentsOverlap => {
            let before = check
                .segments
                .get(..at?)?
                .iter()
                .rev()
                .find_map(|s| s.last_offset);
            Some((p.offset?, before))
        }
        ProblemKind::LostSegment => {
            let base = p.offset?;
            let next = check
                .segments
                .iter()
                .map(SegmentCheck::base_offset)
                .find(|&b| b > base);
            Some((base, next.map(|n| n.saturating_sub(1))))
        }
        _ => None,
    }
}

/// Writes one JSON line with its `"type"` first (the other fields follow in name
/// order).
fn write_json(out: &mut impl Write, v: &serde_json::Value) -> io::Result<()> {
    let Some(map) = v.as_object() else {
        serde_json::to_writer(&mut *out, v)?;
        return out.write_all(b"\n");
    };
    out.write_all(b"{")?;
    let mut first = true;
    let typed = map.get_key_value("type");
    for (k, val) in typed
        .into_iter()
        .chain(map.iter().filter(|(k, _)| *k != "type"))
    {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, k)?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut *out, val)?;
    }
    out.write_all(b"}\n")
}

/// A record line, its fields in the documented order.
#[derive(serde::Serialize)]
struct RecordLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    topic: Option<&'a str>,
    partition: Option<u32>,
    path: &'a str,
    base_offset: u64,
    position: u64,
    offset: u64,
    timestamp_ms: i64,
    key: serde_json::Value,
    value: serde_json::Value,
}

fn write_record(
    out: &mut impl Write,
    args: &Args,
    check: &PartitionCheck,
    path: &str,
    base_offset: u64,
    position: u64,
    r: &RecordView<'_>,
) -> io::Result<()> {
    if args.json {
        let line = RecordLine {
            kind: "record",
            topic: check.partition.topic.as_deref(),
            partition: check.partition.partition,
            path,
            base_offset,
            position,
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: args.bytes.json(r.key),
            value: args.bytes.json(Some(r.value)),
        };
        if args.canonical {
            let v = serde_json::to_value(&line).map_err(io::Error::other)?;
            return write_json(out, &v);
        }
        serde_json::to_writer(&mut *out, &line)?;
        return out.write_all(b"\n");
    }
    let key = r
        .key
        .map_or_else(|| "-".to_string(), |k| shown(k, KEY_SHOWN_MAX));
    let value = if r.is_tombstone() {
        "(tombstone)".to_string()
    } else {
        shown(r.value, VALUE_SHOWN_MAX)
    };
    writeln!(
        out,
        "{}  {}  {key}  {value}",
        r.offset,
        format_timestamp_ms(r.timestamp_ms)
    )
}

/// Bytes as printable text: UTF-8 with control characters escaped, other bytes as
/// `\xNN`, cut to `max` characters with the number of bytes left out.
pub fn shown(bytes: &[u8], max: usize) -> String {
    let mut s = String::new();
    let mut chars = 0usize;
    let mut used = 0usize;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if chars >= max {
                break;
            }
            if c.is_control() {
                s.extend(c.escape_default());
            } else {
                s.push(c);
            }
            chars += 1;
            used += c.len_utf8();
        }
        for b in chunk.invalid() {
            if chars >= max {
                break;
            }
            let _ = write!(s, "\\x{b:02x}");
            chars += 1;
            used += 1;
        }
    }
    if used < bytes.len() {
        let _ = write!(s, "…(+{} bytes)", bytes.len() - used);
    }
    if s.is_empty() {
        s.push_str("\"\"");
    }
    s
}

/// `2023-11-14T22:13:20.000Z` for a Unix time in milliseconds (proleptic Gregorian,
/// UTC).
pub fn format_timestamp_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(format_timestamp_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_timestamp_ms(1_700_000_000_123),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(format_timestamp_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            format_timestamp_ms(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn dump(flags: &[&str], path: &std::path::Path, map_sealed: bool) -> (u8, Vec<u8>) {
        use clap::Parser as _;
        let mut argv = vec!["dump".to_string(), path.display().to_string()];
        argv.extend(flags.iter().map(ToString::to_string));
        let cli = Cli::try_parse_from(argv).unwrap();
        let mut out = Vec::new();
        let code = dump_to(&cli.args, &mut out, map_sealed).unwrap();
        (code, out)
    }

    /// Sealed segments read through a map print exactly what positional reads
    /// print, on every committed fixture (clean and damaged alike).
    #[test]
    fn mapped_sealed_segments_dump_as_positional_reads_do() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut dirs: Vec<_> = std::fs::read_dir(&fixtures)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir() && p.join("topics").is_dir())
            .collect();
        dirs.sort();
        assert!(dirs.len() > 10, "{dirs:?}");
        let sealed = fixtures.join("clean/topics/users/0/00000000000000000000.log");
        let f = File::open(&sealed).unwrap();
        assert!(SealedMap::sealed(&f, f.metadata().unwrap().len()).is_some());
        drop(f);
        for dir in &dirs {
            for flags in [
                &["--json"][..],
                &["--json", "--index", "--header"],
                &["--json", "--from", "5", "--to", "40"],
                &[],
            ] {
                let mapped = dump(flags, dir, true);
                let pread = dump(flags, dir, false);
                assert!(!pread.1.is_empty(), "{}: {flags:?}", dir.display());
                assert_eq!(
                    String::from_utf8_lossy(&mapped.1),
                    String::from_utf8_lossy(&pread.1),
                    "{}: {flags:?}",
                    dir.display()
                );
                assert_eq!(mapped.0, pread.0, "{}: {flags:?}", dir.display());
            }
        }
    }

    #[test]
    fn shortened_text() {
        assert_eq!(shown(b"abc", 10), "abc");
        assert_eq!(shown(b"a\nb", 10), "a\\nb");
        assert_eq!(shown(&[0xff, b'a'], 10), "\\xffa");
        assert_eq!(shown(b"abcdef", 3), "abc…(+3 bytes)");
        assert_eq!(shown(b"", 3), "\"\"");
    }
}
