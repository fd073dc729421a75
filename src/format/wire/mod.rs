//! The wire protocol: frame layout, requests, responses and error codes, as pure
//! encode/decode functions over byte slices. docs/PROTOCOL.md describes every byte;
//! this module is its implementation and must stay in step with it.
//!
//! ```text
//! request frame                         response frame
//! +-----------+------------+---------+  +-----------+------------+---------+------+---------+------+
//! | frame_len | request_id | api_key |  | frame_len | request_id | api_key | code | message | body |
//! | u32       | u32        | u16     |  | u32       | u32        | u16     | u16  | string  |      |
//! +-----------+------------+---------+  +-----------+------------+---------+------+---------+------+
//! then the request payload              body only when code == 0
//! ```
//!
//! `frame_len` counts the bytes after itself and is at most [`FRAME_BYTES_MAX`].
//! Integers are big-endian. `string` = u16 length + UTF-8; `bytes` = u32 length +
//! bytes; `opt_bytes` = i32 length (-1 = absent) + bytes.
//!
//! Invariants: decoders never panic and never index out of bounds (enforced by the
//! lints below); every length and count read from the network is checked against a
//! named maximum, and against the bytes actually remaining, before anything is
//! allocated; a payload must be consumed exactly (trailing bytes are an error).
#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::panic,
    clippy::expect_used
)]

use crate::format::names::NAME_LEN_MAX;

pub mod groups;
pub mod keys;
pub mod producers;
pub mod raft;
use crate::format::record::MAX_RECORD_LEN;
use crate::format::topic::PARTITIONS_MAX;

pub mod schemas;
pub use schemas::{SchemaSubjectInfo, SCHEMAS_VERSION};

/// The newest protocol version this build speaks. Version 2 adds the `cleanup` array
/// to the describe-topic response; version 3 the `health` array after it, the stats
/// response's write-path counters, the consumer-group and idempotent-producer requests
/// and the schema requests (see [`groups`], [`producers`], [`schemas`]); everything
/// else is as in version 1.
pub const PROTOCOL_VERSION: u16 = 3;
/// The first version whose describe-topic response carries `cleanup`.
pub const CLEANUP_INFO_VERSION: u16 = 2;
/// The first version whose describe-topic response carries `health`.
pub const PARTITION_HEALTH_VERSION: u16 = 3;
/// The first version with consumer groups (api keys 32..=40).
pub const GROUPS_VERSION: u16 = 3;
/// The first version with the cluster-status request (api key 70).
pub const CLUSTER_VERSION: u16 = 3;
/// Largest cluster-status JSON (16 MiB).
pub const CLUSTER_STATUS_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// The oldest protocol version this build speaks.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

/// Size of the `frame_len` field.
pub const LEN_FIELD: usize = 4;
/// Largest `frame_len` either side accepts (64 MiB).
pub const FRAME_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// `request_id` + `api_key`: the smallest frame.
pub const FRAME_HEAD_LEN: usize = 4 + 2;
/// Longest topic name on the wire (the same limit as on disk).
pub const TOPIC_BYTES_MAX: usize = NAME_LEN_MAX;
/// Longest error message; longer messages are cut at a character boundary.
pub const MESSAGE_BYTES_MAX: usize = 4096;
/// Most partitions in one produce request, list-offsets or describe response.
pub const PARTITIONS_PER_MESSAGE_MAX: u32 = PARTITIONS_MAX;
/// Most records in one partition of a produce request.
pub const RECORDS_PER_PARTITION_MAX: u32 = 1 << 20;
/// Largest key or value (the largest that can fit in one on-disk record).
pub const RECORD_FIELD_BYTES_MAX: u32 = MAX_RECORD_LEN;
/// Most `KEY=VALUE` settings in a create, alter or describe message.
pub const SETTINGS_MAX: u32 = 64;
/// Longest setting key or value.
pub const SETTING_BYTES_MAX: usize = 256;
/// Most topic names in a list-topics response.
pub const TOPICS_MAX: u32 = 1 << 16;
/// Most chunks in a fetch response.
pub const FETCH_CHUNKS_MAX: u32 = 4096;
/// Largest `max_bytes` a fetch may ask for (32 MiB).
pub const FETCH_BYTES_MAX: u32 = 32 * 1024 * 1024;
/// Longest `max_wait_ms` a fetch may ask for (60 s).
pub const FETCH_WAIT_MS_MAX: u32 = 60_000;
/// The `api_key` of a response to a frame the server could not read far enough to
/// learn its api key; its `request_id` is then 0.
pub const API_KEY_NONE: u16 = 0xFFFF;

const RECORD_WIRE_MIN: usize = 8 + 4 + 4; // timestamp, key_len, value_len
const PARTITION_BATCH_MIN: usize = 4 + 4; // partition, record count
const ACK_WIRE_MIN: usize = 4 + 2 + 2 + 8 + 8;
const OFFSETS_WIRE_LEN: usize = 4 + 8 + 8;
const INFO_WIRE_LEN: usize = 4 + 8 + 8 + 8 + 8;
/// Smallest encoded cleanup info (empty `last_error`).
const CLEANUP_WIRE_MIN: usize = 4 + 8 * 8 + 2;
/// Smallest encoded partition health (empty `detail`): partition, records, state,
/// detail, spares, preallocated_bytes.
const HEALTH_WIRE_MIN: usize = 4 + 8 + 2 + 2 + 8 + 8;
const CHUNK_WIRE_MIN: usize = 8 + 4;
const SETTING_WIRE_MIN: usize = 2 + 2;
const STRING_WIRE_MIN: usize = 2;

const _: () = assert!(FETCH_BYTES_MAX < FRAME_BYTES_MAX);
const _: () = assert!(MAX_RECORD_LEN < FRAME_BYTES_MAX);
const _: () = assert!(TOPIC_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(MESSAGE_BYTES_MAX <= u16::MAX as usize);

/// What a request asks for. The numbers are fixed by docs/PROTOCOL.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ApiKey {
    Handshake = 0,
    Produce = 1,
    Fetch = 2,
    ListOffsets = 3,
    CreateTopic = 4,
    DeleteTopic = 5,
    ListTopics = 6,
    DescribeTopic = 7,
    AlterTopic = 8,
    Stats = 9,
    JoinGroup = 32,
    SyncGroup = 33,
    Heartbeat = 34,
    LeaveGroup = 35,
    OffsetCommit = 36,
    OffsetFetch = 37,
    ListGroups = 38,
    DescribeGroup = 39,
    DeleteGroup = 40,
    InitProducer = 41,
    IdempotentProduce = 42,
    SchemaRegister = 50,
    SchemaGet = 51,
    SchemaList = 52,
    SchemaCheck = 53,
    SchemaDelete = 54,
    KeyCreate = 60,
    KeyList = 61,
    KeyRevoke = 62,
    ClusterStatus = 70,
}

impl ApiKey {
    pub const ALL: [ApiKey; 30] = [
        ApiKey::Handshake,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::CreateTopic,
        ApiKey::DeleteTopic,
        ApiKey::ListTopics,
        ApiKey::DescribeTopic,
        ApiKey::AlterTopic,
        ApiKey::Stats,
        ApiKey::SchemaRegister,
        ApiKey::SchemaGet,
        ApiKey::SchemaList,
        ApiKey::SchemaCheck,
        ApiKey::SchemaDelete,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroup,
        ApiKey::DeleteGroup,
        ApiKey::InitProducer,
        ApiKey::IdempotentProduce,
        ApiKey::KeyCreate,
        ApiKey::KeyList,
        ApiKey::KeyRevoke,
        ApiKey::ClusterStatus,
    ];

    pub fn from_u16(v: u16) -> Option<ApiKey> {
        ApiKey::ALL.into_iter().find(|k| *k as u16 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            ApiKey::Handshake => "handshake",
            ApiKey::Produce => "produce",
            ApiKey::Fetch => "fetch",
            ApiKey::ListOffsets => "list_offsets",
            ApiKey::CreateTopic => "create_topic",
            ApiKey::DeleteTopic => "delete_topic",
            ApiKey::ListTopics => "list_topics",
            ApiKey::DescribeTopic => "describe_topic",
            ApiKey::AlterTopic => "alter_topic",
            ApiKey::Stats => "stats",
            ApiKey::SchemaRegister => "schema_register",
            ApiKey::SchemaGet => "schema_get",
            ApiKey::SchemaList => "schema_list",
            ApiKey::SchemaCheck => "schema_check",
            ApiKey::SchemaDelete => "schema_delete",
            ApiKey::JoinGroup => "join_group",
            ApiKey::SyncGroup => "sync_group",
            ApiKey::Heartbeat => "heartbeat",
            ApiKey::LeaveGroup => "leave_group",
            ApiKey::OffsetCommit => "offset_commit",
            ApiKey::OffsetFetch => "offset_fetch",
            ApiKey::ListGroups => "list_groups",
            ApiKey::DescribeGroup => "describe_group",
            ApiKey::DeleteGroup => "delete_group",
            ApiKey::InitProducer => "init_producer",
            ApiKey::IdempotentProduce => "idempotent_produce",
            ApiKey::KeyCreate => "key_create",
            ApiKey::KeyList => "key_list",
            ApiKey::KeyRevoke => "key_revoke",
            ApiKey::ClusterStatus => "cluster_status",
        }
    }

    /// The consumer-group requests (protocol version 3 and later).
    pub fn is_group(self) -> bool {
        (self as u16) >= ApiKey::JoinGroup as u16 && (self as u16) <= ApiKey::DeleteGroup as u16
    }
}

