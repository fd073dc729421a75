//! `seglog dump` of the state files beside the topics: `producers.journal` (its
//! entries in order, each with its byte position), `producers.json` (the snapshot
//! the journal is cut after), and a group's `groups/<group>.json` or the whole
//! `groups/` directory (each group, its stored membership and members, then its
//! committed offsets; a member's byte strings as their sizes). Problems are the
//! ones `verify` reports for these files, as `{"type": "problem"}` lines (on stderr
//! without --json); the exit code is verify's for what was met.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{format_timestamp_ms, shown, write_json, Args};
use crate::cmd::verify::{exit_code, problem_json, problem_line};
use crate::engine::error::counted;
use crate::engine::groups::offsets::{read_group_file, scan_dir, GroupEntry, Loaded};
use crate::engine::maintenance::check::{Problem, ProblemKind, Severity};
use crate::engine::maintenance::state::{
    group_entry_problem, group_membership_problem, state_problems,
};
use crate::engine::producers::read_state_file;
use crate::engine::storage::layout::{Target, TargetKind};
use crate::format::group::{StoredMembership, GROUPS_DIR};
use crate::format::names::TOPICS_DIR;
use crate::format::producers::{
    decode_entry, decode_snapshot, JournalEntry, JOURNAL_BYTES_MAX, JOURNAL_FILE,
    JOURNAL_HEADER_LEN, KIND_BATCH, SNAPSHOT_BYTES_MAX, SNAPSHOT_FILE,
};

/// Longest metadata shown in human output, in characters.
const METADATA_SHOWN_MAX: usize = 40;

/// Which state file a dump path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StateFile {
    Journal,
    Snapshot,
    Group,
    GroupsDir,
}

/// The state file `path` names and its data directory, or `None` for any other
/// path (a data, topic or partition directory, a `.log` file).
pub(super) fn classify(path: &Path) -> Option<(StateFile, PathBuf)> {
    let name = path.file_name()?.to_str()?;
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("."),
    };
    // A topic named like the groups directory is a topic: `topics/groups`.
    let is_topics = |p: &Path| p.file_name().and_then(|n| n.to_str()) == Some(TOPICS_DIR);
    if path.is_dir() {
        return (name == GROUPS_DIR && !is_topics(parent))
            .then(|| (StateFile::GroupsDir, parent.to_path_buf()));
    }
    if !path.is_file() {
        return None;
    }
    if name == JOURNAL_FILE {
        return Some((StateFile::Journal, parent.to_path_buf()));
    }
    if name == SNAPSHOT_FILE {
        return Some((StateFile::Snapshot, parent.to_path_buf()));
    }
    let in_groups = parent.file_name().and_then(|n| n.to_str()) == Some(GROUPS_DIR);
    if in_groups && name.ends_with(".json") {
        let data = match parent.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => Path::new("."),
        };
        if !is_topics(data) {
            return Some((StateFile::Group, data.to_path_buf()));
        }
    }
    None
}

struct StateDumper<'a, W: Write> {
    args: &'a Args,
    target: Target,
    out: W,
    printed: u64,
    worst: Option<Severity>,
}

