//! The data directory's state files beside the topics: `groups/*.json`,
//! `producers.journal`, `producers.json`, `api_keys.json` and `cluster.json`.
//! `verify` reports their problems (with
//! the journal entry's byte position); recovery plans the cut of a torn journal tail
//! and the rewrite of a group file whose stored membership is refused
//! (`recovery::plan_topics`), and the broker does both at startup.

use std::path::Path;

use super::check::{Problem, ProblemKind, TopicProblem};
use crate::engine::groups::offsets::{scan_dir, GroupEntry, Loaded};
use crate::engine::keys::KeyError;
use crate::engine::producers::read_state;
use crate::engine::replication::network::{read_cluster_file, ClusterIdError, CLUSTER_FILE};
use crate::format::group::{group_file_name, GROUPS_DIR};
use crate::format::keys::KEYS_FILE;
use crate::format::producers::{JournalError, JOURNAL_FILE};

fn problem(kind: ProblemKind, path: &Path, position: Option<u64>, detail: String) -> TopicProblem {
    TopicProblem {
        topic: None,
        problem: Problem {
            kind,
            severity: kind.severity(),
            file: path.to_path_buf(),
            position,
            offset: None,
            detail,
            unreadable: None,
            behind: None,
        },
    }
}

/// The problem of the group file `path` that was read as `l`: a refused membership
/// (the offsets are good), if it has one.
pub fn group_membership_problem(path: &Path, l: &Loaded) -> Option<TopicProblem> {
    let p = l.membership_problem.as_ref()?;
    Some(problem(
        ProblemKind::GroupMembershipRefused,
        path,
        None,
        format!(
            "{p}; the broker loads the group's {} committed offset(s) without members, who rejoin (recover rewrites the file without the membership)",
            l.offsets.len()
        ),
    ))
}

/// The problem of one entry of `DATA/groups/` (`groups`), if it has one.
pub fn group_entry_problem(groups: &Path, e: &GroupEntry) -> Option<TopicProblem> {
    match e {
        GroupEntry::Group(g, l) => group_membership_problem(&groups.join(group_file_name(g)), l),
        GroupEntry::Leftover(name) => Some(problem(
            ProblemKind::LeftoverTempFile,
            &groups.join(name),
            None,
            "leftover temporary file of an atomic replace (recover removes it)".into(),
        )),
        GroupEntry::Problem(p) => Some(problem(
            ProblemKind::GroupFileUnreadable,
            &groups.join(p.file()),
            None,
            format!("{p}; the broker refuses this group until it is repaired"),
        )),
    }
}