/// A response's error code. A newtype rather than an enum so that a code from a newer
/// peer still decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    pub const NONE: ErrorCode = ErrorCode(0);
    /// The frame could not be decoded. The server closes the connection.
    pub const MALFORMED: ErrorCode = ErrorCode(1);
    /// `frame_len` is over [`FRAME_BYTES_MAX`] or under [`FRAME_HEAD_LEN`]. Closes.
    pub const FRAME_TOO_LARGE: ErrorCode = ErrorCode(2);
    /// No protocol version in common. Closes.
    pub const UNSUPPORTED_VERSION: ErrorCode = ErrorCode(3);
    /// The first request was not a handshake. Closes.
    pub const HANDSHAKE_REQUIRED: ErrorCode = ErrorCode(4);
    /// An api key this server does not know. Closes.
    pub const UNKNOWN_API: ErrorCode = ErrorCode(5);
    /// The server has too many connections. Closes.
    pub const TOO_MANY_CONNECTIONS: ErrorCode = ErrorCode(6);
    pub const UNKNOWN_TOPIC: ErrorCode = ErrorCode(10);
    pub const UNKNOWN_PARTITION: ErrorCode = ErrorCode(11);
    pub const TOPIC_EXISTS: ErrorCode = ErrorCode(12);
    pub const INVALID_NAME: ErrorCode = ErrorCode(13);
    pub const INVALID_CONFIG: ErrorCode = ErrorCode(14);
    pub const OFFSET_OUT_OF_RANGE: ErrorCode = ErrorCode(15);
    pub const RECORD_TOO_LARGE: ErrorCode = ErrorCode(16);
    /// The partition stopped accepting writes after an I/O failure; a restart recovers it.
    pub const PARTITION_FAILED: ErrorCode = ErrorCode(17);
    pub const SHUTTING_DOWN: ErrorCode = ErrorCode(18);
    /// An I/O error on the broker's storage.
    pub const STORAGE: ErrorCode = ErrorCode(19);
    /// Anything else the broker could not do.
    pub const INTERNAL: ErrorCode = ErrorCode(20);
    /// A well-formed request the broker cannot carry out as asked.
    pub const INVALID_REQUEST: ErrorCode = ErrorCode(21);
    /// The partition cannot serve for now (for example, it failed to open).
    pub const PARTITION_UNAVAILABLE: ErrorCode = ErrorCode(22);
    /// The broker found corrupt data while serving the request.
    pub const CORRUPT_DATA: ErrorCode = ErrorCode(23);
    /// A produced value does not match the topic's schema (version 3).
    pub const SCHEMA_VIOLATION: ErrorCode = ErrorCode(60);
    /// A schema given to register or check is not a valid JSON Schema (version 3).
    pub const INVALID_SCHEMA: ErrorCode = ErrorCode(61);
    /// A schema is not compatible with the topic's latest version (version 3).
    pub const SCHEMA_INCOMPATIBLE: ErrorCode = ErrorCode(62);
    /// The topic has no schema, or not the version asked for (version 3).
    pub const UNKNOWN_SCHEMA: ErrorCode = ErrorCode(63);
    /// Kafka's ILLEGAL_GENERATION: the member's generation is not the group's.
    pub const ILLEGAL_GENERATION: ErrorCode = ErrorCode(40);
    /// Kafka's REBALANCE_IN_PROGRESS: rejoin the group.
    pub const REBALANCE_IN_PROGRESS: ErrorCode = ErrorCode(41);
    /// Kafka's UNKNOWN_MEMBER_ID.
    pub const UNKNOWN_MEMBER: ErrorCode = ErrorCode(42);
    /// Kafka's GROUP_ID_NOT_FOUND.
    pub const UNKNOWN_GROUP: ErrorCode = ErrorCode(43);
    /// Kafka's NON_EMPTY_GROUP: the group has live members.
    pub const GROUP_NOT_EMPTY: ErrorCode = ErrorCode(44);
    /// Kafka's INVALID_SESSION_TIMEOUT.
    pub const INVALID_SESSION_TIMEOUT: ErrorCode = ErrorCode(45);
    /// Kafka's INCONSISTENT_GROUP_PROTOCOL.
    pub const INCONSISTENT_PROTOCOL: ErrorCode = ErrorCode(46);
    /// Kafka's OFFSET_METADATA_TOO_LARGE.
    pub const METADATA_TOO_LARGE: ErrorCode = ErrorCode(47);
    /// Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER: a gap in a producer's sequences.
    pub const OUT_OF_ORDER_SEQUENCE: ErrorCode = ErrorCode(48);
    /// Kafka's INVALID_PRODUCER_EPOCH: the producer was fenced by a newer epoch.
    pub const INVALID_PRODUCER_EPOCH: ErrorCode = ErrorCode(49);
    /// Kafka's UNKNOWN_PRODUCER_ID.
    pub const UNKNOWN_PRODUCER: ErrorCode = ErrorCode(50);
    /// A batch of the same producer and partition is being written: retry.
    pub const PRODUCER_BUSY: ErrorCode = ErrorCode(51);
    /// The broker requires a token and the handshake carried none (version 3).
    pub const AUTH_REQUIRED: ErrorCode = ErrorCode(70);
    /// The token is malformed, unknown, revoked or wrong (version 3).
    pub const AUTH_FAILED: ErrorCode = ErrorCode(71);
    /// The key's role or patterns do not allow the request (version 3).
    pub const NOT_AUTHORIZED: ErrorCode = ErrorCode(72);
    /// Too many failed logins from this source address: wait (version 3).
    pub const AUTH_RATE_LIMITED: ErrorCode = ErrorCode(73);
    /// No API key has the id given (version 3).
    pub const UNKNOWN_KEY: ErrorCode = ErrorCode(74);
    /// A request past one of the listener's configured limits (records per request,
    /// topics, partitions per topic); nothing was written. The connection stays open.
    pub const LIMIT_EXCEEDED: ErrorCode = ErrorCode(80);
    /// A plaintext connection to a listener that requires TLS. Closes.
    pub const TLS_REQUIRED: ErrorCode = ErrorCode(81);
    /// The partition is replicated and this node does not lead it; the message names
    /// the leader (see [`parse_not_leader`]). The connection stays open (version 3).
    pub const NOT_LEADER: ErrorCode = ErrorCode(90);

    pub fn is_ok(self) -> bool {
        self == ErrorCode::NONE
    }

    /// Codes after which the server closes the connection.
    pub fn closes_connection(self) -> bool {
        (1..10).contains(&self.0) || self == ErrorCode::TLS_REQUIRED
    }

    /// Stable machine-readable name.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NONE => "none",
            ErrorCode::MALFORMED => "malformed",
            ErrorCode::FRAME_TOO_LARGE => "frame_too_large",
            ErrorCode::UNSUPPORTED_VERSION => "unsupported_version",
            ErrorCode::HANDSHAKE_REQUIRED => "handshake_required",
            ErrorCode::UNKNOWN_API => "unknown_api",
            ErrorCode::TOO_MANY_CONNECTIONS => "too_many_connections",
            ErrorCode::UNKNOWN_TOPIC => "unknown_topic",
            ErrorCode::UNKNOWN_PARTITION => "unknown_partition",
            ErrorCode::TOPIC_EXISTS => "topic_exists",
            ErrorCode::INVALID_NAME => "invalid_name",
            ErrorCode::INVALID_CONFIG => "invalid_config",
            ErrorCode::OFFSET_OUT_OF_RANGE => "offset_out_of_range",
            ErrorCode::RECORD_TOO_LARGE => "record_too_large",
            ErrorCode::PARTITION_FAILED => "partition_failed",
            ErrorCode::SHUTTING_DOWN => "shutting_down",
            ErrorCode::STORAGE => "storage_error",
            ErrorCode::INTERNAL => "internal",
            ErrorCode::INVALID_REQUEST => "invalid_request",
            ErrorCode::PARTITION_UNAVAILABLE => "partition_unavailable",
            ErrorCode::CORRUPT_DATA => "corrupt_data",
            ErrorCode::SCHEMA_VIOLATION => "schema_violation",
            ErrorCode::INVALID_SCHEMA => "invalid_schema",
            ErrorCode::SCHEMA_INCOMPATIBLE => "schema_incompatible",
            ErrorCode::UNKNOWN_SCHEMA => "unknown_schema",
            ErrorCode::ILLEGAL_GENERATION => "illegal_generation",
            ErrorCode::REBALANCE_IN_PROGRESS => "rebalance_in_progress",
            ErrorCode::UNKNOWN_MEMBER => "unknown_member_id",
            ErrorCode::UNKNOWN_GROUP => "unknown_group",
            ErrorCode::GROUP_NOT_EMPTY => "group_not_empty",
            ErrorCode::INVALID_SESSION_TIMEOUT => "invalid_session_timeout",
            ErrorCode::INCONSISTENT_PROTOCOL => "inconsistent_group_protocol",
            ErrorCode::METADATA_TOO_LARGE => "offset_metadata_too_large",
            ErrorCode::OUT_OF_ORDER_SEQUENCE => "out_of_order_sequence_number",
            ErrorCode::INVALID_PRODUCER_EPOCH => "invalid_producer_epoch",
            ErrorCode::UNKNOWN_PRODUCER => "unknown_producer_id",
            ErrorCode::PRODUCER_BUSY => "producer_busy",
            ErrorCode::AUTH_REQUIRED => "auth_required",
            ErrorCode::AUTH_FAILED => "auth_failed",
            ErrorCode::NOT_AUTHORIZED => "not_authorized",
            ErrorCode::AUTH_RATE_LIMITED => "auth_rate_limited",
            ErrorCode::UNKNOWN_KEY => "unknown_key",
            ErrorCode::LIMIT_EXCEEDED => "limit_exceeded",
            ErrorCode::TLS_REQUIRED => "tls_required",
            ErrorCode::NOT_LEADER => "not_leader",
            _ => "unknown_error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// The message of a [`ErrorCode::NOT_LEADER`] refusal.
pub fn not_leader_message(topic: &str, partition: u32, leader: Option<(u64, &str)>) -> String {
    match leader {
        Some((id, addr)) => {
            format!("not the leader of {topic}/{partition}; leader: node {id} at {addr}")
        }
        None => format!("not the leader of {topic}/{partition}; leader: unknown"),
    }
}

/// The leader's node id and client address named by a [`ErrorCode::NOT_LEADER`]
/// message, or `None` when it names none (`leader: unknown`) or is not one.
pub fn parse_not_leader(message: &str) -> Option<(u64, String)> {
    let (_, tail) = message.rsplit_once("; leader: node ")?;
    let (id, addr) = tail.split_once(" at ")?;
    let id = id.parse().ok()?;
    let addr = addr.trim();
    if addr.is_empty() {
        return None;
    }
    Some((id, addr.to_string()))
}

