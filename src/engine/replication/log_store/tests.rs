//! The Raft log against openraft's storage conformance suite, plus the group commit,
//! restart and limit checks of this store.

use std::io;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use openraft::storage::EntryResponder;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, StorageError, StoredMembership};

use super::*;

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
            last_log_id: self.applied.clone(),
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
        Ok((self.applied.clone(), self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TestConfig>, io::Error>> + Unpin + Send,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            self.applied = Some(entry.log_id.clone());
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(d) => self.data.push(d.0),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id.clone()), m);
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
            applied: self.applied.clone(),
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
            last_log_id: self.applied.clone(),
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
        self.applied = meta.last_log_id.clone();
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