/// Problems of the group files, the producer journal, the API keys and the cluster
/// id file of `data_dir`.
pub fn state_problems(data_dir: &Path) -> Vec<TopicProblem> {
    let mut out = Vec::new();
    // The broker does not start on either file when it does not read: serving
    // without the keys would let everyone in or lock everyone out, and a node must
    // not join a cluster it cannot tell is its own.
    if let Err(e) = crate::engine::keys::check_file(data_dir) {
        let detail = match e {
            KeyError::Unreadable { detail, .. } => detail,
            other => other.to_string(),
        };
        out.push(problem(
            ProblemKind::KeysJsonUnreadable,
            &data_dir.join(KEYS_FILE),
            None,
            format!("{KEYS_FILE} is unreadable: {detail}; the broker does not start until it is fixed or removed (removing it removes every API key)"),
        ));
    }
    if let Err(e) = read_cluster_file(data_dir) {
        let detail = match e {
            ClusterIdError::Bad { detail, .. } => detail,
            ClusterIdError::Io { source, .. } => source.to_string(),
        };
        out.push(problem(
            ProblemKind::ClusterJsonUnreadable,
            &data_dir.join(CLUSTER_FILE),
            None,
            format!("{CLUSTER_FILE} is unreadable: {detail}; the broker does not start until it is fixed: {{\"cluster_id\": the id in the other nodes' {CLUSTER_FILE}, \"node_id\": this node's id}}"),
        ));
    }
    let groups = data_dir.join(GROUPS_DIR);
    for e in scan_dir(&groups) {
        out.extend(group_entry_problem(&groups, &e));
    }
    let journal = data_dir.join(JOURNAL_FILE);
    match read_state(data_dir) {
        Err(e) => out.push(problem(
            ProblemKind::JournalCorrupt,
            &data_dir.join(e.file),
            None,
            e.to_string(),
        )),
        Ok((_, _, good, Some(JournalError::Torn { position }), true)) => out.push(problem(
            ProblemKind::JournalTornTail,
            &journal,
            Some(position),
            format!("the last entry is cut short; recover cuts the journal to {good} bytes"),
        )),
        Ok((_, _, good, Some(e), true)) => {
            let position = match &e {
                JournalError::BadLength { position, .. }
                | JournalError::Checksum { position, .. }
                | JournalError::BadField { position, .. }
                | JournalError::Torn { position } => Some(*position),
                _ => Some(0),
            };
            out.push(problem(
                ProblemKind::JournalCorrupt,
                &journal,
                position,
                format!("{e}; the entries from byte {good} on cannot be used"),
            ));
        }
        Ok(_) => {}
    }
    out
}

/// When a group's Raft state file (`dir/raft.json`) is missing while the replica holds
/// an entry of a term past 0 (in its Raft log, or its checkpoint's last applied
/// entry), that entry's index and term: such an entry came after a durable vote of
/// its term, so the vote was lost (the broker does not open the group then).
fn lost_vote(dir: &Path, checkpoint: &Path) -> Option<(u64, u64)> {
    use crate::engine::replication::log_store::key::decode_entry_key;
    use crate::engine::replication::log_store::meta::STATE_FILE;
    use crate::engine::replication::log_store::LOG_DIR;
    use crate::engine::replication::state_machine::read_checkpoint;
    use crate::engine::storage::reader::{read_header, scan_segment};

    if std::fs::symlink_metadata(dir.join(STATE_FILE)).is_ok() {
        return None;
    }
    let applied = read_checkpoint(checkpoint)
        .ok()
        .flatten()
        .and_then(|a| a.last_applied)
        .map(|l| (l.index, l.leader_id.term));
    // The Raft log's last entry: the newest segment that holds one.
    let mut segments: Vec<_> = std::fs::read_dir(dir.join(LOG_DIR))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "log"))
                .collect()
        })
        .unwrap_or_default();
    segments.sort();
    let mut last = None;
    for path in segments.iter().rev() {
        let Ok(file) = crate::engine::storage::noatime::open_read(path) else {
            continue;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            continue;
        };
        let Ok(Ok(header)) = read_header(&file, len) else {
            continue;
        };
        let _ = scan_segment(&file, &header, len, |_, r| {
            if let Ok(key) = decode_entry_key(r.key) {
                last = Some((r.offset, key.term));
            }
        });
        if last.is_some() {
            break;
        }
    }
    [last, applied]
        .into_iter()
        .flatten()
        .filter(|&(_, term)| term > 0)
        .max_by_key(|&(index, term)| (term, index))
}

