//! The Raft log against openraft's storage conformance suite, plus the group commit,
//! restart and limit checks of this store.

use std::io;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftLogStorage};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, StorageError, StoredMembership};

use super::*;
use openraft::type_config::TypeConfigExt;

type LogIdOf<C> = openraft::LogId<
    <<C as openraft::RaftTypeConfig>::LeaderId as openraft::vote::RaftLeaderId>::Committed,
>;
type StoredMembershipOf<C> =
    StoredMembership<StoredLeaderId, u64, <C as openraft::RaftTypeConfig>::Node>;
type SnapshotMetaOf<C> = SnapshotMeta<StoredLeaderId, u64, <C as openraft::RaftTypeConfig>::Node>;
type SnapshotOf<C, SD> = Snapshot<StoredLeaderId, u64, <C as openraft::RaftTypeConfig>::Node, SD>;
use crate::engine::partition::LogStats;
use crate::engine::storage::io::{RealStorage, StorageRef};

/// A test payload: a byte string, stored as itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl EntryCodec for Bytes {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0);
    }
    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError> {
        Ok(Bytes(bytes.to_vec()))
    }
}

openraft::declare_raft_types!(
    pub TestConfig:
        D = Bytes,
        R = (),
);

/// The smallest state machine the suite needs: the applied log id, the last
/// membership and the applied payloads, in memory; a snapshot is their JSON.
#[derive(Default)]
struct MemMachine {
    applied: Option<LogIdOf<TestConfig>>,
    membership: StoredMembershipOf<TestConfig>,
    data: Vec<Vec<u8>>,
    current: Option<(SnapshotMetaOf<TestConfig>, Vec<u8>)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MemSnapshot {
    data: Vec<Vec<u8>>,
}

impl RaftSnapshotBuilder<TestConfig> for MemMachine {
    type SnapshotData = io::Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TestConfig, Self::SnapshotData>, io::Error> {
        let bytes = serde_json::to_vec(&MemSnapshot {
            data: self.data.clone(),
        })
        .map_err(io::Error::other)?;
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        };
        self.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: io::Cursor::new(bytes),
        })
    }
}

impl RaftStateMachine<TestConfig> for MemMachine {
    type SnapshotData = io::Cursor<Vec<u8>>;
    type SnapshotBuilder = MemMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TestConfig>>, StoredMembershipOf<TestConfig>), io::Error> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TestConfig>, io::Error>> + Unpin + Send,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            self.applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(d) => self.data.push(d.0),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        MemMachine {
            applied: self.applied,
            membership: self.membership.clone(),
            data: self.data.clone(),
            current: None,
        }
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Self::SnapshotBuilder> {
        // The builder records the snapshot it builds in `self` too.
        let bytes = serde_json::to_vec(&MemSnapshot {
            data: self.data.clone(),
        })
        .ok()?;
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        };
        self.current = Some((meta, bytes));
        Some(self.get_snapshot_builder().await)
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TestConfig>,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let bytes = snapshot.into_inner();
        let snap: MemSnapshot = serde_json::from_slice(&bytes).map_err(io::Error::other)?;
        self.data = snap.data;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.current = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TestConfig, Self::SnapshotData>>, io::Error> {
        Ok(self.current.clone().map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: io::Cursor::new(bytes),
        }))
    }
}

/// Builds each suite case a fresh log in its own temporary directory.
struct Builder;

impl StoreBuilder<TestConfig, RaftLog<TestConfig>, MemMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, RaftLog<TestConfig>, MemMachine), StorageError<TestConfig>>
    {
        let dir = tempfile::tempdir().map_err(|e| {
            StorageError::from_io_error(openraft::ErrorSubject::Store, openraft::ErrorVerb::Read, e)
        })?;
        let log = open_log(&dir.path().join("raft").join("t").join("0"));
        Ok((dir, log, MemMachine::default()))
    }
}

