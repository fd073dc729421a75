//! The broker's side of the schema registry: changes run under the admin lock and
//! only for topics that exist, so a schema is never registered for a topic being
//! deleted; a deleted topic's schemas are dropped with it.

use serde_json::Value;

use super::*;
use crate::engine::schemas::{Registered, SchemaError, SchemaRegistry};
use crate::format::schemas::Compatibility;

/// A registry that cannot be loaded keeps the broker from starting: serving the
/// topics unchecked would let through what the schemas refuse.
pub(super) fn open_error(e: SchemaError) -> EngineError {
    match e {
        SchemaError::Unreadable { path, detail } => EngineError::Corrupt { path, detail },
        SchemaError::Io { context, source } => EngineError::Io { context, source },
        other => EngineError::InvalidRequest {
            detail: other.to_string(),
        },
    }
}

impl Broker {
    /// The topics' schemas: reads, checks and produce validation.
    pub fn schemas(&self) -> &SchemaRegistry {
        &self.schemas
    }

    fn schema_topic(&self, topic: &str) -> Result<(), SchemaError> {
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        self.check_running().map_err(SchemaError::Engine)?;
        self.topic(topic).map(|_| ()).map_err(SchemaError::Engine)
    }

    /// Registers a new schema version for an existing topic (see
    /// [`SchemaRegistry::register`]); durable when it returns.
    pub fn register_schema(
        &self,
        topic: &str,
        schema: &Value,
        compatibility: Option<Compatibility>,
    ) -> Result<Registered, SchemaError> {
        let _admin = lock(&self.admin);
        self.schema_topic(topic)?;
        self.schemas.register(topic, schema, compatibility)
    }

    /// Whether `schema` is compatible with the latest version of an existing topic's
    /// schema (see [`SchemaRegistry::check`]): refused for an unknown topic as a
    /// registration is, so a check cannot pass for a misspelt name.
    pub fn check_schema(&self, topic: &str, schema: &Value) -> Result<Option<String>, SchemaError> {
        self.schema_topic(topic)?;
        self.schemas.check(topic, schema)
    }

    /// Deletes one or every schema version of a topic; durable when it returns.
    pub fn delete_schema(
        &self,
        topic: &str,
        version: Option<u32>,
    ) -> Result<Vec<u32>, SchemaError> {
        let _admin = lock(&self.admin);
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        self.check_running().map_err(SchemaError::Engine)?;
        self.schemas.delete(topic, version)
    }

    /// Makes an existing topic's schemas what another node of the cluster has (see
    /// [`SchemaRegistry::set_subject`]); a node without the topic (it holds no
    /// replica) changes nothing. Returns whether it changed.
    pub fn set_schema_subject(
        &self,
        topic: &str,
        subject: Option<crate::format::schemas::Subject>,
    ) -> Result<bool, SchemaError> {
        let _admin = lock(&self.admin);
        if self.schema_topic(topic).is_err() {
            return Ok(false);
        }
        self.schemas.set_subject(topic, subject)
    }

    /// After a topic's files are gone. A failure leaves the entry, which the next
    /// start drops (the topic no longer exists then).
    pub(super) fn drop_schemas(&self, topic: &str) {
        if let Err(e) = self.schemas.drop_topic(topic) {
            tracing::warn!(topic, error = %e, "dropping the schemas of a deleted topic failed");
        }
    }
}
