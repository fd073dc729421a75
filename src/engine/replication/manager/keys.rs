//! The API keys in a cluster: a client logs in to whichever node leads its
//! partitions, so a key created or revoked through one node is sent to every other
//! ([`Rpc::Keys`]). A create that does not reach every node is undone (its token was
//! never shown, so the key was never usable) and fails; a revoke that does not reach
//! every node fails naming the nodes that still accept the key, and the same revoke
//! asked again finishes it, also through a node that no longer has the key.

use std::sync::Arc;

use super::{LogStores, Manager};
use crate::engine::replication::{KeyChange, KeyShared};
use crate::format::wire::raft::Rpc;

impl<L: LogStores> Manager<L> {
    /// Sends `change` to every peer at once.
    pub(super) async fn send_key(&self, change: &KeyChange) -> KeyShared {
        let Ok(payload) = serde_json::to_vec(change) else {
            return KeyShared::default();
        };
        let mut shared = KeyShared::default();
        for (node, answer) in self.call_every_peer("", Rpc::Keys, &payload).await {
            match answer {
                Ok(a) if a == b"true" => shared.changed.push(node),
                Ok(_) => {}
                Err((_, msg)) => shared.failed.push((node, msg)),
            }
        }
        shared
    }

    /// Answers [`Rpc::Keys`]: `true` when the change changed this node's keys.
    pub(super) async fn take_key(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let change: KeyChange =
            serde_json::from_slice(payload).map_err(|e| format!("bad key change: {e}"))?;
        let broker = Arc::clone(&self.broker);
        let changed = tokio::task::spawn_blocking(move || match change {
            KeyChange::Put(entry) => {
                let id = entry.id.clone();
                let added = broker.keys().take(entry)?;
                if added {
                    tracing::info!(key = %id, "API key created on another node of the cluster");
                }
                Ok(added)
            }
            KeyChange::Revoke(id) => {
                let gone = broker.keys().forget(&id)?;
                if gone {
                    tracing::info!(key = %id, "API key revoked on another node of the cluster");
                }
                Ok(gone)
            }
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e: crate::engine::keys::KeyError| e.to_string())?;
        Ok(if changed {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        })
    }
}
