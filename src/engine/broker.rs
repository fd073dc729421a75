//! The broker: topics, their partitions, and the API the network server calls.
//! (First version: the types and signatures; bodies follow.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::EngineError;
use super::io::StorageRef;
use crate::format::topic::TopicConfig;

/// How the broker makes writes durable.
#[derive(Clone, Debug)]
pub struct BrokerOptions {
    /// 1: every produce is acknowledged after an fsync covering it (group commit).
    /// N > 1: fsync once N records wait, acknowledgements do not wait.
    pub flush_every_records: u64,
    /// Longest time written records wait for an fsync.
    pub flush_interval: Duration,
    /// Where retention copies segments before deleting them.
    pub cold_storage_dir: Option<PathBuf>,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions { flush_every_records: 1, flush_interval: Duration::from_secs(1), cold_storage_dir: None }
    }
}

/// One record to append.
#[derive(Clone, Copy, Debug)]
pub struct NewRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// Milliseconds since the epoch; -1: the broker assigns the current time.
    pub timestamp_ms: i64,
}

/// Offsets given to a produce request's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProduceResult {
    pub base_offset: u64,
    pub last_offset: u64,
}

/// Whole records in their on-disk encoding, all from one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchChunk {
    /// The segment's generation: decode with `format::decode_record(bytes, _, generation)`.
    pub generation: u64,
    pub bytes: Vec<u8>,
}

/// What a fetch returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchResult {
    pub chunks: Vec<FetchChunk>,
    /// First offset of the partition.
    pub start_offset: u64,
    /// Next durable offset of the partition.
    pub end_offset: u64,
}

/// One partition in a topic description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub segments: u64,
    pub bytes: u64,
    /// Why the partition refuses writes (or everything), if it does.
    pub error: Option<String>,
}

/// A topic's partitions and configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
    pub config: TopicConfig,
}

/// Counters since the broker started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerStats {
    pub fsyncs: u64,
    pub produce_requests: u64,
    pub records_appended: u64,
}

/// The broker engine.
#[derive(Debug)]
pub struct Broker {
    data_dir: PathBuf,
}

impl Broker {
    pub fn open(data_dir: &Path, _storage: StorageRef, _opts: BrokerOptions) -> Result<Arc<Broker>, EngineError> {
        Ok(Arc::new(Broker { data_dir: data_dir.to_path_buf() }))
    }
    pub fn startup_report(&self) -> Vec<String> {
        Vec::new()
    }
    pub fn create_topic(&self, _name: &str, _partitions: u32, _config: TopicConfig) -> Result<(), EngineError> {
        Err(EngineError::ShuttingDown)
    }
    pub fn delete_topic(&self, name: &str) -> Result<(), EngineError> {
        Err(EngineError::UnknownTopic { topic: name.into() })
    }
    pub fn alter_topic(&self, name: &str, _settings: &[(String, String)]) -> Result<TopicConfig, EngineError> {
        Err(EngineError::UnknownTopic { topic: name.into() })
    }
    pub fn list_topics(&self) -> Vec<String> {
        let _ = &self.data_dir;
        Vec::new()
    }
    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, EngineError> {
        Err(EngineError::UnknownTopic { topic: name.into() })
    }
    pub fn partition_count(&self, topic: &str) -> Result<u32, EngineError> {
        Err(EngineError::UnknownTopic { topic: topic.into() })
    }
    pub fn produce(&self, topic: &str, _partition: u32, _records: &[NewRecord<'_>]) -> Result<ProduceResult, EngineError> {
        Err(EngineError::UnknownTopic { topic: topic.into() })
    }
    pub fn fetch(
        &self,
        topic: &str,
        _partition: u32,
        _offset: u64,
        _max_bytes: u32,
        _max_wait: Duration,
    ) -> Result<FetchResult, EngineError> {
        Err(EngineError::UnknownTopic { topic: topic.into() })
    }
    pub fn offsets(&self, topic: &str, _partition: u32) -> Result<(u64, u64), EngineError> {
        Err(EngineError::UnknownTopic { topic: topic.into() })
    }
    pub fn stats(&self) -> BrokerStats {
        BrokerStats::default()
    }
    pub fn shutdown(&self) -> Result<(), EngineError> {
        Ok(())
    }
}