/// Dumps the state file `path` (classified as `kind` in `data_dir`).
pub(super) fn dump_state(
    args: &Args,
    kind: StateFile,
    data_dir: PathBuf,
    out: impl Write,
) -> anyhow::Result<u8> {
    let mut d = StateDumper {
        args,
        target: Target {
            kind: TargetKind::DataDir,
            root: data_dir,
            root_is_data_dir: true,
            partitions: Vec::new(),
            topics: Vec::new(),
            temp_files: Vec::new(),
            unknown: Vec::new(),
        },
        out,
        printed: 0,
        worst: None,
    };
    match kind {
        StateFile::Journal => d.journal(&args.path)?,
        StateFile::Snapshot => d.snapshot(&args.path)?,
        StateFile::Group => match read_group_file(&args.path) {
            Ok((group, loaded)) => {
                if let Some(tp) = group_membership_problem(&args.path, &loaded) {
                    d.problem(&tp.problem)?;
                }
                d.group(&args.path, &group, &loaded)?;
            }
            Err(p) => {
                let problem = Problem {
                    kind: ProblemKind::GroupFileUnreadable,
                    severity: ProblemKind::GroupFileUnreadable.severity(),
                    file: args.path.clone(),
                    position: None,
                    offset: None,
                    detail: format!("{p}; the broker refuses this group until it is repaired"),
                    unreadable: None,
                    behind: None,
                };
                d.problem(&problem)?;
            }
        },
        StateFile::GroupsDir => {
            for e in scan_dir(&args.path) {
                if let Some(tp) = group_entry_problem(&args.path, &e) {
                    d.problem(&tp.problem)?;
                }
                if let GroupEntry::Group(group, loaded) = &e {
                    let file = args.path.join(crate::format::group::group_file_name(group));
                    d.group(&file, group, loaded)?;
                }
            }
        }
    }
    if args.canonical {
        let end = json!({
            "type": "end",
            "records": d.printed,
            "severity": crate::cmd::verify::severity_name(d.worst),
        });
        write_json(&mut d.out, &end)?;
    }
    d.out.flush()?;
    Ok(exit_code(d.worst))
}

