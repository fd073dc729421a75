//! Snapshots of a replicated partition. The data partition `DATA/topics/T/P` is the
//! state machine, so a snapshot is that state at an applied log id: the checkpoint's
//! content ([`Applied`]: last applied log id, membership, next offset, idempotent
//! producers' state) plus the data partition's records below its `next_offset`.
//! Building one writes the checkpoint and copies nothing: the records are read from
//! the partition's segments when the snapshot is sent.
//!
//! Sending (the leader, [`super::network`]): `SnapshotBegin` asks where the
//! follower's data partition ends; `SnapshotChunk`s carry the records from there (or
//! from the leader's first retained offset, when its retention removed older ones)
//! up to `next_offset`, in offset order, one call at a time; `SnapshotInstall`
//! carries the checkpoint content and the leader's vote, and the follower installs.
//!
//! Receiving (the follower): chunks are staged in
//! `DATA/raft/<topic>/<partition>/snapshot.part` ([`STAGING_FILE`], JSON Lines, one
//! chunk a line), never written to the data partition on arrival: only the state
//! machine's worker writes the data partition, so an install is serialised with
//! apply ([`install_staged`]).
//!
//! Invariants:
//! - Records the follower already holds at the snapshot's offsets are the leader's
//!   (Raft's log matching, and a deterministic apply): they are kept, and only the
//!   missing suffix is appended, each record at its own offset.
//! - A snapshot never removes a record retention would keep: the Raft log's purge
//!   never touches the data partition, and an install removes follower records only
//!   below the leader's first retained offset (its retention already removed them).
//! - Every line read back from the staging file is checked against
//!   [`STAGED_LINE_BYTES_MAX`] before it is parsed.

use std::io::{self, BufRead as _, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::state_machine::Applied;
use super::types::{EntryRecord, LogId, TypeConfig, Vote};
use crate::engine::broker::{Broker, NewRecord};
use crate::engine::storage::io::{Storage, StorageFile};
use crate::format::decode_record;
use crate::format::wire::FRAME_BYTES_MAX;

/// The staging file's name in a group's Raft directory (beside `log/` and
/// `raft.json`).
pub const STAGING_FILE: &str = "snapshot.part";
/// Longest line read back from the staging file (a chunk arrives in one frame).
pub const STAGED_LINE_BYTES_MAX: u64 = FRAME_BYTES_MAX as u64;
/// Record bytes a leader reads for one chunk (a single larger record still goes
/// whole).
pub const CHUNK_BYTES_MAX: u32 = 1 << 20;

/// openraft's metadata of a snapshot of this configuration.
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot of this configuration.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, PartitionSnapshot>;

/// A snapshot's data: the checkpoint content, and where its records are.
#[derive(Debug)]
pub struct PartitionSnapshot {
    pub applied: Applied,
    pub source: SnapshotSource,
}

/// Where a snapshot's records are read from.
pub enum SnapshotSource {
    /// This node's own data partition (a snapshot built or installed here).
    Local {
        broker: Arc<Broker>,
        topic: String,
        partition: u32,
    },
    /// Records received from a leader, staged in `path`, not installed yet; the
    /// leader sent from `first_offset`.
    Staged { path: PathBuf, first_offset: u64 },
}

impl std::fmt::Debug for SnapshotSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotSource::Local {
                topic, partition, ..
            } => write!(f, "Local({topic}/{partition})"),
            SnapshotSource::Staged { path, first_offset } => {
                write!(f, "Staged({}, from {first_offset})", path.display())
            }
        }
    }
}

/// The snapshot metadata of a checkpoint.
pub fn meta_of(applied: &Applied) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: applied.last_applied,
        last_membership: applied.membership.clone(),
    }
}

/// `SnapshotBegin`'s payload.
#[derive(Debug, Serialize, Deserialize)]
pub struct BeginRequest {
    /// Names this transfer in its chunks and its install.
    pub transfer: u64,
    pub last_log_id: Option<LogId>,
}

/// `SnapshotBegin`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct BeginResponse {
    /// Where the follower's data partition ends (its next offset).
    pub data_end: u64,
}

/// `SnapshotChunk`'s payload: records with their offsets, in offset order.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChunkRequest {
    pub transfer: u64,
    pub records: Vec<(u64, EntryRecord)>,
}