/// Why bytes are not a valid frame, or a value cannot be encoded. `at` is the byte
/// position within the frame (after `frame_len`) where the problem starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("frame length {len} is outside {min}..={FRAME_BYTES_MAX}")]
    FrameLength { len: u64, min: usize },
    #[error("truncated {field} at byte {at}: needs {needed} bytes, {available} remain")]
    Truncated {
        field: &'static str,
        at: usize,
        needed: u64,
        available: usize,
    },
    #[error("{field} length {len} at byte {at} exceeds the limit {max}")]
    TooLong {
        field: &'static str,
        at: usize,
        len: u64,
        max: u64,
    },
    #[error("{field} count {count} at byte {at} exceeds the limit {max}")]
    TooMany {
        field: &'static str,
        at: usize,
        count: u64,
        max: u64,
    },
    #[error("{field} at byte {at} is not valid UTF-8")]
    BadUtf8 { field: &'static str, at: usize },
    #[error("bad {field} {value} at byte {at}")]
    BadValue {
        field: &'static str,
        at: usize,
        value: i64,
    },
    #[error("{count} unexpected bytes after the payload at byte {at}")]
    Trailing { at: usize, count: usize },
    #[error("unknown api key {key}")]
    UnknownApi { key: u16 },
    #[error("{field} of {len} bytes cannot be encoded (limit {max})")]
    Unencodable {
        field: &'static str,
        len: u64,
        max: u64,
    },
}

// ---------------------------------------------------------------------------------
// Messages.

/// One record as the producer sends it. Offsets are assigned by the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireRecord<'a> {
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
}

/// The records for one partition in a produce request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionBatch<'a> {
    pub partition: u32,
    pub records: Vec<WireRecord<'a>>,
}

/// A `KEY=VALUE` topic setting.
pub type Setting<'a> = (&'a str, &'a str);

/// A decoded request, borrowing from the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Handshake {
        min_version: u16,
        max_version: u16,
        /// The API key token (version 3; sent only when the client has one).
        token: Option<&'a str>,
    },
    Produce {
        topic: &'a str,
        partitions: Vec<PartitionBatch<'a>>,
    },
    Fetch {
        topic: &'a str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    },
    ListOffsets {
        topic: &'a str,
    },
    CreateTopic {
        topic: &'a str,
        partitions: u32,
        settings: Vec<Setting<'a>>,
    },
    DeleteTopic {
        topic: &'a str,
    },
    ListTopics,
    DescribeTopic {
        topic: &'a str,
    },
    AlterTopic {
        topic: &'a str,
        settings: Vec<Setting<'a>>,
    },
    Stats,
    SchemaRegister {
        topic: &'a str,
        /// "" keeps the topic's rule.
        compatibility: &'a str,
        schema: &'a str,
    },
    SchemaGet {
        topic: &'a str,
        /// 0 = the latest.
        version: u32,
    },
    SchemaList,
    SchemaCheck {
        topic: &'a str,
        schema: &'a str,
    },
    SchemaDelete {
        topic: &'a str,
        /// 0 = every version.
        version: u32,
    },
    /// A consumer-group request (protocol version 3).
    Group(groups::GroupRequest<'a>),
    /// An idempotent-producer request (protocol version 3).
    Producer(producers::ProducerRequest<'a>),
    /// An API-key request (protocol version 3).
    Key(keys::KeyRequest<'a>),
    /// The node's view of its cluster (protocol version 3).
    ClusterStatus,
}

impl Request<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            Request::Handshake { .. } => ApiKey::Handshake,
            Request::Produce { .. } => ApiKey::Produce,
            Request::Fetch { .. } => ApiKey::Fetch,
            Request::ListOffsets { .. } => ApiKey::ListOffsets,
            Request::CreateTopic { .. } => ApiKey::CreateTopic,
            Request::DeleteTopic { .. } => ApiKey::DeleteTopic,
            Request::ListTopics => ApiKey::ListTopics,
            Request::DescribeTopic { .. } => ApiKey::DescribeTopic,
            Request::AlterTopic { .. } => ApiKey::AlterTopic,
            Request::Stats => ApiKey::Stats,
            Request::ClusterStatus => ApiKey::ClusterStatus,
            Request::SchemaRegister { .. } => ApiKey::SchemaRegister,
            Request::SchemaGet { .. } => ApiKey::SchemaGet,
            Request::SchemaList => ApiKey::SchemaList,
            Request::SchemaCheck { .. } => ApiKey::SchemaCheck,
            Request::SchemaDelete { .. } => ApiKey::SchemaDelete,
            Request::Group(g) => g.api_key(),
            Request::Producer(p) => p.api_key(),
            Request::Key(k) => k.api_key(),
        }
    }
}

/// The outcome of one partition of a produce request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionAck<'a> {
    pub partition: u32,
    pub code: ErrorCode,
    pub message: &'a str,
    /// Offset of the first record (meaningful when `code` is NONE).
    pub base_offset: u64,
    /// Offset of the last record (meaningful when `code` is NONE).
    pub last_offset: u64,
}

/// A run of whole on-disk records from one segment, with that segment's generation
/// (needed to check each record's CRC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub generation: u64,
    pub bytes: &'a [u8],
}

/// First and next offsets of one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
}

/// One partition in a describe response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub segments: u64,
    pub bytes: u64,
}

/// The state of a partition's data (describe response, protocol version 3 on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum HealthState {
    /// Every segment reads to its end and none is lost.
    Ok = 0,
    /// Served, but some records cannot be read (a damaged or a lost segment).
    Damaged = 1,
    /// Refuses writes (or every request): failed, or could not be opened.
    Failed = 2,
}

impl HealthState {
    pub fn from_u16(v: u16) -> Option<HealthState> {
        match v {
            0 => Some(HealthState::Ok),
            1 => Some(HealthState::Damaged),
            2 => Some(HealthState::Failed),
            _ => None,
        }
    }

    /// The name clients print.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Ok => "ok",
            HealthState::Damaged => "damaged",
            HealthState::Failed => "failed",
        }
    }
}

/// One partition's records and state (describe response, protocol version 3 on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionHealth {
    pub partition: u32,
    /// Records present (compacted topics have gaps, so not `end - start`).
    pub records: u64,
    pub state: HealthState,
    /// One line naming the failure or the damaged file and offsets; empty when ok.
    pub detail: String,
    /// Reserved for the write path; 0 for now.
    pub spares: u64,
    /// Reserved for the write path; 0 for now.
    pub preallocated_bytes: u64,
}

/// What background cleanup did to one partition since the broker started
/// (describe response, protocol version 2 and later).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CleanupInfo {
    pub partition: u32,
    /// Milliseconds since the epoch; -1: not yet.
    pub last_retention_ms: i64,
    pub segments_deleted: u64,
    pub bytes_deleted: u64,
    pub segments_archived: u64,
    /// Milliseconds since the epoch; -1: not yet.
    pub last_compaction_ms: i64,
    pub compactions: u64,
    pub records_dropped: u64,
    pub bytes_compacted: u64,
    /// Empty when the last visit succeeded.
    pub last_error: String,
}

/// Broker counters.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StatsBody {
    pub fsyncs: u64,
    pub produce_requests: u64,
    pub records_appended: u64,
    /// The write path's counters (protocol version 3 and later).
    pub write: Option<WriteStats>,
}

/// The first version whose stats response carries [`WriteStats`].
pub const WRITE_STATS_VERSION: u16 = 3;
/// Most fsync latency buckets a stats response carries.
pub const LATENCY_BUCKETS_MAX: u32 = 1024;

/// The write path's counters since the broker started (stats response, version 3).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Timed fsyncs of log data per latency bucket (the broker's histogram layout:
    /// docs/PROTOCOL.md).
    pub fsync_latency_us: Vec<u64>,
    pub rolls: u64,
    /// Longest a writer waited at a roll, in microseconds.
    pub roll_stall_max_us: u64,
    /// Zeros written and fsynced ahead of writers.
    pub zeroed_bytes: u64,
    /// Spare segment files logs took at a roll.
    pub spares_taken: u64,
    /// Segments that became spares instead of being deleted.
    pub spares_returned: u64,
}

/// The body of a successful response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody<'a> {
    Handshake {
        version: u16,
        frame_bytes_max: u32,
    },
    Produce {
        partitions: Vec<PartitionAck<'a>>,
    },
    Fetch {
        start_offset: u64,
        end_offset: u64,
        chunks: Vec<Chunk<'a>>,
    },
    ListOffsets {
        partitions: Vec<PartitionOffsets>,
    },
    CreateTopic,
    DeleteTopic,
    ListTopics {
        topics: Vec<&'a str>,
    },
    DescribeTopic {
        partitions: Vec<PartitionDescription>,
        settings: Vec<Setting<'a>>,
        /// Present from protocol version 2 on (the server sends it only on a
        /// connection that agreed on version 2 or later).
        cleanup: Option<Vec<CleanupInfo>>,
        /// Present from protocol version 3 on (sent only on a connection that
        /// agreed on version 3 or later; an empty `cleanup` is sent with it).
        health: Option<Vec<PartitionHealth>>,
    },
    AlterTopic {
        settings: Vec<Setting<'a>>,
    },
    Stats(StatsBody),
    /// This node's view of the cluster, as JSON (version 3; docs/PROTOCOL.md).
    ClusterStatus {
        json: &'a str,
    },
    SchemaRegister {
        version: u32,
    },
    SchemaGet {
        version: u32,
        compatibility: &'a str,
        schema: &'a str,
    },
    SchemaList {
        topics: Vec<SchemaSubjectInfo<'a>>,
    },
    SchemaCheck {
        compatible: bool,
        reason: &'a str,
    },
    SchemaDelete {
        versions: Vec<u32>,
    },
    Group(groups::GroupResponse<'a>),
    /// The init-producer response; an idempotent produce is answered with `Produce`.
    InitProducer {
        producer_id: u64,
        epoch: u16,
    },
    Key(keys::KeyResponse<'a>),
}

impl ResponseBody<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            ResponseBody::Handshake { .. } => ApiKey::Handshake,
            ResponseBody::Produce { .. } => ApiKey::Produce,
            ResponseBody::Fetch { .. } => ApiKey::Fetch,
            ResponseBody::ListOffsets { .. } => ApiKey::ListOffsets,
            ResponseBody::CreateTopic => ApiKey::CreateTopic,
            ResponseBody::DeleteTopic => ApiKey::DeleteTopic,
            ResponseBody::ListTopics { .. } => ApiKey::ListTopics,
            ResponseBody::DescribeTopic { .. } => ApiKey::DescribeTopic,
            ResponseBody::AlterTopic { .. } => ApiKey::AlterTopic,
            ResponseBody::Stats(_) => ApiKey::Stats,
            ResponseBody::ClusterStatus { .. } => ApiKey::ClusterStatus,
            ResponseBody::SchemaRegister { .. } => ApiKey::SchemaRegister,
            ResponseBody::SchemaGet { .. } => ApiKey::SchemaGet,
            ResponseBody::SchemaList { .. } => ApiKey::SchemaList,
            ResponseBody::SchemaCheck { .. } => ApiKey::SchemaCheck,
            ResponseBody::SchemaDelete { .. } => ApiKey::SchemaDelete,
            ResponseBody::Group(g) => g.api_key(),
            ResponseBody::InitProducer { .. } => ApiKey::InitProducer,
            ResponseBody::Key(k) => k.api_key(),
        }
    }
}