fn open_log(dir: &std::path::Path) -> RaftLog<TestConfig> {
    let storage: StorageRef = Arc::new(RealStorage);
    RaftLog::open(dir, storage, Arc::new(LogStats::default())).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn openraft_storage_conformance_suite() {
    runtime().block_on(async {
        Suite::test_all(Builder).await.unwrap();
    });
}

type TestEntry =
    openraft::Entry<StoredLeaderId, EntryPayload<Bytes, u64, openraft::impls::BasicNode>>;

fn normal(term: u64, index: u64) -> TestEntry {
    openraft::Entry {
        log_id: openraft::LogId::new(StoredLeaderId { term, node_id: 1 }, index),
        payload: EntryPayload::Normal(Bytes(format!("entry-{index}").into_bytes())),
    }
}

/// Appends `entries` and waits for openraft's flushed callback.
async fn append_flushed(log: &mut RaftLog<TestConfig>, entries: Vec<TestEntry>) {
    let (tx, rx) = TestConfig::oneshot();
    log.append(entries, openraft::storage::IOFlushed::signal(tx))
        .await
        .unwrap();
    rx.await.unwrap().unwrap();
}

async fn all_entries(log: &mut RaftLog<TestConfig>) -> Vec<TestEntry> {
    openraft::storage::RaftLogReader::try_get_log_entries(log, 0..)
        .await
        .unwrap()
}

/// Many appends queued before one flush completes share fsyncs: the callbacks all
/// fire, each after an fsync that covers its entries, with fewer fsyncs than appends.
#[test]
fn appends_share_group_commits_and_are_readable_before_the_flush() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(LogStats::default());
        // File syncs wait at a gate the test opens once every append is made, so the
        // batching does not depend on how fast this disk syncs.
        let gate = Arc::new((std::sync::Mutex::new(true), std::sync::Condvar::new()));
        let hook_gate = gate.clone();
        let storage: StorageRef = Arc::new(crate::testkit::storage::HookStorage::from_fn(
            Arc::new(RealStorage),
            move |op| {
                use crate::testkit::storage::OpKind;
                if matches!(op.kind(), OpKind::SyncData | OpKind::SyncAll) {
                    let (closed, cv) = &*hook_gate;
                    let mut c = closed.lock().unwrap();
                    while *c {
                        c = cv.wait(c).unwrap();
                    }
                }
                None
            },
        ));
        let mut log: RaftLog<TestConfig> = {
            // Opening syncs too: let it through.
            *gate.0.lock().unwrap() = false;
            let log = RaftLog::open(&dir.path().join("g"), storage, stats.clone()).unwrap();
            *gate.0.lock().unwrap() = true;
            log
        };
        let before = stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed);
        let mut waits = Vec::new();
        let appends = 200u64;
        for i in 0..appends {
            let (tx, rx) = TestConfig::oneshot();
            log.append(vec![normal(1, i)], openraft::storage::IOFlushed::signal(tx))
                .await
                .unwrap();
            // Readable as soon as append returns, flushed or not.
            let got = openraft::storage::RaftLogReader::try_get_log_entries(&mut log, i..=i)
                .await
                .unwrap();
            assert_eq!(got, vec![normal(1, i)]);
            waits.push(rx);
        }
        *gate.0.lock().unwrap() = false;
        gate.1.notify_all();
        for rx in waits {
            rx.await.unwrap().unwrap();
        }
        let fsyncs = stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(fsyncs >= 1);
        assert!(
            fsyncs <= 4,
            "{fsyncs} fsyncs for {appends} appends: no group commit"
        );
        assert_eq!(log.partition_log().durable_end(), appends);
        assert_eq!(all_entries(&mut log).await.len() as u64, appends);
    });
}

/// Entries that cannot follow the log are refused, and nothing is written.
#[test]
fn a_hole_or_an_overlap_is_refused() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open_log(&dir.path().join("g"));
        append_flushed(&mut log, vec![normal(1, 0), normal(1, 1)]).await;
        for bad in [
            vec![normal(1, 3)],
            vec![normal(1, 1)],
            vec![normal(1, 2), normal(1, 4)],
        ] {
            let (tx, _rx) = TestConfig::oneshot();
            let r = log
                .append(bad, openraft::storage::IOFlushed::signal(tx))
                .await;
            assert!(r.is_err());
        }
        assert_eq!(log.partition_log().written_end(), 2);
    });
}