/// `SnapshotInstall`'s payload.
#[derive(Debug, Serialize, Deserialize)]
pub struct InstallRequest {
    pub transfer: u64,
    pub vote: Vote,
    pub applied: Applied,
    /// The offset the leader's records start at (the follower's data end, or the
    /// leader's first retained offset when that is later).
    pub first_offset: u64,
}

/// Why a snapshot cannot be staged or installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("snapshot transfer {got} is not the one in progress ({expected:?})")]
    OtherTransfer { got: u64, expected: Option<u64> },
    #[error("snapshot record at offset {offset} after offset {after}: out of order")]
    OutOfOrder { offset: u64, after: u64 },
    #[error("{path}: a staged line of more than {STAGED_LINE_BYTES_MAX} bytes")]
    LineTooLong { path: PathBuf },
    #[error("{path}: a bad staged line: {detail}")]
    BadLine { path: PathBuf, detail: String },
    #[error(
        "{topic}/{partition}: snapshot record at offset {offset} where {expected} is next (a gap)"
    )]
    Gap {
        topic: String,
        partition: u32,
        offset: u64,
        expected: u64,
    },
    #[error(
        "{topic}/{partition}: the snapshot's records end at {end}, not at its next offset {next}"
    )]
    Short {
        topic: String,
        partition: u32,
        end: u64,
        next: u64,
    },
    #[error("{topic}/{partition}: {detail}")]
    Engine {
        topic: String,
        partition: u32,
        detail: String,
    },
}

impl From<SnapshotError> for io::Error {
    fn from(e: SnapshotError) -> Self {
        io::Error::other(e.to_string())
    }
}

