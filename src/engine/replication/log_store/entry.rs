//! Turning an openraft entry into a record (key and value) and back.

use openraft::impls::leader_id_adv::LeaderId;
use openraft::{Entry, EntryPayload, LogId, Membership};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::key::{EntryKey, EntryKind};
use super::{EntryCodec, EntryCodecError};

/// The committed leader id of a stored entry: (term, node id), both `u64`.
pub type StoredLeaderId = LeaderId<u64, u64>;
/// The log id of a stored entry.
pub type StoredLogId = LogId<StoredLeaderId>;

/// An entry type the Raft log can store: openraft's [`Entry`] with the advanced leader
/// id over `u64` terms and node ids, an [`EntryCodec`] payload and a node type that
/// serde writes (membership entries are stored as JSON).
pub trait StoredEntry: Sized {
    /// The entry's log id.
    fn stored_log_id(&self) -> StoredLogId;
    /// Appends the record value to `out`; returns the entry's kind.
    fn encode_value(&self, out: &mut Vec<u8>) -> Result<EntryKind, EntryCodecError>;
    /// Rebuilds an entry from its key and value.
    fn decode(index: u64, key: &EntryKey, value: &[u8]) -> Result<Self, EntryCodecError>;
}

impl<D, N> StoredEntry for Entry<StoredLeaderId, EntryPayload<D, u64, N>>
where
    D: EntryCodec + openraft::AppData,
    N: openraft::Node + Serialize + DeserializeOwned,
{
    fn stored_log_id(&self) -> StoredLogId {
        self.log_id
    }

    fn encode_value(&self, out: &mut Vec<u8>) -> Result<EntryKind, EntryCodecError> {
        match &self.payload {
            EntryPayload::Blank => Ok(EntryKind::Blank),
            EntryPayload::Normal(d) => {
                d.encode(out);
                Ok(EntryKind::Normal)
            }
            EntryPayload::Membership(m) => {
                serde_json::to_writer(out, m).map_err(|e| EntryCodecError(e.to_string()))?;
                Ok(EntryKind::Membership)
            }
        }
    }

    fn decode(index: u64, key: &EntryKey, value: &[u8]) -> Result<Self, EntryCodecError> {
        let payload = match key.kind {
            EntryKind::Blank if value.is_empty() => EntryPayload::Blank,
            EntryKind::Blank => {
                return Err(EntryCodecError(format!(
                    "blank entry {index} carries {} bytes",
                    value.len()
                )))
            }
            EntryKind::Normal => EntryPayload::Normal(D::decode(value)?),
            EntryKind::Membership => {
                let m: Membership<u64, N> = serde_json::from_slice(value)
                    .map_err(|e| EntryCodecError(format!("membership entry {index}: {e}")))?;
                EntryPayload::Membership(m)
            }
        };
        Ok(Entry {
            log_id: LogId::new(
                StoredLeaderId {
                    term: key.term,
                    node_id: key.leader,
                },
                index,
            ),
            payload,
        })
    }
}