/// The vote, committed id and purge point survive a restart; the log restarted past
/// a purge continues after it.
#[test]
fn state_and_purge_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("g");
    runtime().block_on(async {
        let mut log = open_log(&g);
        append_flushed(&mut log, (0..10).map(|i| normal(1, i)).collect()).await;
        log.save_vote(&openraft::Vote::new_committed(3, 2))
            .await
            .unwrap();
        log.save_committed(Some(normal(1, 6).log_id)).await.unwrap();
        log.purge(normal(1, 4).log_id).await.unwrap();
    });
    runtime().block_on(async {
        let mut log = open_log(&g);
        let st = openraft::storage::RaftLogStorage::get_log_state(&mut log)
            .await
            .unwrap();
        assert_eq!(st.last_purged_log_id, Some(normal(1, 4).log_id));
        assert_eq!(st.last_log_id, Some(normal(1, 9).log_id));
        assert_eq!(
            openraft::storage::RaftLogReader::read_vote(&mut log)
                .await
                .unwrap(),
            Some(openraft::Vote::new_committed(3, 2))
        );
        assert_eq!(
            log.read_committed().await.unwrap(),
            Some(normal(1, 6).log_id)
        );
        let got = all_entries(&mut log).await;
        assert_eq!(got, (5..10).map(|i| normal(1, i)).collect::<Vec<_>>());
        log.purge(normal(1, 30).log_id).await.unwrap();
    });
    runtime().block_on(async {
        let mut log = open_log(&g);
        assert!(all_entries(&mut log).await.is_empty());
        append_flushed(&mut log, vec![normal(2, 31)]).await;
        assert_eq!(all_entries(&mut log).await, vec![normal(2, 31)]);
    });
}

/// A state file longer than its limit is refused before it is read.
#[test]
fn an_oversized_state_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("g");
    drop(open_log(&g));
    let big = vec![b' '; meta::STATE_FILE_BYTES_MAX as usize + 1];
    std::fs::write(g.join(meta::STATE_FILE), big).unwrap();
    let r: Result<RaftLog<TestConfig>, _> =
        RaftLog::open(&g, Arc::new(RealStorage), Arc::new(LogStats::default()));
    assert!(matches!(
        r,
        Err(RaftLogError::State(meta::StateFileError::TooLarge { .. }))
    ));
}

/// Marker of the new vote in the crash trace (entry markers are flushed ends).
const VOTE_MARK: u64 = 1 << 40;

/// Entries appended and flushed, then a new vote: every crash state reopens with
/// every flushed entry (a prefix of what was written, nothing else) and the old or
/// the new vote (the new one once `save_vote` returned).
#[test]
fn every_crash_state_keeps_flushed_entries_and_an_old_or_new_vote() {
    use crate::testkit::sim::{crash_states, DirModel, Materialiser, Rng, SimStorage};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("data");
    let rel = std::path::Path::new("raft").join("t").join("0");
    let old_vote = openraft::Vote::new_committed(1, 1);
    let new_vote = openraft::Vote::new(2, 2);
    runtime().block_on(async {
        let mut log = open_log(&root.join(&rel));
        append_flushed(&mut log, (0..4).map(|i| normal(1, i)).collect()).await;
        log.save_vote(&old_vote).await.unwrap();
    });
    let sim = SimStorage::new(&root).unwrap();
    runtime().block_on(async {
        let mut log: RaftLog<TestConfig> = RaftLog::open(
            &root.join(&rel),
            Arc::new(sim.clone()),
            Arc::new(LogStats::default()),
        )
        .unwrap();
        for batch in [4..6u64, 6..7, 7..10] {
            let end = batch.end;
            append_flushed(&mut log, batch.map(|i| normal(1, i)).collect()).await;
            sim.mark(end);
        }
        log.save_vote(&new_vote).await.unwrap();
        sim.mark(VOTE_MARK);
    });
    let trace = sim.trace();
    let dur = trace.durability();
    let mut mat = Materialiser::new(&trace);
    let mut rng = Rng::new(23);
    let n = trace.ops.len();
    let mut states = 0;
    for k in 0..=n {
        let marks = trace.markers_before(k);
        let flushed = marks
            .iter()
            .filter(|m| **m < VOTE_MARK)
            .max()
            .copied()
            .unwrap_or(4);
        let voted = marks.contains(&VOTE_MARK);
        let pending = dur.pending(&trace, k);
        for model in [DirModel::InOrder, DirModel::AnyOrder] {
            for choices in crash_states(&trace, &pending, model, 128, 16, &mut rng) {
                let img = mat.image(&dur, k, &pending, &choices);
                let out = tempfile::tempdir().unwrap();
                img.write_to(out.path()).unwrap();
                let what = format!("crash point {k}/{n} {model:?} {choices:?}");
                runtime().block_on(async {
                    let mut log = open_log(&out.path().join(&rel));
                    let got = all_entries(&mut log).await;
                    let want: Vec<TestEntry> =
                        (0..got.len() as u64).map(|i| normal(1, i)).collect();
                    assert_eq!(got, want, "{what}: not a prefix of what was written");
                    assert!(
                        got.len() as u64 >= flushed,
                        "{what}: a flushed entry is lost"
                    );
                    assert!(got.len() <= 10, "{what}");
                    let vote = openraft::storage::RaftLogReader::read_vote(&mut log)
                        .await
                        .unwrap();
                    assert!(
                        vote == Some(old_vote) || vote == Some(new_vote),
                        "{what}: vote {vote:?}"
                    );
                    if voted {
                        assert_eq!(vote, Some(new_vote), "{what}: save_vote returned");
                    }
                });
                states += 1;
            }
        }
    }
    assert!(states > n);
}