impl<W: Write> StateDumper<'_, W> {
    fn done(&self) -> bool {
        self.args.limit.is_some_and(|l| self.printed >= l)
    }

    fn rel(&self, path: &Path) -> String {
        self.target.relative(path)
    }

    fn problem(&mut self, p: &Problem) -> anyhow::Result<()> {
        if p.severity > Severity::Info {
            self.worst = self.worst.max(Some(p.severity));
        }
        if self.args.json {
            let mut v = problem_json(&self.target, p);
            v["type"] = json!("problem");
            write_json(&mut self.out, &v)?;
        } else if p.severity > Severity::Info {
            self.out.flush()?;
            writeln!(
                io::stderr(),
                "seglog: {}",
                problem_line(&self.target, p).trim_start()
            )?;
        }
        Ok(())
    }

    /// The journal's problems as verify reports them (the snapshot's are the
    /// snapshot dump's).
    fn journal_problems(&mut self, path: &Path) -> anyhow::Result<()> {
        let problems: Vec<Problem> = state_problems(&self.target.root)
            .into_iter()
            .map(|tp| tp.problem)
            .filter(|p| p.file.file_name() == path.file_name() && p.file.parent() == path.parent())
            .collect();
        for p in &problems {
            self.problem(p)?;
        }
        Ok(())
    }

    fn journal(&mut self, path: &Path) -> anyhow::Result<()> {
        // Bounded like every reader: an oversized or special file is the problem
        // verify reports, never read.
        let bytes = match read_state_file(path, JOURNAL_BYTES_MAX) {
            Ok(Some(b)) => b,
            Ok(None) => anyhow::bail!("{}: no such file", path.display()),
            Err(_) => return self.journal_problems(path),
        };
        let rel = self.rel(path);
        if self.args.header && bytes.len() >= JOURNAL_HEADER_LEN {
            let v = json!({
                "type": "journal_header",
                "path": rel,
                "magic": String::from_utf8_lossy(&bytes[..4]),
                "version": u16::from_be_bytes([bytes[4], bytes[5]]),
            });
            if self.args.json {
                write_json(&mut self.out, &v)?;
            } else {
                writeln!(self.out, "# {rel}: journal version {}", v["version"])?;
            }
        }
        // Entries up to the first problem, each at its byte position.
        let (_, good, _) = crate::format::producers::scan_journal(&bytes);
        let mut at = JOURNAL_HEADER_LEN;
        while at < good && !self.done() {
            let Ok((e, n)) = decode_entry(&bytes, at) else {
                break;
            };
            self.entry(&rel, at as u64, &e)?;
            at += n;
        }
        self.journal_problems(path)
    }

    fn entry(&mut self, rel: &str, position: u64, e: &JournalEntry) -> anyhow::Result<()> {
        self.printed += 1;
        let kind = if e.kind == KIND_BATCH {
            "batch"
        } else {
            "init"
        };
        if self.args.json {
            let v = json!({
                "type": "journal_entry",
                "path": rel,
                "position": position,
                "kind": kind,
                "producer_id": e.producer_id,
                "epoch": e.epoch,
                "topic": e.topic,
                "partition": e.partition,
                "base_sequence": e.base_sequence,
                "last_sequence": e.last_sequence,
                "base_offset": e.base_offset,
                "last_offset": e.last_offset,
                "timestamp_ms": e.timestamp_ms,
            });
            write_json(&mut self.out, &v)?;
        } else if e.kind == KIND_BATCH {
            writeln!(
                self.out,
                "{position}  batch  producer {} epoch {}  {}/{}  seq {}..{}  offsets {}..{}  {}",
                e.producer_id,
                e.epoch,
                e.topic,
                e.partition,
                e.base_sequence,
                e.last_sequence,
                e.base_offset,
                e.last_offset,
                format_timestamp_ms(e.timestamp_ms)
            )?;
        } else {
            writeln!(
                self.out,
                "{position}  init  producer {} epoch {}  {}",
                e.producer_id,
                e.epoch,
                format_timestamp_ms(e.timestamp_ms)
            )?;
        }
        Ok(())
    }

    fn snapshot(&mut self, path: &Path) -> anyhow::Result<()> {
        let rel = self.rel(path);
        let snap = match read_state_file(path, SNAPSHOT_BYTES_MAX)
            .and_then(|b| b.ok_or_else(|| "no such file".to_string()))
            .and_then(|b| decode_snapshot(&b))
        {
            Ok(s) => s,
            Err(e) => {
                let p = Problem {
                    kind: ProblemKind::JournalCorrupt,
                    severity: ProblemKind::JournalCorrupt.severity(),
                    file: path.to_path_buf(),
                    position: None,
                    offset: None,
                    detail: format!("{SNAPSHOT_FILE}: {e}"),
                    unreadable: None,
                    behind: None,
                };
                return self.problem(&p);
            }
        };
        if self.args.json {
            let v = json!({
                "type": "snapshot",
                "path": rel,
                "version": snap.version,
                "next_producer_id": snap.next_producer_id,
                "producers": snap.producers.len(),
            });
            write_json(&mut self.out, &v)?;
        } else {
            writeln!(
                self.out,
                "# {rel}: version {}, next producer id {}, {} producers",
                snap.version,
                snap.next_producer_id,
                snap.producers.len()
            )?;
        }
        for p in &snap.producers {
            if self.done() {
                break;
            }
            self.printed += 1;
            if self.args.json {
                let mut batches = p.batches.clone();
                batches.sort_by(|a, b| {
                    (&a.topic, a.partition, a.base_sequence).cmp(&(
                        &b.topic,
                        b.partition,
                        b.base_sequence,
                    ))
                });
                let v = json!({
                    "type": "producer",
                    "path": rel,
                    "producer_id": p.producer_id,
                    "epoch": p.epoch,
                    "last_seen_ms": p.last_seen_ms,
                    "batches": batches,
                });
                write_json(&mut self.out, &v)?;
            } else {
                writeln!(
                    self.out,
                    "producer {} epoch {}  last seen {}",
                    p.producer_id,
                    p.epoch,
                    format_timestamp_ms(p.last_seen_ms)
                )?;
                for b in &p.batches {
                    writeln!(
                        self.out,
                        "  {}/{}  seq {}..{}  offsets {}..{}",
                        b.topic,
                        b.partition,
                        b.base_sequence,
                        b.last_sequence,
                        b.base_offset,
                        b.last_offset
                    )?;
                }
            }
        }
        Ok(())
    }

    fn group(&mut self, path: &Path, group: &str, l: &Loaded) -> anyhow::Result<()> {
        let rel = self.rel(path);
        if self.args.json {
            let v = json!({
                "type": "group",
                "path": rel,
                "group": group,
                "generation": l.generation,
                "protocol_type": l.protocol_type,
                "empty_since_ms": l.empty_since_ms,
                "offsets": l.offsets.len(),
                "members": l.membership.as_ref().map_or(0, |m| m.members.len()),
            });
            let mut v = v;
            if let Some(m) = &l.membership {
                v["protocol"] = json!(m.protocol);
                v["leader"] = json!(m.leader);
            }
            write_json(&mut self.out, &v)?;
        } else {
            let empty = if l.empty_since_ms > 0 {
                format!(", empty since {}", format_timestamp_ms(l.empty_since_ms))
            } else {
                String::new()
            };
            writeln!(
                self.out,
                "# group {group} ({rel}): generation {}, protocol type {:?}{empty}, {}",
                l.generation,
                l.protocol_type,
                counted(l.offsets.len() as u64, "offset", "offsets")
            )?;
        }
        if let Some(m) = &l.membership {
            self.members(&rel, group, m)?;
        }
        let mut offsets = l.offsets.clone();
        offsets.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        for o in &offsets {
            if self.done() {
                break;
            }
            self.printed += 1;
            if self.args.json {
                let v = json!({
                    "type": "offset",
                    "path": rel,
                    "group": group,
                    "topic": o.topic,
                    "partition": o.partition,
                    "offset": o.offset,
                    "metadata": o.metadata,
                    "commit_ms": o.commit_ms,
                });
                write_json(&mut self.out, &v)?;
            } else {
                let metadata = if o.metadata.is_empty() {
                    "-".to_string()
                } else {
                    shown(o.metadata.as_bytes(), METADATA_SHOWN_MAX)
                };
                writeln!(
                    self.out,
                    "{}/{}  {}  {metadata}  {}",
                    o.topic,
                    o.partition,
                    o.offset,
                    format_timestamp_ms(o.commit_ms)
                )?;
            }
        }
        Ok(())
    }

    /// A Stable group's stored membership: in text a line with the protocol and the
    /// leader, then a line per member; in JSON a line per member (the group line
    /// holds the protocol and the leader). Counted as offsets are.
    fn members(&mut self, rel: &str, group: &str, m: &StoredMembership) -> anyhow::Result<()> {
        if !self.args.json {
            writeln!(
                self.out,
                "# membership: protocol {:?}, leader {:?}, {}",
                m.protocol,
                m.leader,
                counted(m.members.len() as u64, "member", "members")
            )?;
        }
        for x in &m.members {
            if self.done() {
                break;
            }
            self.printed += 1;
            // The metadata the member joined the chosen protocol with.
            let metadata = x
                .protocols
                .iter()
                .find(|p| p.name == m.protocol)
                .map_or(0, |p| p.metadata.len());
            if self.args.json {
                let protocols: Vec<_> = x
                    .protocols
                    .iter()
                    .map(|p| json!({"name": p.name, "metadata_bytes": p.metadata.len()}))
                    .collect();
                let v = json!({
                    "type": "member",
                    "path": rel,
                    "group": group,
                    "member_id": x.member_id,
                    "instance_id": x.instance_id,
                    "leader": x.member_id == m.leader,
                    "client_id": x.client_id,
                    "client_host": x.client_host,
                    "session_timeout_ms": x.session_timeout_ms,
                    "rebalance_timeout_ms": x.rebalance_timeout_ms,
                    "assignment_bytes": x.assignment.len(),
                    "metadata_bytes": metadata,
                    "protocols": protocols,
                });
                write_json(&mut self.out, &v)?;
            } else {
                let instance = x
                    .instance_id
                    .as_ref()
                    .map(|i| format!("  instance {i:?}"))
                    .unwrap_or_default();
                let protocols: Vec<String> = x
                    .protocols
                    .iter()
                    .map(|p| {
                        format!(
                            "{:?} {}",
                            p.name,
                            counted(p.metadata.len() as u64, "byte", "bytes")
                        )
                    })
                    .collect();
                writeln!(
                    self.out,
                    "member {:?}{instance}  client {:?} {:?}  session {} ms  rebalance {} ms  assignment {}  metadata {}  protocols {}",
                    x.member_id,
                    x.client_id,
                    x.client_host,
                    x.session_timeout_ms,
                    x.rebalance_timeout_ms,
                    counted(x.assignment.len() as u64, "byte", "bytes"),
                    counted(metadata as u64, "byte", "bytes"),
                    protocols.join(", ")
                )?;
            }
        }
        Ok(())
    }
}