/// A decoded response frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response<'a> {
    pub request_id: u32,
    pub api_key: u16,
    pub code: ErrorCode,
    pub message: &'a str,
    /// Present exactly when `code` is NONE.
    pub body: Option<ResponseBody<'a>>,
}

// ---------------------------------------------------------------------------------
// Frames.

/// Checks a `frame_len` read from the stream before the frame is read.
pub fn check_frame_len(len: u32) -> Result<usize, ProtocolError> {
    if (len as usize) < FRAME_HEAD_LEN || len > FRAME_BYTES_MAX {
        return Err(ProtocolError::FrameLength {
            len: u64::from(len),
            min: FRAME_HEAD_LEN,
        });
    }
    Ok(len as usize)
}

/// `request_id` and `api_key` of a frame (the bytes after `frame_len`), if it is long
/// enough to hold them.
pub fn frame_head(frame: &[u8]) -> Option<(u32, u16)> {
    let id = frame.get(0..4)?;
    let key = frame.get(4..6)?;
    Some((
        u32::from_be_bytes(id.try_into().ok()?),
        u16::from_be_bytes(key.try_into().ok()?),
    ))
}

/// Starts a frame in `out`: a placeholder `frame_len`, then `head`. Returns where
/// the frame starts, for [`finish_frame`].
fn start_frame(out: &mut Vec<u8>, request_id: u32, api_key: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_FIELD]);
    out.extend_from_slice(&request_id.to_be_bytes());
    out.extend_from_slice(&api_key.to_be_bytes());
    start
}

/// Fills in `frame_len`, or removes the frame and fails if it is too large.
fn finish_frame(out: &mut Vec<u8>, start: usize) -> Result<(), ProtocolError> {
    let len = out.len().saturating_sub(start).saturating_sub(LEN_FIELD);
    if len > FRAME_BYTES_MAX as usize {
        out.truncate(start);
        return Err(ProtocolError::Unencodable {
            field: "frame",
            len: len as u64,
            max: u64::from(FRAME_BYTES_MAX),
        });
    }
    if let Some(slot) = out.get_mut(start..start + LEN_FIELD) {
        slot.copy_from_slice(&(len as u32).to_be_bytes());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Encoding.

fn put_str(
    out: &mut Vec<u8>,
    field: &'static str,
    s: &str,
    max: usize,
) -> Result<(), ProtocolError> {
    if s.len() > max {
        return Err(ProtocolError::Unencodable {
            field,
            len: s.len() as u64,
            max: max as u64,
        });
    }
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

fn put_count(
    out: &mut Vec<u8>,
    field: &'static str,
    n: usize,
    max: u32,
) -> Result<(), ProtocolError> {
    if n > max as usize {
        return Err(ProtocolError::Unencodable {
            field,
            len: n as u64,
            max: u64::from(max),
        });
    }
    out.extend_from_slice(&(n as u32).to_be_bytes());
    Ok(())
}

fn put_settings(out: &mut Vec<u8>, settings: &[Setting<'_>]) -> Result<(), ProtocolError> {
    put_count(out, "settings", settings.len(), SETTINGS_MAX)?;
    for (k, v) in settings {
        put_str(out, "setting key", k, SETTING_BYTES_MAX)?;
        put_str(out, "setting value", v, SETTING_BYTES_MAX)?;
    }
    Ok(())
}

fn put_record(out: &mut Vec<u8>, r: &WireRecord<'_>) -> Result<(), ProtocolError> {
    let max = RECORD_FIELD_BYTES_MAX as usize;
    out.extend_from_slice(&r.timestamp_ms.to_be_bytes());
    match r.key {
        Some(k) if k.len() > max => {
            return Err(ProtocolError::Unencodable {
                field: "key",
                len: k.len() as u64,
                max: max as u64,
            })
        }
        Some(k) => {
            out.extend_from_slice(&(k.len() as i32).to_be_bytes());
            out.extend_from_slice(k);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
    if r.value.len() > max {
        return Err(ProtocolError::Unencodable {
            field: "value",
            len: r.value.len() as u64,
            max: max as u64,
        });
    }
    out.extend_from_slice(&(r.value.len() as u32).to_be_bytes());
    out.extend_from_slice(r.value);
    Ok(())
}

/// Appends a whole request frame to `out`. On error `out` is left as it was.
pub fn encode_request(
    out: &mut Vec<u8>,
    request_id: u32,
    req: &Request<'_>,
) -> Result<(), ProtocolError> {
    let start = start_frame(out, request_id, req.api_key() as u16);
    let r = encode_request_payload(out, req).and_then(|()| finish_frame(out, start));
    if r.is_err() {
        out.truncate(start);
    }
    r
}

fn encode_request_payload(out: &mut Vec<u8>, req: &Request<'_>) -> Result<(), ProtocolError> {
    match req {
        Request::Handshake {
            min_version,
            max_version,
            token,
        } => {
            out.extend_from_slice(&min_version.to_be_bytes());
            out.extend_from_slice(&max_version.to_be_bytes());
            keys::put_token(out, *token)?;
        }
        Request::Produce { topic, partitions } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            put_count(
                out,
                "partitions",
                partitions.len(),
                PARTITIONS_PER_MESSAGE_MAX,
            )?;
            for p in partitions {
                out.extend_from_slice(&p.partition.to_be_bytes());
                put_count(out, "records", p.records.len(), RECORDS_PER_PARTITION_MAX)?;
                for r in &p.records {
                    put_record(out, r)?;
                }
            }
        }
        Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
        } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(&max_bytes.to_be_bytes());
            out.extend_from_slice(&max_wait_ms.to_be_bytes());
        }
        Request::ListOffsets { topic }
        | Request::DeleteTopic { topic }
        | Request::DescribeTopic { topic } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
        }
        Request::CreateTopic {
            topic,
            partitions,
            settings,
        } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            out.extend_from_slice(&partitions.to_be_bytes());
            put_settings(out, settings)?;
        }
        Request::AlterTopic { topic, settings } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            put_settings(out, settings)?;
        }
        Request::ListTopics | Request::Stats | Request::ClusterStatus => {}
        Request::SchemaRegister { .. }
        | Request::SchemaGet { .. }
        | Request::SchemaList
        | Request::SchemaCheck { .. }
        | Request::SchemaDelete { .. } => {
            schemas::encode_request(out, req)?;
        }
        Request::Group(g) => groups::encode_request(out, g)?,
        Request::Producer(p) => producers::encode_request(out, p)?,
        Request::Key(k) => keys::encode_request(out, k)?,
    }
    Ok(())
}