/// A purge hands the whole segments it removes to the node's spare pool while the
/// pool has room, as retention does: no block is freed (on a file system mounted
/// with `discard`, freed blocks are discarded in the journal commit every fsync
/// waits for), and what the pool cannot take is deleted. The log reads on after
/// the purge point, across a restart too.
#[test]
fn a_purge_hands_whole_segments_to_the_spare_pool() {
    let data = tempfile::tempdir().unwrap();
    let spares = data.path().join(crate::format::names::SPARES_DIR);
    std::fs::create_dir_all(&spares).unwrap();
    let stats = Arc::new(LogStats::default());
    // Room for 2 spares.
    stats.spares.configure(data.path(), 2);
    stats.spares.set_partitions(1);
    let g = data.path().join("raft").join("t").join("0");
    let config = crate::format::topic::TopicConfig {
        segment_bytes: 400,
        ..raft_log_config()
    };
    let open = |stats: Arc<LogStats>| {
        RaftLog::<TestConfig>::open_with(&g, Arc::new(RealStorage), stats, config.clone()).unwrap()
    };
    let spare_names = || {
        let mut v: Vec<String> = std::fs::read_dir(&spares)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    runtime().block_on(async {
        let mut log = open(stats.clone());
        for i in 0..40 {
            append_flushed(&mut log, vec![normal(1, i)]).await;
        }
        let before = log.partition_log().snapshot().len();
        assert!(before >= 6, "{before} segments");
        log.purge(normal(1, 29).log_id).await.unwrap();
        let after = log.partition_log().snapshot();
        let removed = before - after.len();
        assert!(removed >= 3, "{removed} segments purged");
        // Two became spares (the pool's room), the others were deleted.
        assert_eq!(stats.spares.len(), 2);
        assert_eq!(spare_names().len(), 2, "{:?}", spare_names());
        let on_disk = std::fs::read_dir(g.join(super::LOG_DIR))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "log")
            })
            .count();
        assert_eq!(on_disk, after.len());
        let kept = |got: &[TestEntry]| {
            got.iter()
                .filter(|e| e.log_id.index >= 30)
                .cloned()
                .collect::<Vec<_>>()
        };
        let want: Vec<TestEntry> = (30..40).map(|i| normal(1, i)).collect();
        assert_eq!(kept(&all_entries(&mut log).await), want);
    });
    // A restart (the spares are re-stamped by the broker, not read by the log)
    // reads the same entries after the purge point.
    runtime().block_on(async {
        let mut log = open(Arc::new(LogStats::default()));
        let got = all_entries(&mut log).await;
        let want: Vec<TestEntry> = (30..40).map(|i| normal(1, i)).collect();
        assert_eq!(
            got.into_iter()
                .filter(|e| e.log_id.index >= 30)
                .collect::<Vec<_>>(),
            want
        );
    });
}
