//! The topics' schemas in a cluster: a `schemas register` or `delete` changes the
//! schemas of the node it reaches, which then sends the topic's whole entry to every
//! peer ([`Rpc::Schemas`]), so that whichever node leads a partition checks produce
//! against the same versions. The entry is sent whole, not the change, so that
//! asking again after a node was down brings it to the same state.
//!
//! Two changes of one topic's schemas through two nodes at the same moment are not
//! ordered: the nodes may end up with either; the next change through one node sets
//! every node that answers.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{join_ids, LogStores, Manager, Refusal};
use crate::format::schemas::Subject;
use crate::format::wire::raft::Rpc;
use crate::format::wire::ErrorCode;

/// The payload of [`Rpc::Schemas`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SchemasCall {
    topic: String,
    subject: Option<Subject>,
}

impl<L: LogStores> Manager<L> {
    /// Sends this node's schemas of `topic` to every peer; `Err` names the nodes
    /// that did not take them.
    pub(super) async fn send_schemas(&self, topic: &str) -> Result<(), Refusal> {
        let subject = self.broker.schemas().snapshot().topics.get(topic).cloned();
        let payload = serde_json::to_vec(&SchemasCall {
            topic: topic.to_string(),
            subject,
        })
        .map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?;
        let failed: Vec<(u64, String)> = self
            .call_every_peer(topic, Rpc::Schemas, &payload)
            .await
            .into_iter()
            .filter_map(|(node, a)| a.err().map(|(_, msg)| (node, msg)))
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        let down = join_ids(failed.iter().map(|(n, _)| n));
        let why: Vec<&str> = failed.iter().map(|(_, m)| m.as_str()).collect();
        Err((
            ErrorCode::PARTITION_UNAVAILABLE,
            format!(
                "{}; the schemas of {topic} changed on every node but node(s) [{down}], \
                 which would not check produce against them: run the same command again \
                 once node(s) [{down}] answer",
                why.join("; "),
            ),
        ))
    }

    /// Answers [`Rpc::Schemas`]: takes the calling node's entry.
    pub(super) async fn take_schemas(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let call: SchemasCall =
            serde_json::from_slice(payload).map_err(|e| format!("bad schemas call: {e}"))?;
        self.set_schemas(call.topic, call.subject).await?;
        Ok(b"null".to_vec())
    }

    /// Sets a topic's schemas to `subject` on a blocking thread (it writes and
    /// fsyncs `schemas.json`); a topic this node lacks is left alone.
    pub(super) async fn set_schemas(
        &self,
        topic: String,
        subject: Option<Subject>,
    ) -> Result<(), String> {
        let broker = Arc::clone(&self.broker);
        tokio::task::spawn_blocking(move || broker.set_schema_subject(&topic, subject))
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
