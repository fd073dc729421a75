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