/// Appends a whole response frame to `out`. A `body` is written only when `code` is
/// NONE; `message` is clipped to [`MESSAGE_BYTES_MAX`]. On error `out` is left as it was.
pub fn encode_response(
    out: &mut Vec<u8>,
    request_id: u32,
    api_key: u16,
    code: ErrorCode,
    message: &str,
    body: Option<&ResponseBody<'_>>,
) -> Result<(), ProtocolError> {
    let start = start_frame(out, request_id, api_key);
    out.extend_from_slice(&code.0.to_be_bytes());
    let r = put_str(
        out,
        "message",
        clip(message, MESSAGE_BYTES_MAX),
        MESSAGE_BYTES_MAX,
    )
    .and_then(|()| match body {
        Some(b) if code.is_ok() => encode_response_body(out, b),
        _ => Ok(()),
    })
    .and_then(|()| finish_frame(out, start));
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// An error response: no body.
pub fn encode_error(
    out: &mut Vec<u8>,
    request_id: u32,
    api_key: u16,
    code: ErrorCode,
    message: &str,
) {
    // Only a message over the frame limit could fail, and it is clipped to 4 KiB.
    let _ = encode_response(out, request_id, api_key, code, message, None);
}

fn encode_response_body(out: &mut Vec<u8>, body: &ResponseBody<'_>) -> Result<(), ProtocolError> {
    match body {
        ResponseBody::Handshake {
            version,
            frame_bytes_max,
        } => {
            out.extend_from_slice(&version.to_be_bytes());
            out.extend_from_slice(&frame_bytes_max.to_be_bytes());
        }
        ResponseBody::Produce { partitions } => {
            put_count(
                out,
                "partitions",
                partitions.len(),
                PARTITIONS_PER_MESSAGE_MAX,
            )?;
            for a in partitions {
                out.extend_from_slice(&a.partition.to_be_bytes());
                out.extend_from_slice(&a.code.0.to_be_bytes());
                put_str(
                    out,
                    "message",
                    clip(a.message, MESSAGE_BYTES_MAX),
                    MESSAGE_BYTES_MAX,
                )?;
                out.extend_from_slice(&a.base_offset.to_be_bytes());
                out.extend_from_slice(&a.last_offset.to_be_bytes());
            }
        }
        ResponseBody::Fetch {
            start_offset,
            end_offset,
            chunks,
        } => {
            out.extend_from_slice(&start_offset.to_be_bytes());
            out.extend_from_slice(&end_offset.to_be_bytes());
            put_count(out, "chunks", chunks.len(), FETCH_CHUNKS_MAX)?;
            for c in chunks {
                out.extend_from_slice(&c.generation.to_be_bytes());
                put_count(out, "chunk bytes", c.bytes.len(), FRAME_BYTES_MAX)?;
                out.extend_from_slice(c.bytes);
            }
        }
        ResponseBody::ListOffsets { partitions } => {
            put_count(
                out,
                "partitions",
                partitions.len(),
                PARTITIONS_PER_MESSAGE_MAX,
            )?;
            for p in partitions {
                out.extend_from_slice(&p.partition.to_be_bytes());
                out.extend_from_slice(&p.start_offset.to_be_bytes());
                out.extend_from_slice(&p.end_offset.to_be_bytes());
            }
        }
        ResponseBody::CreateTopic | ResponseBody::DeleteTopic => {}
        ResponseBody::ListTopics { topics } => {
            put_count(out, "topics", topics.len(), TOPICS_MAX)?;
            for t in topics {
                put_str(out, "topic", t, TOPIC_BYTES_MAX)?;
            }
        }
        ResponseBody::DescribeTopic {
            partitions,
            settings,
            cleanup,
            health,
        } => {
            put_count(
                out,
                "partitions",
                partitions.len(),
                PARTITIONS_PER_MESSAGE_MAX,
            )?;
            for p in partitions {
                out.extend_from_slice(&p.partition.to_be_bytes());
                out.extend_from_slice(&p.start_offset.to_be_bytes());
                out.extend_from_slice(&p.end_offset.to_be_bytes());
                out.extend_from_slice(&p.segments.to_be_bytes());
                out.extend_from_slice(&p.bytes.to_be_bytes());
            }
            put_settings(out, settings)?;
            // Version 3 carries the version-2 array before its own.
            let cleanup = match (cleanup, health) {
                (None, Some(_)) => Some(&[][..]),
                (c, _) => c.as_deref(),
            };
            if let Some(cleanup) = cleanup {
                put_count(out, "cleanup", cleanup.len(), PARTITIONS_PER_MESSAGE_MAX)?;
                for c in cleanup {
                    out.extend_from_slice(&c.partition.to_be_bytes());
                    for v in [c.last_retention_ms, c.last_compaction_ms] {
                        out.extend_from_slice(&v.to_be_bytes());
                    }
                    for v in [
                        c.segments_deleted,
                        c.bytes_deleted,
                        c.segments_archived,
                        c.compactions,
                        c.records_dropped,
                        c.bytes_compacted,
                    ] {
                        out.extend_from_slice(&v.to_be_bytes());
                    }
                    put_str(
                        out,
                        "last_error",
                        clip(&c.last_error, MESSAGE_BYTES_MAX),
                        MESSAGE_BYTES_MAX,
                    )?;
                }
            }
            if let Some(health) = health {
                put_count(out, "health", health.len(), PARTITIONS_PER_MESSAGE_MAX)?;
                for h in health {
                    out.extend_from_slice(&h.partition.to_be_bytes());
                    out.extend_from_slice(&h.records.to_be_bytes());
                    out.extend_from_slice(&(h.state as u16).to_be_bytes());
                    put_str(
                        out,
                        "detail",
                        clip(&h.detail, MESSAGE_BYTES_MAX),
                        MESSAGE_BYTES_MAX,
                    )?;
                    out.extend_from_slice(&h.spares.to_be_bytes());
                    out.extend_from_slice(&h.preallocated_bytes.to_be_bytes());
                }
            }
        }
        ResponseBody::AlterTopic { settings } => put_settings(out, settings)?,
        ResponseBody::ClusterStatus { json } => {
            if json.len() > CLUSTER_STATUS_BYTES_MAX as usize {
                return Err(ProtocolError::Unencodable {
                    field: "cluster status",
                    len: json.len() as u64,
                    max: u64::from(CLUSTER_STATUS_BYTES_MAX),
                });
            }
            out.extend_from_slice(&(json.len() as u32).to_be_bytes());
            out.extend_from_slice(json.as_bytes());
        }
        ResponseBody::Stats(s) => {
            out.extend_from_slice(&s.fsyncs.to_be_bytes());
            out.extend_from_slice(&s.produce_requests.to_be_bytes());
            out.extend_from_slice(&s.records_appended.to_be_bytes());
            if let Some(w) = &s.write {
                put_count(
                    out,
                    "fsync_latency_us",
                    w.fsync_latency_us.len(),
                    LATENCY_BUCKETS_MAX,
                )?;
                for b in &w.fsync_latency_us {
                    out.extend_from_slice(&b.to_be_bytes());
                }
                out.extend_from_slice(&w.rolls.to_be_bytes());
                out.extend_from_slice(&w.roll_stall_max_us.to_be_bytes());
                out.extend_from_slice(&w.zeroed_bytes.to_be_bytes());
                out.extend_from_slice(&w.spares_taken.to_be_bytes());
                out.extend_from_slice(&w.spares_returned.to_be_bytes());
            }
        }
        ResponseBody::SchemaRegister { .. }
        | ResponseBody::SchemaGet { .. }
        | ResponseBody::SchemaList { .. }
        | ResponseBody::SchemaCheck { .. }
        | ResponseBody::SchemaDelete { .. } => {
            schemas::encode_body(out, body)?;
        }
        ResponseBody::Group(g) => groups::encode_response(out, g)?,
        ResponseBody::InitProducer { producer_id, epoch } => {
            producers::encode_init_response(out, *producer_id, *epoch);
        }
        ResponseBody::Key(k) => keys::encode_response(out, k)?,
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Decoding.

/// A read position in a frame. Every read checks the remaining length first.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], at: usize) -> Self {
        Reader { buf, at }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }

    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], ProtocolError> {
        let end = self.at.checked_add(n);
        match end.and_then(|e| self.buf.get(self.at..e)) {
            Some(b) => {
                self.at += n;
                Ok(b)
            }
            None => Err(ProtocolError::Truncated {
                field,
                at: self.at,
                needed: n as u64,
                available: self.remaining(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ProtocolError> {
        let at = self.at;
        self.take(field, N)?
            .try_into()
            .map_err(|_| ProtocolError::Truncated {
                field,
                at,
                needed: N as u64,
                available: 0,
            })
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, ProtocolError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, ProtocolError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, ProtocolError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, ProtocolError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, ProtocolError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// A u16-prefixed UTF-8 string of at most `max` bytes.
    fn str(&mut self, field: &'static str, max: usize) -> Result<&'a str, ProtocolError> {
        let at = self.at;
        let len = self.u16(field)? as usize;
        if len > max {
            return Err(ProtocolError::TooLong {
                field,
                at,
                len: len as u64,
                max: max as u64,
            });
        }
        let bytes = self.take(field, len)?;
        std::str::from_utf8(bytes).map_err(|_| ProtocolError::BadUtf8 { field, at: at + 2 })
    }

    /// A u32 count of items, each at least `item_min` bytes: checked against `max`
    /// and against what remains, so a capacity built from it is bounded by the input.
    fn count(
        &mut self,
        field: &'static str,
        max: u32,
        item_min: usize,
    ) -> Result<usize, ProtocolError> {
        let at = self.at;
        let n = self.u32(field)?;
        if n > max {
            return Err(ProtocolError::TooMany {
                field,
                at,
                count: u64::from(n),
                max: u64::from(max),
            });
        }
        let need = (n as usize).saturating_mul(item_min);
        if need > self.remaining() {
            return Err(ProtocolError::Truncated {
                field,
                at: self.at,
                needed: need as u64,
                available: self.remaining(),
            });
        }
        Ok(n as usize)
    }

    fn finish(&self) -> Result<(), ProtocolError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(ProtocolError::Trailing { at: self.at, count }),
        }
    }

    fn settings(&mut self) -> Result<Vec<Setting<'a>>, ProtocolError> {
        let n = self.count("settings", SETTINGS_MAX, SETTING_WIRE_MIN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.str("setting key", SETTING_BYTES_MAX)?;
            let val = self.str("setting value", SETTING_BYTES_MAX)?;
            v.push((k, val));
        }
        Ok(v)
    }

    fn record(&mut self) -> Result<WireRecord<'a>, ProtocolError> {
        let timestamp_ms = self.i64("timestamp_ms")?;
        let at = self.at;
        let key_len = self.i32("key_len")?;
        let key = match key_len {
            -1 => None,
            k if k >= 0 && k as u32 <= RECORD_FIELD_BYTES_MAX => {
                Some(self.take("key", k as usize)?)
            }
            k if k >= 0 => {
                return Err(ProtocolError::TooLong {
                    field: "key",
                    at,
                    len: k as u64,
                    max: u64::from(RECORD_FIELD_BYTES_MAX),
                })
            }
            k => {
                return Err(ProtocolError::BadValue {
                    field: "key_len",
                    at,
                    value: i64::from(k),
                })
            }
        };
        let at = self.at;
        let value_len = self.u32("value_len")?;
        if value_len > RECORD_FIELD_BYTES_MAX {
            return Err(ProtocolError::TooLong {
                field: "value",
                at,
                len: u64::from(value_len),
                max: u64::from(RECORD_FIELD_BYTES_MAX),
            });
        }
        let value = self.take("value", value_len as usize)?;
        Ok(WireRecord {
            timestamp_ms,
            key,
            value,
        })
    }
}

/// Decodes a request frame (the bytes after `frame_len`) into its id and request.
pub fn decode_request(frame: &[u8]) -> Result<(u32, Request<'_>), ProtocolError> {
    let mut r = Reader::new(frame, 0);
    let request_id = r.u32("request_id")?;
    let key = r.u16("api_key")?;
    let api = ApiKey::from_u16(key).ok_or(ProtocolError::UnknownApi { key })?;
    let req = match api {
        ApiKey::Handshake => {
            let min_version = r.u16("min_version")?;
            let max_version = r.u16("max_version")?;
            Request::Handshake {
                min_version,
                max_version,
                token: keys::read_token(&mut r, max_version)?,
            }
        }
        ApiKey::Produce => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let n = r.count(
                "partitions",
                PARTITIONS_PER_MESSAGE_MAX,
                PARTITION_BATCH_MIN,
            )?;
            let mut partitions = Vec::with_capacity(n);
            for _ in 0..n {
                let partition = r.u32("partition")?;
                let m = r.count("records", RECORDS_PER_PARTITION_MAX, RECORD_WIRE_MIN)?;
                let mut records = Vec::with_capacity(m);
                for _ in 0..m {
                    records.push(r.record()?);
                }
                partitions.push(PartitionBatch { partition, records });
            }
            Request::Produce { topic, partitions }
        }
        ApiKey::Fetch => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let partition = r.u32("partition")?;
            let offset = r.u64("offset")?;
            let at = r.at;
            let max_bytes = r.u32("max_bytes")?;
            if max_bytes == 0 || max_bytes > FETCH_BYTES_MAX {
                return Err(ProtocolError::BadValue {
                    field: "max_bytes",
                    at,
                    value: i64::from(max_bytes),
                });
            }
            let at = r.at;
            let max_wait_ms = r.u32("max_wait_ms")?;
            if max_wait_ms > FETCH_WAIT_MS_MAX {
                return Err(ProtocolError::BadValue {
                    field: "max_wait_ms",
                    at,
                    value: i64::from(max_wait_ms),
                });
            }
            Request::Fetch {
                topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
            }
        }
        ApiKey::ListOffsets => Request::ListOffsets {
            topic: r.str("topic", TOPIC_BYTES_MAX)?,
        },
        ApiKey::CreateTopic => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let partitions = r.u32("partitions")?;
            Request::CreateTopic {
                topic,
                partitions,
                settings: r.settings()?,
            }
        }
        ApiKey::DeleteTopic => Request::DeleteTopic {
            topic: r.str("topic", TOPIC_BYTES_MAX)?,
        },
        ApiKey::ListTopics => Request::ListTopics,
        ApiKey::DescribeTopic => Request::DescribeTopic {
            topic: r.str("topic", TOPIC_BYTES_MAX)?,
        },
        ApiKey::AlterTopic => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            Request::AlterTopic {
                topic,
                settings: r.settings()?,
            }
        }
        ApiKey::Stats => Request::Stats,
        ApiKey::ClusterStatus => Request::ClusterStatus,
        ApiKey::SchemaRegister => schemas::decode_register(&mut r)?,
        ApiKey::SchemaGet => schemas::decode_get(&mut r)?,
        ApiKey::SchemaList => Request::SchemaList,
        ApiKey::SchemaCheck => schemas::decode_check(&mut r)?,
        ApiKey::SchemaDelete => schemas::decode_delete(&mut r)?,
        k if k.is_group() => Request::Group(groups::decode_request(k, &mut r)?),
        k @ (ApiKey::InitProducer | ApiKey::IdempotentProduce) => {
            Request::Producer(producers::decode_request(k, &mut r)?)
        }
        k @ (ApiKey::KeyCreate | ApiKey::KeyList | ApiKey::KeyRevoke) => {
            Request::Key(keys::decode_request(k, &mut r)?)
        }
        k => return Err(ProtocolError::UnknownApi { key: k as u16 }),
    };
    r.finish()?;
    Ok((request_id, req))
}