/// Problems of a replicated topic's Raft files (none for a topic without
/// `replication.json`): its placement, each partition's checkpoint
/// (`applied-P.json`) and, when `topic_dir` is in a data directory, each Raft log's
/// state (`DATA/raft/T/P/raft.json`). The node cannot open the topic's Raft groups
/// while its placement does not read, nor a partition's group while that partition's
/// checkpoint or state file does not (or the state file is missing while the replica
/// holds entries of a term past 0: its vote is lost), so it does not serve them (its
/// peers go on). A checkpoint missing while the Raft log is purged is reported too
/// (information: the node takes a peer's at its start).
pub fn replication_problems(topic_dir: &Path, topic: &str, partitions: u32) -> Vec<TopicProblem> {
    use crate::engine::producers::read_state_file;
    use crate::engine::replication::log_store::meta::{
        read_state, RaftState as RaftStateOf, StateFileError, STATE_FILE, STATE_FILE_BYTES_MAX,
    };
    use crate::engine::replication::state_machine::{checkpoint_name, read_checkpoint};
    use crate::engine::replication::types::Vote;
    use crate::engine::storage::layout::RAFT_DIR;
    use crate::format::replication::{Replication, REPLICATION_FILE, REPLICATION_FILE_BYTES_MAX};

    let mut out = Vec::new();
    // `partition`: the file is one partition's (its group alone stays closed), else
    // the topic's.
    let mut push = |path: &Path, partition: Option<u32>, detail: String| {
        let what = match partition {
            Some(p) => format!("partition {p}'s Raft group, and does not serve that partition"),
            None => "the topic's Raft groups, and does not serve the topic".to_string(),
        };
        let mut p = problem(
            ProblemKind::RaftStateUnreadable,
            path,
            None,
            format!("{detail}; this node cannot open {what}, until it is fixed (its peers go on without it; a node started on an empty data directory gets its replicated topics back from its peers, and only those)"),
        );
        p.topic = Some(topic.to_string());
        out.push(p);
    };
    let placement = topic_dir.join(REPLICATION_FILE);
    match read_state_file(&placement, REPLICATION_FILE_BYTES_MAX) {
        Ok(None) => return out,
        Ok(Some(bytes)) => {
            if let Err(e) = Replication::decode(&bytes, partitions) {
                let detail = e.to_string();
                let detail = detail
                    .strip_prefix(&format!("{REPLICATION_FILE}: "))
                    .unwrap_or(&detail)
                    .to_string();
                push(&placement, None, detail);
            }
        }
        Err(e) => push(&placement, None, e),
    }
    let raft = topic_dir
        .parent()
        .and_then(Path::parent)
        .map(|data| data.join(RAFT_DIR).join(topic));
    let mut missing = Vec::new();
    for p in 0..partitions {
        let checkpoint = topic_dir.join(checkpoint_name(p));
        if let Err(e) = read_checkpoint(&checkpoint) {
            push(&checkpoint, Some(p), e);
        }
        let Some(dir) = raft.as_ref().map(|r| r.join(p.to_string())) else {
            continue;
        };
        let state = read_state::<Vote>(&dir);
        if let (
            Ok(None),
            Ok(RaftStateOf {
                purged: Some(purged),
                ..
            }),
        ) = (read_checkpoint(&checkpoint), &state)
        {
            let mut pr = problem(
                ProblemKind::AppliedCheckpointMissing,
                &checkpoint,
                None,
                format!(
                    "the checkpoint is missing while the partition's Raft log is purged up to \
                     entry {}: the node cannot apply the log from its start, so at its start it \
                     takes a peer's checkpoint in place of this one (at or past that entry) \
                     before its replica takes part in the group",
                    purged.index
                ),
            );
            pr.topic = Some(topic.to_string());
            missing.push(pr);
        }
        if let Some((index, term)) = lost_vote(&dir, &checkpoint) {
            push(
                &dir.join(STATE_FILE),
                Some(p),
                format!(
                    "missing, while this replica holds entry {index} of term {term}: its vote \
                     is lost, and a node that forgot its vote could vote twice in one term"
                ),
            );
        }
        if let Err(e) = state {
            let detail = match e {
                StateFileError::Bad { detail, .. } => detail,
                StateFileError::TooLarge { len, .. } => {
                    format!("{len} bytes, over the limit of {STATE_FILE_BYTES_MAX}")
                }
                other => other.to_string(),
            };
            push(&dir.join(STATE_FILE), Some(p), detail);
        }
    }
    out.extend(missing);
    out
}