/// A snapshot being received: its chunks appended to the staging file.
pub struct Staging {
    transfer: u64,
    path: PathBuf,
    file: Box<dyn StorageFile>,
    written: u64,
    /// Records must come at or past this offset.
    next_offset: u64,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("transfer", &self.transfer)
            .field("path", &self.path)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl Staging {
    /// Starts a transfer in `dir`: any staging file left (by an earlier transfer, or
    /// a crash) is replaced by an empty one. The file is not fsynced: a crash
    /// discards the transfer, and the leader sends again.
    pub fn begin(storage: &dyn Storage, dir: &Path, transfer: u64) -> Result<Self, SnapshotError> {
        let path = dir.join(STAGING_FILE);
        let io = |source| SnapshotError::Io {
            path: path.clone(),
            source,
        };
        storage.create_dir_all(dir).map_err(io)?;
        match storage.remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = storage.create(&path).map_err(io)?;
        Ok(Staging {
            transfer,
            path,
            file,
            written: 0,
            next_offset: 0,
        })
    }

    /// The transfer this staging belongs to.
    pub fn transfer(&self) -> u64 {
        self.transfer
    }

    /// The staging file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stages one chunk (its records in offset order, after every earlier chunk's).
    pub fn push(&mut self, records: &[(u64, EntryRecord)]) -> Result<(), SnapshotError> {
        let mut next = self.next_offset;
        for (offset, _) in records {
            if *offset < next {
                return Err(SnapshotError::OutOfOrder {
                    offset: *offset,
                    after: next.saturating_sub(1),
                });
            }
            next = offset.saturating_add(1);
        }
        if records.is_empty() {
            return Ok(());
        }
        let mut line = serde_json::to_vec(records).map_err(|e| SnapshotError::BadLine {
            path: self.path.clone(),
            detail: e.to_string(),
        })?;
        line.push(b'\n');
        if line.len() as u64 > STAGED_LINE_BYTES_MAX {
            return Err(SnapshotError::LineTooLong {
                path: self.path.clone(),
            });
        }
        self.file
            .write_at(&line, self.written)
            .map_err(|source| SnapshotError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.written += line.len() as u64;
        self.next_offset = next;
        Ok(())
    }
}

/// `io::Read` over a storage file, from its start.
struct FileReader {
    file: Box<dyn StorageFile>,
    at: u64,
}

impl io::Read for FileReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Reads the staged chunks back, one line at a time, each checked against
/// [`STAGED_LINE_BYTES_MAX`] before it is parsed.
struct StagedReader {
    path: PathBuf,
    reader: io::BufReader<FileReader>,
}

impl StagedReader {
    fn open(storage: &dyn Storage, path: &Path) -> Result<Self, SnapshotError> {
        let file = storage.open(path).map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(StagedReader {
            path: path.to_path_buf(),
            reader: io::BufReader::with_capacity(1 << 20, FileReader { file, at: 0 }),
        })
    }

    fn next_chunk(&mut self) -> Result<Option<Vec<(u64, EntryRecord)>>, SnapshotError> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(STAGED_LINE_BYTES_MAX + 1)
            .read_until(b'\n', &mut line)
            .map_err(|source| SnapshotError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        if n as u64 > STAGED_LINE_BYTES_MAX {
            return Err(SnapshotError::LineTooLong {
                path: self.path.clone(),
            });
        }
        if line.pop() != Some(b'\n') {
            return Err(SnapshotError::BadLine {
                path: self.path.clone(),
                detail: "a torn last line".into(),
            });
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| SnapshotError::BadLine {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }
}

/// Brings the data partition to the snapshot's records (steps 1-4 of the install;
/// the caller then writes the checkpoint, step 5, and removes the staging file,
/// step 6). The ordering, and what a crash at each point leaves:
/// 1. if the data partition ends past the snapshot's `next_offset`, cut it there
///    (durable before it returns). The partition holds applied, so committed,
///    records only, and openraft installs a snapshot only past the locally committed
///    index: this removes nothing Raft's rules keep.
/// 2. if it ends before `first_offset` (the leader's retention removed the records
///    between), restart it empty at `first_offset` (durable); its records were all
///    below the leader's first retained offset;
/// 3. append the staged records at and past the partition's end, in order, each at
///    its own offset (a gap is an error: nothing is invented);
/// 4. fsync the data partition.
///
/// A crash before step 5 leaves the old checkpoint over a data partition that may
/// hold records past its `next_offset`: records of committed entries, at their own
/// offsets, the same bytes re-applying those entries writes, which apply already
/// meets after any crash (it appends only what lies past the partition's end). That
/// is the old state; the leader sends the snapshot again and the install resumes from
/// the partition's end. A crash after step 5 leaves the new state (the leftover
/// staging file is replaced by the next transfer).
pub fn install_staged(
    broker: &Broker,
    topic: &str,
    partition: u32,
    applied: &Applied,
    path: &Path,
    first_offset: u64,
) -> Result<(), SnapshotError> {
    let engine = |e: crate::engine::error::EngineError| SnapshotError::Engine {
        topic: topic.to_string(),
        partition,
        detail: e.to_string(),
    };
    let next = applied.next_offset;
    let mut end = broker.written_end(topic, partition).map_err(engine)?;
    // 1.
    if end > next {
        tracing::warn!(
            topic,
            partition,
            end,
            next,
            "the data partition ends past the snapshot being installed: cutting it"
        );
        broker
            .cut_applied_tail(topic, partition, next)
            .map_err(engine)?;
        end = next;
    }
    // 2.
    if end < first_offset && first_offset <= next {
        broker
            .restart_applied_at(topic, partition, first_offset)
            .map_err(engine)?;
        end = first_offset;
    }
    // 3.
    let mut reader = StagedReader::open(&**broker.storage(), path)?;
    while let Some(chunk) = reader.next_chunk()? {
        let mut fresh: Vec<&EntryRecord> = Vec::new();
        for (offset, r) in &chunk {
            if *offset < end || *offset >= next {
                continue;
            }
            let expected = end + fresh.len() as u64;
            if *offset != expected {
                return Err(SnapshotError::Gap {
                    topic: topic.to_string(),
                    partition,
                    offset: *offset,
                    expected,
                });
            }
            fresh.push(r);
        }
        if fresh.is_empty() {
            continue;
        }
        let records: Vec<NewRecord<'_>> = fresh
            .iter()
            .map(|r| NewRecord {
                key: r.key.as_deref(),
                value: &r.value,
                timestamp_ms: r.timestamp_ms,
            })
            .collect();
        let (p, _wait) = broker
            .append_applied(topic, partition, &records)
            .map_err(engine)?;
        if p.base_offset != end {
            return Err(SnapshotError::Gap {
                topic: topic.to_string(),
                partition,
                offset: p.base_offset,
                expected: end,
            });
        }
        end += records.len() as u64;
    }
    if end != next {
        return Err(SnapshotError::Short {
            topic: topic.to_string(),
            partition,
            end,
            next,
        });
    }
    // 4.
    broker.flush_partition(topic, partition).map_err(engine)
}

/// Reads the leader's records for one chunk: from `from` (the first at or past it)
/// up to `to` (exclusive), about [`CHUNK_BYTES_MAX`] of them.
pub fn read_chunk(
    broker: &Broker,
    topic: &str,
    partition: u32,
    from: u64,
    to: u64,
) -> Result<Vec<(u64, EntryRecord)>, SnapshotError> {
    let engine = |detail: String| SnapshotError::Engine {
        topic: topic.to_string(),
        partition,
        detail,
    };
    let got = broker
        .fetch(topic, partition, from, CHUNK_BYTES_MAX, Duration::ZERO)
        .map_err(|e| engine(e.to_string()))?;
    let mut out = Vec::new();
    for chunk in &got.chunks {
        let mut rest = chunk.bytes.as_slice();
        while !rest.is_empty() {
            let r = decode_record(rest, 0, chunk.generation).map_err(|e| engine(e.to_string()))?;
            rest = rest.get(r.encoded_len..).unwrap_or_default();
            if r.offset >= to {
                return Ok(out);
            }
            if r.offset < from {
                continue;
            }
            out.push((
                r.offset,
                EntryRecord {
                    timestamp_ms: r.timestamp_ms,
                    key: r.key.map(<[u8]>::to_vec),
                    value: r.value.to_vec(),
                },
            ));
        }
    }
    if out.is_empty() && from < to {
        return Err(engine(format!(
            "no record at or past offset {from} below the snapshot's next offset {to}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use openraft::storage::RaftStateMachine as _;

    use super::*;
    use crate::engine::broker::BrokerOptions;
    use crate::engine::replication::state_machine::{checkpoint_name, PartitionStateMachine};
    use crate::engine::storage::io::{RealStorage, StorageRef};
    use crate::format::replication::{Replication, REPLICATION_FILE};
    use crate::format::topic::TopicConfig;
    use crate::testkit::storage::HookStorage;

    const TOPIC: &str = "t";
    /// Records the leader holds; the snapshot covers them all.
    const LEADER_RECORDS: u64 = 300;
    /// Records the lagging follower holds already.
    const FOLLOWER_RECORDS: u64 = 120;

    fn open(dir: &Path, storage: StorageRef) -> Arc<Broker> {
        let b = Broker::open(dir, storage, BrokerOptions::default()).unwrap();
        if !b.list_topics().iter().any(|t| t == TOPIC) {
            let r = Replication::place(&[1, 2, 3], 1, 3).unwrap().encode();
            b.create_topic_with(
                TOPIC,
                1,
                TopicConfig::default(),
                Some((REPLICATION_FILE, &r)),
            )
            .unwrap();
        }
        b
    }

    fn record(i: u64) -> EntryRecord {
        EntryRecord {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: (i % 3 == 0).then(|| format!("k{i}").into_bytes()),
            value: format!("value {i} {}", "x".repeat((i % 50) as usize)).into_bytes(),
        }
    }

    /// Appends records `from..to` (as apply would).
    fn fill(b: &Broker, from: u64, to: u64) {
        let rs: Vec<EntryRecord> = (from..to).map(record).collect();
        for chunk in rs.chunks(7) {
            let nr: Vec<NewRecord<'_>> = chunk
                .iter()
                .map(|r| NewRecord {
                    key: r.key.as_deref(),
                    value: &r.value,
                    timestamp_ms: r.timestamp_ms,
                })
                .collect();
            b.append_applied(TOPIC, 0, &nr).unwrap();
        }
        b.flush_partition(TOPIC, 0).unwrap();
    }

    /// Every record of the partition, with its offset.
    fn records(b: &Broker) -> Vec<(u64, EntryRecord)> {
        let end = b.written_end(TOPIC, 0).unwrap();
        let (start, _) = b.offsets(TOPIC, 0).unwrap();
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let got = read_chunk(b, TOPIC, 0, at, end).unwrap();
            at = got.last().unwrap().0 + 1;
            out.extend(got);
        }
        out
    }

    fn snapshot_applied() -> Applied {
        let id: LogId =
            serde_json::from_str(r#"{"leader_id":{"term":2,"node_id":1},"index":77}"#).unwrap();
        Applied {
            last_applied: Some(id),
            next_offset: LEADER_RECORDS,
            ..Applied::default()
        }
    }

    /// Stages what a leader sends a follower whose data ends at `data_end`.
    fn stage(leader: &Broker, follower: &Broker, dir: &Path) -> (PathBuf, u64) {
        let data_end = follower.written_end(TOPIC, 0).unwrap();
        let (start, _) = leader.offsets(TOPIC, 0).unwrap();
        let first = data_end.max(start).min(LEADER_RECORDS);
        let mut s = Staging::begin(&**follower.storage(), dir, 9).unwrap();
        let mut at = first;
        while at < LEADER_RECORDS {
            let chunk = read_chunk(leader, TOPIC, 0, at, LEADER_RECORDS).unwrap();
            at = chunk.last().unwrap().0 + 1;
            // Small chunks, so that the install reads several lines.
            for part in chunk.chunks(25) {
                s.push(part).unwrap();
            }
        }
        (s.path().to_path_buf(), first)
    }

    fn checkpoint(dir: &Path) -> Option<Applied> {
        let bytes = std::fs::read(dir.join("topics").join(TOPIC).join(checkpoint_name(0))).ok()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }

    async fn install(
        follower: &Arc<Broker>,
        path: PathBuf,
        first_offset: u64,
    ) -> io::Result<PartitionStateMachine> {
        let mut sm = PartitionStateMachine::open(Arc::clone(follower), TOPIC, 0)?;
        let applied = snapshot_applied();
        let meta = meta_of(&applied);
        let data = PartitionSnapshot {
            applied,
            source: SnapshotSource::Staged { path, first_offset },
        };
        sm.install_snapshot(&meta, data).await?;
        Ok(sm)
    }

    fn leader(root: &Path) -> Arc<Broker> {
        let leader = open(&root.join("leader"), Arc::new(RealStorage));
        fill(&leader, 0, LEADER_RECORDS);
        leader
    }

    #[tokio::test]
    async fn a_snapshot_round_trips_to_a_lagging_follower() {
        let root = tempfile::tempdir().unwrap();
        let leader = leader(root.path());
        let fdir = root.path().join("follower");
        let follower = open(&fdir, Arc::new(RealStorage));
        fill(&follower, 0, FOLLOWER_RECORDS);
        let (path, first) = stage(&leader, &follower, &fdir.join("raft"));
        assert_eq!(first, FOLLOWER_RECORDS, "only the missing suffix is sent");
        let mut sm = install(&follower, path.clone(), first).await.unwrap();
        assert_eq!(records(&follower), records(&leader));
        assert_eq!(sm.applied().next_offset, LEADER_RECORDS);
        assert_eq!(
            checkpoint(&fdir).unwrap().last_applied,
            snapshot_applied().last_applied
        );
        assert!(!path.exists(), "the staging file is removed");
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, meta_of(&snapshot_applied()));
        assert!(matches!(
            current.snapshot.source,
            SnapshotSource::Local { .. }
        ));
    }

    #[tokio::test]
    async fn a_follower_below_the_leaders_retention_starts_at_the_leaders_start() {
        let root = tempfile::tempdir().unwrap();
        // A leader whose retention removed every record below 200.
        let leader_dir = root.path().join("leader");
        let l2 = open(&leader_dir, Arc::new(RealStorage));
        l2.restart_applied_at(TOPIC, 0, 200).unwrap();
        fill(&l2, 200, LEADER_RECORDS);
        let fdir = root.path().join("follower");
        let follower = open(&fdir, Arc::new(RealStorage));
        fill(&follower, 0, FOLLOWER_RECORDS);
        let (path, first) = stage(&l2, &follower, &fdir.join("raft"));
        assert_eq!(first, 200);
        install(&follower, path, first).await.unwrap();
        assert_eq!(follower.offsets(TOPIC, 0).unwrap(), (200, LEADER_RECORDS));
        assert_eq!(records(&follower), records(&l2));
    }

    #[tokio::test]
    async fn staged_records_out_of_order_or_with_a_gap_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let fdir = root.path().join("follower");
        let follower = open(&fdir, Arc::new(RealStorage));
        let mut s = Staging::begin(&**follower.storage(), &fdir, 1).unwrap();
        s.push(&[(5, record(5))]).unwrap();
        assert!(matches!(
            s.push(&[(4, record(4))]),
            Err(SnapshotError::OutOfOrder { offset: 4, .. })
        ));
        // A gap: offset 5 where 0 is next.
        let path = s.path().to_path_buf();
        let e = install(&follower, path.clone(), 0).await.unwrap_err();
        assert!(e.to_string().contains("a gap"), "{e}");
        assert_eq!(follower.written_end(TOPIC, 0).unwrap(), 0);
        assert_eq!(checkpoint(&fdir).map(|a| a.next_offset), None);
        // A torn line is refused, not parsed.
        std::fs::write(&path, b"[[0,{\"timestamp_ms\":1").unwrap();
        let e = install(&follower, path, 0).await.unwrap_err();
        assert!(e.to_string().contains("torn"), "{e}");
    }

    /// The install interrupted at every storage call it makes (the call fails, and
    /// every later one: the process is as good as crashed) leaves the old state or
    /// the new one: the checkpoint is the old or the snapshot's, and the data
    /// partition is the old records plus a prefix of the leader's missing ones; a
    /// second install then completes.
    #[tokio::test]
    async fn an_install_interrupted_at_each_step_leaves_the_old_or_the_new_state() {
        let root = tempfile::tempdir().unwrap();
        let leader = leader(root.path());
        let want = records(&leader);
        let mut fail_at = 1;
        loop {
            let fdir = root.path().join(format!("follower-{fail_at}"));
            let armed = Arc::new(AtomicU64::new(u64::MAX));
            let calls = Arc::new(AtomicU64::new(0));
            let (a, c) = (Arc::clone(&armed), Arc::clone(&calls));
            let storage: StorageRef =
                Arc::new(HookStorage::from_fn(Arc::new(RealStorage), move |_op| {
                    if a.load(Ordering::SeqCst) == u64::MAX {
                        return None;
                    }
                    let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                    (n >= a.load(Ordering::SeqCst))
                        .then(|| Err(io::Error::other("injected failure")))
                }));
            let follower = open(&fdir, storage);
            fill(&follower, 0, FOLLOWER_RECORDS);
            let (path, first) = stage(&leader, &follower, &fdir.join("raft"));
            armed.store(fail_at, Ordering::SeqCst);
            let done = install(&follower, path, first).await;
            let done = match done {
                Ok(sm) => {
                    drop(sm);
                    true
                }
                Err(_) => false,
            };
            follower.shutdown().ok();
            drop(follower);

            // After the "crash": reopen on real storage (recovery runs) and look.
            let follower = open(&fdir, Arc::new(RealStorage));
            let held = records(&follower);
            let cp = checkpoint(&fdir);
            let next = cp.as_ref().map_or(0, |a| a.next_offset);
            let new = cp.as_ref().and_then(|a| a.last_applied) == snapshot_applied().last_applied;
            assert!(
                new || cp.as_ref().is_none_or(|a| a.last_applied.is_none()),
                "fail at {fail_at}: a checkpoint neither old nor new: {cp:?}"
            );
            assert!(
                held.len() as u64 >= FOLLOWER_RECORDS,
                "fail at {fail_at}: old records lost ({} left)",
                held.len()
            );
            assert_eq!(
                held[..],
                want[..held.len()],
                "fail at {fail_at}: records that are not the leader's"
            );
            if new {
                assert_eq!(next, LEADER_RECORDS, "fail at {fail_at}");
                assert_eq!(held, want, "fail at {fail_at}: new checkpoint, old records");
            }
            if done {
                assert!(new);
                break;
            }
            // The leader sends again; the install completes from where it stopped.
            let (path, first) = stage(&leader, &follower, &fdir.join("raft"));
            install(&follower, path, first).await.unwrap();
            assert_eq!(records(&follower), want, "fail at {fail_at}: after a retry");
            fail_at += 1;
            assert!(fail_at < 500, "the install never completed");
        }
        assert!(fail_at > 3, "the install made only {fail_at} storage calls");
    }
}