/// Decodes a response frame (the bytes after `frame_len`) as the newest protocol
/// version lays it out.
pub fn decode_response(frame: &[u8]) -> Result<Response<'_>, ProtocolError> {
    decode_response_version(frame, PROTOCOL_VERSION)
}

/// Decodes a response frame of a connection that agreed on protocol `version`.
pub fn decode_response_version(frame: &[u8], version: u16) -> Result<Response<'_>, ProtocolError> {
    let mut r = Reader::new(frame, 0);
    let request_id = r.u32("request_id")?;
    let api_key = r.u16("api_key")?;
    let code = ErrorCode(r.u16("code")?);
    let message = r.str("message", MESSAGE_BYTES_MAX)?;
    let body = if code.is_ok() {
        let api = ApiKey::from_u16(api_key).ok_or(ProtocolError::UnknownApi { key: api_key })?;
        Some(decode_response_body(&mut r, api, version)?)
    } else {
        None
    };
    r.finish()?;
    Ok(Response {
        request_id,
        api_key,
        code,
        message,
        body,
    })
}

fn decode_response_body<'a>(
    r: &mut Reader<'a>,
    api: ApiKey,
    version: u16,
) -> Result<ResponseBody<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::Handshake => ResponseBody::Handshake {
            version: r.u16("version")?,
            frame_bytes_max: r.u32("frame_bytes_max")?,
        },
        ApiKey::Produce | ApiKey::IdempotentProduce => {
            let n = r.count("partitions", PARTITIONS_PER_MESSAGE_MAX, ACK_WIRE_MIN)?;
            let mut partitions = Vec::with_capacity(n);
            for _ in 0..n {
                let partition = r.u32("partition")?;
                let code = ErrorCode(r.u16("code")?);
                let message = r.str("message", MESSAGE_BYTES_MAX)?;
                let base_offset = r.u64("base_offset")?;
                let last_offset = r.u64("last_offset")?;
                partitions.push(PartitionAck {
                    partition,
                    code,
                    message,
                    base_offset,
                    last_offset,
                });
            }
            ResponseBody::Produce { partitions }
        }
        ApiKey::Fetch => {
            let start_offset = r.u64("start_offset")?;
            let end_offset = r.u64("end_offset")?;
            let n = r.count("chunks", FETCH_CHUNKS_MAX, CHUNK_WIRE_MIN)?;
            let mut chunks = Vec::with_capacity(n);
            for _ in 0..n {
                let generation = r.u64("generation")?;
                let len = r.u32("chunk_len")?;
                let bytes = r.take("chunk", len as usize)?;
                chunks.push(Chunk { generation, bytes });
            }
            ResponseBody::Fetch {
                start_offset,
                end_offset,
                chunks,
            }
        }
        ApiKey::ListOffsets => {
            let n = r.count("partitions", PARTITIONS_PER_MESSAGE_MAX, OFFSETS_WIRE_LEN)?;
            let mut partitions = Vec::with_capacity(n);
            for _ in 0..n {
                partitions.push(PartitionOffsets {
                    partition: r.u32("partition")?,
                    start_offset: r.u64("start_offset")?,
                    end_offset: r.u64("end_offset")?,
                });
            }
            ResponseBody::ListOffsets { partitions }
        }
        ApiKey::CreateTopic => ResponseBody::CreateTopic,
        ApiKey::DeleteTopic => ResponseBody::DeleteTopic,
        ApiKey::ListTopics => {
            let n = r.count("topics", TOPICS_MAX, STRING_WIRE_MIN)?;
            let mut topics = Vec::with_capacity(n);
            for _ in 0..n {
                topics.push(r.str("topic", TOPIC_BYTES_MAX)?);
            }
            ResponseBody::ListTopics { topics }
        }
        ApiKey::DescribeTopic => {
            let n = r.count("partitions", PARTITIONS_PER_MESSAGE_MAX, INFO_WIRE_LEN)?;
            let mut partitions = Vec::with_capacity(n);
            for _ in 0..n {
                partitions.push(PartitionDescription {
                    partition: r.u32("partition")?,
                    start_offset: r.u64("start_offset")?,
                    end_offset: r.u64("end_offset")?,
                    segments: r.u64("segments")?,
                    bytes: r.u64("bytes")?,
                });
            }
            let settings = r.settings()?;
            // Version 2 on: the cleanup array follows.
            let cleanup = if version >= CLEANUP_INFO_VERSION {
                let n = r.count("cleanup", PARTITIONS_PER_MESSAGE_MAX, CLEANUP_WIRE_MIN)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let partition = r.u32("partition")?;
                    let last_retention_ms = r.i64("last_retention_ms")?;
                    let last_compaction_ms = r.i64("last_compaction_ms")?;
                    v.push(CleanupInfo {
                        partition,
                        last_retention_ms,
                        last_compaction_ms,
                        segments_deleted: r.u64("segments_deleted")?,
                        bytes_deleted: r.u64("bytes_deleted")?,
                        segments_archived: r.u64("segments_archived")?,
                        compactions: r.u64("compactions")?,
                        records_dropped: r.u64("records_dropped")?,
                        bytes_compacted: r.u64("bytes_compacted")?,
                        last_error: r.str("last_error", MESSAGE_BYTES_MAX)?.to_string(),
                    });
                }
                Some(v)
            } else {
                None
            };
            // Version 3 on: the health array follows.
            let health = if version >= PARTITION_HEALTH_VERSION {
                let n = r.count("health", PARTITIONS_PER_MESSAGE_MAX, HEALTH_WIRE_MIN)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let partition = r.u32("partition")?;
                    let records = r.u64("records")?;
                    let at = r.at;
                    let raw = r.u16("state")?;
                    let state = HealthState::from_u16(raw).ok_or(ProtocolError::BadValue {
                        field: "state",
                        at,
                        value: i64::from(raw),
                    })?;
                    v.push(PartitionHealth {
                        partition,
                        records,
                        state,
                        detail: r.str("detail", MESSAGE_BYTES_MAX)?.to_string(),
                        spares: r.u64("spares")?,
                        preallocated_bytes: r.u64("preallocated_bytes")?,
                    });
                }
                Some(v)
            } else {
                None
            };
            ResponseBody::DescribeTopic {
                partitions,
                settings,
                cleanup,
                health,
            }
        }
        ApiKey::AlterTopic => ResponseBody::AlterTopic {
            settings: r.settings()?,
        },
        ApiKey::ClusterStatus => {
            let at = r.at;
            let len = r.u32("cluster status")?;
            if len > CLUSTER_STATUS_BYTES_MAX {
                return Err(ProtocolError::TooLong {
                    field: "cluster status",
                    at,
                    len: u64::from(len),
                    max: u64::from(CLUSTER_STATUS_BYTES_MAX),
                });
            }
            let bytes = r.take("cluster status", len as usize)?;
            let json = std::str::from_utf8(bytes).map_err(|_| ProtocolError::BadUtf8 {
                field: "cluster status",
                at: at + 4,
            })?;
            ResponseBody::ClusterStatus { json }
        }
        ApiKey::Stats => {
            let fsyncs = r.u64("fsyncs")?;
            let produce_requests = r.u64("produce_requests")?;
            let records_appended = r.u64("records_appended")?;
            let write = if version >= WRITE_STATS_VERSION {
                let n = r.count("fsync_latency_us", LATENCY_BUCKETS_MAX, 8)?;
                let mut buckets = Vec::with_capacity(n);
                for _ in 0..n {
                    buckets.push(r.u64("fsync_latency_us")?);
                }
                Some(WriteStats {
                    fsync_latency_us: buckets,
                    rolls: r.u64("rolls")?,
                    roll_stall_max_us: r.u64("roll_stall_max_us")?,
                    zeroed_bytes: r.u64("zeroed_bytes")?,
                    spares_taken: r.u64("spares_taken")?,
                    spares_returned: r.u64("spares_returned")?,
                })
            } else {
                None
            };
            ResponseBody::Stats(StatsBody {
                fsyncs,
                produce_requests,
                records_appended,
                write,
            })
        }
        ApiKey::SchemaRegister => schemas::decode_register_body(r)?,
        ApiKey::SchemaGet => schemas::decode_get_body(r)?,
        ApiKey::SchemaList => schemas::decode_list_body(r)?,
        ApiKey::SchemaCheck => schemas::decode_check_body(r)?,
        ApiKey::SchemaDelete => schemas::decode_delete_body(r)?,
        k if k.is_group() => ResponseBody::Group(groups::decode_response(k, r)?),
        ApiKey::InitProducer => {
            let (producer_id, epoch) = producers::decode_init_response(r)?;
            ResponseBody::InitProducer { producer_id, epoch }
        }
        k @ (ApiKey::KeyCreate | ApiKey::KeyList | ApiKey::KeyRevoke) => {
            ResponseBody::Key(keys::decode_response(k, r)?)
        }
        // Unreachable: every key is matched above.
        k => return Err(ProtocolError::UnknownApi { key: k as u16 }),
    })
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn sample_requests() -> Vec<Request<'static>> {
        vec![
            Request::Handshake {
                min_version: 1,
                max_version: 3,
                token: None,
            },
            Request::Produce {
                topic: "orders",
                partitions: vec![
                    PartitionBatch {
                        partition: 0,
                        records: vec![
                            WireRecord {
                                timestamp_ms: 1_700_000_000_000,
                                key: Some(b"k1"),
                                value: b"v1",
                            },
                            WireRecord {
                                timestamp_ms: -5,
                                key: None,
                                value: b"",
                            },
                            WireRecord {
                                timestamp_ms: 0,
                                key: Some(b""),
                                value: &[0xff, 0, 1],
                            },
                        ],
                    },
                    PartitionBatch {
                        partition: 7,
                        records: vec![],
                    },
                ],
            },
            Request::Fetch {
                topic: "t",
                partition: 3,
                offset: u64::MAX,
                max_bytes: 1 << 20,
                max_wait_ms: 500,
            },
            Request::ListOffsets { topic: "t.x-y_z" },
            Request::CreateTopic {
                topic: "new",
                partitions: 4,
                settings: vec![("retention_ms", "-1")],
            },
            Request::DeleteTopic { topic: "old" },
            Request::ListTopics,
            Request::DescribeTopic { topic: "d" },
            Request::AlterTopic {
                topic: "a",
                settings: vec![("cleanup_policy", "compact"), ("segment_bytes", "1048576")],
            },
            Request::Stats,
            Request::SchemaRegister {
                topic: "orders",
                compatibility: "full",
                schema: "{\"type\":\"object\"}",
            },
            Request::SchemaRegister {
                topic: "orders",
                compatibility: "",
                schema: "",
            },
            Request::SchemaGet {
                topic: "orders",
                version: 0,
            },
            Request::SchemaList,
            Request::SchemaCheck {
                topic: "o",
                schema: "true",
            },
            Request::SchemaDelete {
                topic: "o",
                version: 7,
            },
        ]
        .into_iter()
        .chain(
            groups::tests::sample_requests()
                .into_iter()
                .map(Request::Group),
        )
        .chain([
            Request::Producer(producers::ProducerRequest::InitProducer {
                producer_id: -1,
                epoch: 0,
            }),
            Request::Producer(producers::ProducerRequest::Produce {
                topic: "t",
                producer_id: 9,
                epoch: 2,
                partitions: vec![(
                    5,
                    PartitionBatch {
                        partition: 1,
                        records: vec![WireRecord {
                            timestamp_ms: 3,
                            key: Some(b"k"),
                            value: b"v",
                        }],
                    },
                )],
            }),
        ])
        .collect()
    }

    fn sample_responses() -> Vec<ResponseBody<'static>> {
        vec![
            ResponseBody::Handshake {
                version: 1,
                frame_bytes_max: FRAME_BYTES_MAX,
            },
            ResponseBody::Produce {
                partitions: vec![
                    PartitionAck {
                        partition: 0,
                        code: ErrorCode::NONE,
                        message: "",
                        base_offset: 10,
                        last_offset: 12,
                    },
                    PartitionAck {
                        partition: 9,
                        code: ErrorCode::UNKNOWN_PARTITION,
                        message: "no partition 9",
                        base_offset: 0,
                        last_offset: 0,
                    },
                ],
            },
            ResponseBody::Fetch {
                start_offset: 0,
                end_offset: 100,
                chunks: vec![
                    Chunk {
                        generation: 3,
                        bytes: b"abc",
                    },
                    Chunk {
                        generation: 0,
                        bytes: b"",
                    },
                ],
            },
            ResponseBody::ListOffsets {
                partitions: vec![PartitionOffsets {
                    partition: 0,
                    start_offset: 1,
                    end_offset: 2,
                }],
            },
            ResponseBody::CreateTopic,
            ResponseBody::DeleteTopic,
            ResponseBody::ListTopics {
                topics: vec!["a", "b", "c"],
            },
            ResponseBody::DescribeTopic {
                partitions: vec![PartitionDescription {
                    partition: 1,
                    start_offset: 2,
                    end_offset: 3,
                    segments: 4,
                    bytes: 5,
                }],
                settings: vec![("segment_bytes", "1024")],
                cleanup: None,
                health: None,
            },
            ResponseBody::DescribeTopic {
                partitions: vec![],
                settings: vec![],
                cleanup: Some(vec![CleanupInfo {
                    partition: 0,
                    last_retention_ms: -1,
                    segments_deleted: 2,
                    bytes_deleted: 3,
                    segments_archived: 4,
                    last_compaction_ms: 5,
                    compactions: 6,
                    records_dropped: 7,
                    bytes_compacted: 8,
                    last_error: "cold storage full".into(),
                }]),
                health: None,
            },
            ResponseBody::DescribeTopic {
                partitions: vec![],
                settings: vec![],
                cleanup: Some(vec![]),
                health: Some(vec![
                    PartitionHealth {
                        partition: 0,
                        records: 26,
                        state: HealthState::Ok,
                        detail: String::new(),
                        spares: 0,
                        preallocated_bytes: 0,
                    },
                    PartitionHealth {
                        partition: 1,
                        records: 7,
                        state: HealthState::Damaged,
                        detail: "offsets 100..=199 lost".into(),
                        spares: 2,
                        preallocated_bytes: 3,
                    },
                ]),
            },
            ResponseBody::AlterTopic { settings: vec![] },
            ResponseBody::Stats(StatsBody {
                fsyncs: 1,
                produce_requests: 2,
                records_appended: 3,
                write: Some(WriteStats {
                    fsync_latency_us: vec![0, 4, 9],
                    rolls: 5,
                    roll_stall_max_us: 6,
                    zeroed_bytes: 7,
                    spares_taken: 8,
                    spares_returned: 9,
                }),
            }),
            ResponseBody::SchemaRegister { version: 9 },
            ResponseBody::SchemaGet {
                version: 2,
                compatibility: "backward",
                schema: "{}",
            },
            ResponseBody::SchemaList {
                topics: vec![
                    SchemaSubjectInfo {
                        topic: "a",
                        compatibility: "none",
                        versions: vec![1, 3],
                    },
                    SchemaSubjectInfo {
                        topic: "b",
                        compatibility: "full",
                        versions: vec![],
                    },
                ],
            },
            ResponseBody::SchemaList { topics: vec![] },
            ResponseBody::SchemaCheck {
                compatible: false,
                reason: "at /type: type narrowed",
            },
            ResponseBody::SchemaCheck {
                compatible: true,
                reason: "",
            },
            ResponseBody::SchemaDelete {
                versions: vec![1, 2],
            },
        ]
        .into_iter()
        .chain(
            groups::tests::sample_responses()
                .into_iter()
                .map(ResponseBody::Group),
        )
        .chain([ResponseBody::InitProducer {
            producer_id: 4,
            epoch: 1,
        }])
        .collect()
    }

    /// The protocol version a sample response is encoded for.
    fn version_for(body: &ResponseBody<'_>) -> u16 {
        match body {
            ResponseBody::DescribeTopic { cleanup: None, .. } => 1,
            ResponseBody::DescribeTopic { health: None, .. } => 2,
            _ => PROTOCOL_VERSION,
        }
    }

    fn request_frame(id: u32, req: &Request<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_request(&mut out, id, req).unwrap();
        out
    }

    fn response_frame(id: u32, body: &ResponseBody<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_response(
            &mut out,
            id,
            body.api_key() as u16,
            ErrorCode::NONE,
            "",
            Some(body),
        )
        .unwrap();
        out
    }

    #[test]
    fn requests_round_trip() {
        for (i, req) in sample_requests().iter().enumerate() {
            let frame = request_frame(i as u32 + 100, req);
            let len = u32::from_be_bytes(frame[..4].try_into().unwrap());
            assert_eq!(len as usize, frame.len() - 4);
            assert_eq!(check_frame_len(len).unwrap(), frame.len() - 4);
            assert_eq!(
                frame_head(&frame[4..]),
                Some((i as u32 + 100, req.api_key() as u16))
            );
            let (id, back) = decode_request(&frame[4..]).unwrap();
            assert_eq!((id, &back), (i as u32 + 100, req));
        }
    }

    #[test]
    fn responses_round_trip() {
        for (i, body) in sample_responses().iter().enumerate() {
            let frame = response_frame(i as u32, body);
            let resp = decode_response_version(&frame[4..], version_for(body)).unwrap();
            assert_eq!(resp.request_id, i as u32);
            assert_eq!(resp.api_key, body.api_key() as u16);
            assert_eq!(resp.code, ErrorCode::NONE);
            assert_eq!(resp.body.as_ref(), Some(body));
        }
    }

    #[test]
    fn error_responses_have_no_body() {
        let mut out = Vec::new();
        let body = ResponseBody::ListTopics { topics: vec!["x"] };
        encode_response(
            &mut out,
            5,
            ApiKey::ListTopics as u16,
            ErrorCode::UNKNOWN_TOPIC,
            "no such topic",
            Some(&body),
        )
        .unwrap();
        let resp = decode_response(&out[4..]).unwrap();
        assert_eq!(resp.code, ErrorCode::UNKNOWN_TOPIC);
        assert_eq!(resp.message, "no such topic");
        assert_eq!(resp.body, None);
        // A frame the server could not read: api key NONE, still decodable.
        let mut out = Vec::new();
        encode_error(
            &mut out,
            0,
            API_KEY_NONE,
            ErrorCode::FRAME_TOO_LARGE,
            &"é".repeat(5000),
        );
        let resp = decode_response(&out[4..]).unwrap();
        assert_eq!(resp.code, ErrorCode::FRAME_TOO_LARGE);
        assert!(resp.message.len() <= MESSAGE_BYTES_MAX && resp.message.starts_with('é'));
        assert!(resp.code.closes_connection());
        assert!(!ErrorCode::UNKNOWN_TOPIC.closes_connection());
    }

    /// Golden bytes of a small request, so a change to the layout is noticed here
    /// and in docs/PROTOCOL.md together.
    #[test]
    fn golden_fetch_request() {
        let frame = request_frame(
            7,
            &Request::Fetch {
                topic: "t",
                partition: 2,
                offset: 5,
                max_bytes: 4096,
                max_wait_ms: 100,
            },
        );
        let expected: Vec<u8> = [
            &[0, 0, 0, 29][..],        // frame_len
            &[0, 0, 0, 7],             // request_id
            &[0, 2],                   // api_key fetch
            &[0, 1, b't'],             // topic
            &[0, 0, 0, 2],             // partition
            &[0, 0, 0, 0, 0, 0, 0, 5], // offset
            &[0, 0, 0x10, 0],          // max_bytes
            &[0, 0, 0, 100],           // max_wait_ms
        ]
        .concat();
        assert_eq!(frame, expected);
        let frame = request_frame(
            1,
            &Request::Handshake {
                min_version: 1,
                max_version: 1,
                token: None,
            },
        );
        assert_eq!(frame, [0, 0, 0, 10, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1]);
    }

    #[test]
    fn every_request_truncation_is_rejected() {
        for req in sample_requests() {
            let frame = request_frame(1, &req);
            let body = &frame[4..];
            for cut in 0..body.len() {
                assert!(
                    decode_request(&body[..cut]).is_err(),
                    "{req:?} cut at {cut} accepted"
                );
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(
                matches!(decode_request(&longer), Err(ProtocolError::Trailing { .. })),
                "{req:?}"
            );
        }
    }

    #[test]
    fn every_response_truncation_is_rejected() {
        for body in sample_responses() {
            let frame = response_frame(1, &body);
            let b = &frame[4..];
            for cut in 0..b.len() {
                assert!(
                    decode_response_version(&b[..cut], version_for(&body)).is_err(),
                    "{body:?} cut at {cut} accepted"
                );
            }
            let mut longer = b.to_vec();
            longer.push(0);
            assert!(
                matches!(
                    decode_response_version(&longer, version_for(&body)),
                    Err(ProtocolError::Trailing { .. })
                ),
                "{body:?}"
            );
        }
    }

    #[test]
    fn not_leader_messages_parse() {
        let m = not_leader_message("t", 3, Some((2, "127.0.0.1:9001")));
        assert_eq!(m, "not the leader of t/3; leader: node 2 at 127.0.0.1:9001");
        assert_eq!(
            parse_not_leader(&m),
            Some((2, "127.0.0.1:9001".to_string()))
        );
        let m = not_leader_message("t", 3, None);
        assert_eq!(m, "not the leader of t/3; leader: unknown");
        assert_eq!(parse_not_leader(&m), None);
        assert_eq!(parse_not_leader("leader: node x at y"), None);
        assert_eq!(parse_not_leader("a; leader: node 1 at "), None);
    }

    #[test]
    fn frame_lengths() {
        assert!(check_frame_len(0).is_err());
        assert!(check_frame_len(5).is_err());
        assert_eq!(check_frame_len(6).unwrap(), 6);
        assert!(check_frame_len(FRAME_BYTES_MAX).is_ok());
        assert!(check_frame_len(FRAME_BYTES_MAX + 1).is_err());
        assert!(check_frame_len(u32::MAX).is_err());
        assert_eq!(frame_head(&[0, 0, 0, 1, 0]), None);
    }

    /// Huge counts and lengths in a short frame are refused before any allocation:
    /// the limit check, or the check against the bytes remaining, fires first.
    #[test]
    fn oversize_counts_and_lengths_are_rejected() {
        fn produce_head(topic: &str) -> Vec<u8> {
            let mut b = vec![0, 0, 0, 1, 0, 1];
            b.extend_from_slice(&(topic.len() as u16).to_be_bytes());
            b.extend_from_slice(topic.as_bytes());
            b
        }
        // Partition count over the limit.
        let mut b = produce_head("t");
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooMany {
                field: "partitions",
                ..
            })
        ));
        // Within the limit but more than the remaining bytes could hold.
        let mut b = produce_head("t");
        b.extend_from_slice(&PARTITIONS_PER_MESSAGE_MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Truncated {
                field: "partitions",
                ..
            })
        ));
        // Record count.
        let mut b = produce_head("t");
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&(RECORDS_PER_PARTITION_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooMany {
                field: "records",
                ..
            })
        ));
        let mut b = produce_head("t");
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&RECORDS_PER_PARTITION_MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Truncated {
                field: "records",
                ..
            })
        ));
        // Key and value lengths.
        let record_prefix = |b: &mut Vec<u8>| {
            b.extend_from_slice(&1u32.to_be_bytes());
            b.extend_from_slice(&0u32.to_be_bytes());
            b.extend_from_slice(&1u32.to_be_bytes());
            b.extend_from_slice(&0i64.to_be_bytes());
        };
        for (key_len, expect_field) in [(i32::MAX, "key"), (-2, "key_len"), (i32::MIN, "key_len")] {
            let mut b = produce_head("t");
            record_prefix(&mut b);
            b.extend_from_slice(&key_len.to_be_bytes());
            b.extend_from_slice(&[0; 8]);
            let e = decode_request(&b).unwrap_err();
            assert!(
                matches!(e, ProtocolError::TooLong { field, .. } | ProtocolError::BadValue { field, .. } if field == expect_field),
                "{key_len}: {e:?}"
            );
        }
        let mut b = produce_head("t");
        record_prefix(&mut b);
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&(RECORD_FIELD_BYTES_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooLong { field: "value", .. })
        ));
        let mut b = produce_head("t");
        record_prefix(&mut b);
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&RECORD_FIELD_BYTES_MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Truncated { field: "value", .. })
        ));
        // Topic name longer than the limit.
        let mut b = vec![0, 0, 0, 1, 0, 3];
        b.extend_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooLong { field: "topic", .. })
        ));
        // Settings count.
        let mut b = vec![0, 0, 0, 1, 0, 8, 0, 1, b'a'];
        b.extend_from_slice(&(SETTINGS_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooMany {
                field: "settings",
                ..
            })
        ));
        // Fetch limits.
        for (max_bytes, wait) in [
            (0u32, 0u32),
            (FETCH_BYTES_MAX + 1, 0),
            (1, FETCH_WAIT_MS_MAX + 1),
        ] {
            let mut b = vec![0, 0, 0, 1, 0, 2, 0, 1, b't', 0, 0, 0, 0];
            b.extend_from_slice(&0u64.to_be_bytes());
            b.extend_from_slice(&max_bytes.to_be_bytes());
            b.extend_from_slice(&wait.to_be_bytes());
            assert!(
                matches!(decode_request(&b), Err(ProtocolError::BadValue { .. })),
                "{max_bytes} {wait}"
            );
        }
        // Responses: chunk count, chunk length, topic count.
        let mut b = vec![0, 0, 0, 1, 0, 2, 0, 0, 0, 0];
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::TooMany {
                field: "chunks",
                ..
            })
        ));
        let mut b = vec![0, 0, 0, 1, 0, 2, 0, 0, 0, 0];
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::Truncated { field: "chunk", .. })
        ));
        let mut b = vec![0, 0, 0, 1, 0, 6, 0, 0, 0, 0];
        b.extend_from_slice(&(TOPICS_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::TooMany {
                field: "topics",
                ..
            })
        ));
        let mut b = vec![0, 0, 0, 1, 0, 0, 0, 0];
        b.extend_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::TooLong {
                field: "message",
                ..
            })
        ));
    }

    #[test]
    fn bad_utf8_and_unknown_api() {
        let b = [0, 0, 0, 1, 0, 3, 0, 2, 0xc3, 0x28];
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::BadUtf8 { field: "topic", .. })
        ));
        assert!(matches!(
            decode_request(&[0, 0, 0, 1, 0, 99]),
            Err(ProtocolError::UnknownApi { key: 99 })
        ));
        assert!(matches!(
            decode_request(&[0, 0, 0, 1, 0xff, 0xff]),
            Err(ProtocolError::UnknownApi { .. })
        ));
        // A success response for an api nobody knows cannot be decoded.
        assert!(matches!(
            decode_response(&[0, 0, 0, 1, 0, 99, 0, 0, 0, 0]),
            Err(ProtocolError::UnknownApi { .. })
        ));
    }

    #[test]
    fn encoders_refuse_what_decoders_would() {
        let long = "x".repeat(TOPIC_BYTES_MAX + 1);
        let mut out = vec![1, 2, 3];
        assert!(encode_request(&mut out, 1, &Request::DeleteTopic { topic: &long }).is_err());
        assert_eq!(
            out,
            [1, 2, 3],
            "a failed encode leaves the buffer as it was"
        );
        let settings: Vec<Setting<'_>> = (0..=SETTINGS_MAX).map(|_| ("a", "b")).collect();
        assert!(encode_request(
            &mut out,
            1,
            &Request::AlterTopic {
                topic: "t",
                settings
            }
        )
        .is_err());
        assert_eq!(out, [1, 2, 3]);
    }

    /// Arbitrary bytes never panic either decoder; a seeded generator keeps it
    /// reproducible without a property-testing dependency in this module.
    #[test]
    fn random_bytes_never_panic() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let frames: Vec<Vec<u8>> = sample_requests()
            .iter()
            .map(|r| request_frame(1, r))
            .chain(sample_responses().iter().map(|b| response_frame(1, b)))
            .collect();
        for round in 0..20_000 {
            let base = &frames[round % frames.len()][4..];
            let mut b = base.to_vec();
            for _ in 0..(next() % 4 + 1) {
                if b.is_empty() {
                    break;
                }
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            let _ = decode_request(&b);
            let _ = decode_response(&b);
        }
    }

    proptest::proptest! {
        /// Any produce request survives encode → decode unchanged, and every cut of
        /// its frame is refused.
        #[test]
        fn produce_requests_round_trip(
            topic in "[a-z0-9._-]{1,40}",
            batches in proptest::collection::vec(
                (0u32..2000, proptest::collection::vec(
                    (proptest::prelude::any::<i64>(),
                     proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20)),
                     proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)),
                    0..6)),
                0..4),
        ) {
            let partitions: Vec<PartitionBatch<'_>> = batches
                .iter()
                .map(|(p, recs)| PartitionBatch {
                    partition: *p,
                    records: recs
                        .iter()
                        .map(|(ts, k, v)| WireRecord { timestamp_ms: *ts, key: k.as_deref(), value: v })
                        .collect(),
                })
                .collect();
            let req = Request::Produce { topic: &topic, partitions };
            let frame = request_frame(42, &req);
            let (id, back) = decode_request(&frame[4..]).unwrap();
            proptest::prop_assert_eq!(id, 42);
            proptest::prop_assert_eq!(&back, &req);
            for cut in 0..frame.len() - 4 {
                proptest::prop_assert!(decode_request(&frame[4..4 + cut]).is_err());
            }
        }

        /// Arbitrary bytes never panic the decoders.
        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }
    }
}
