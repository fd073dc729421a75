//! The Kafka wire protocol in front of the same broker: a second listener
//! (`serve --kafka-listen`) whose requests are decoded and whose responses are encoded
//! by the `kafka-protocol` crate (generated from Kafka's own message schemas). This
//! module holds the table of served APIs and versions and the frame-level decode and
//! encode; [`server`] accepts connections and runs each one's request loop; one file
//! per API family maps requests to [`crate::engine::broker::Broker`] calls.
//!
//! Invariants:
//! - Only the versions in [`SERVED`] are advertised and answered; any other API or
//!   version gets a log line, and the connection is closed (ApiVersions: a version 0
//!   UNSUPPORTED_VERSION response listing [`SERVED`], as Kafka does).
//! - A frame's length is checked against [`REQUEST_BYTES_MAX`] before anything is
//!   allocated for it; a batch's record count is checked before its records are
//!   decoded. Inside a frame, the vendored kafka-protocol (vendor/kafka-protocol,
//!   PATCHES.md) refuses an array, record or header count larger than the bytes
//!   left and reserves at most 1024 elements ahead, so a hostile count is a decode
//!   error (a log line and a close), not an allocation; strings and bytes are
//!   sliced from the frame after their length is checked (fuzz target
//!   `kafka_request`).
//! - Kafka offsets are seglog offsets; one Kafka record batch is one engine append.
//! - A produce with acks 1 or -1 is answered after its records are durable.

mod acl;
mod fetch;
mod groups;
mod inflate;
mod metadata;
mod offsets;
mod produce;
mod sasl;
pub mod server;

pub use groups::consumer_assignment_partitions;
pub use sasl::parse_plain;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

pub use inflate::{InflateError, KAFKA_BATCH_INFLATED_BYTES_MAX};
pub use server::{KafkaOptions, KafkaServer};

/// Why a transactional id is refused (FindCoordinator's error message and the log).
pub(crate) const NO_TRANSACTIONS: &str =
    "transactional ids are not supported (idempotence only): unset transactional.id";

/// Largest request frame accepted (the bytes after the 4-byte size): the native
/// listener's frame limit, so both doors refuse the same sizes.
pub const REQUEST_BYTES_MAX: u32 = crate::format::wire::FRAME_BYTES_MAX;

/// Size of the frame's length prefix.
pub const LEN_FIELD: usize = 4;

/// The node id of this broker in Metadata and FindCoordinator (a broker without
/// `--peers`; a cluster node is its `--node-id`).
pub const NODE_ID: i32 = 0;

/// Every API served, with the version range actually implemented (min, max).
pub const SERVED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 5),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// Kafka error codes the listener answers with.
pub mod code {
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_CONFIG: i16 = 40;
    pub const INVALID_REQUEST: i16 = 42;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
    pub const UNKNOWN_PRODUCER_ID: i16 = 59;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const INVALID_RECORD: i16 = 87;
}

/// The version range served for `api`, if it is served.
pub fn served(api: ApiKey) -> Option<(i16, i16)> {
    SERVED
        .iter()
        .find(|(k, _, _)| *k == api)
        .map(|(_, min, max)| (*min, *max))
}

/// Why a request frame was not decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the request header's fixed part.
    #[error("request of {len} bytes is shorter than a request header")]
    TooShort { len: usize },
    /// An API key Kafka does not define.
    #[error("unknown API key {key}")]
    UnknownApi { key: i16, correlation_id: i32 },
    /// A known API that this listener does not serve, or a version outside the range
    /// served.
    #[error("{api:?} version {version} is not served (served: {served})")]
    Unsupported {
        api: ApiKey,
        version: i16,
        correlation_id: i32,
        served: String,
    },
    /// The header or the body did not decode.
    #[error("malformed {api:?} v{version} request: {detail}")]
    Malformed {
        api: ApiKey,
        version: i16,
        correlation_id: i32,
        detail: String,
    },
}

impl DecodeError {
    /// The correlation id of the request, when its header could be read.
    pub fn correlation_id(&self) -> i32 {
        match self {
            DecodeError::TooShort { .. } => 0,
            DecodeError::UnknownApi { correlation_id, .. }
            | DecodeError::Unsupported { correlation_id, .. }
            | DecodeError::Malformed { correlation_id, .. } => *correlation_id,
        }
    }
}

/// One decoded request.
#[derive(Debug)]
pub struct Decoded {
    pub api: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub request: RequestKind,
}

fn be_i16(frame: &[u8], at: usize) -> Option<i16> {
    let b = frame.get(at..at + 2)?;
    Some(i16::from_be_bytes([*b.first()?, *b.get(1)?]))
}

fn be_i32(frame: &[u8], at: usize) -> Option<i32> {
    let b: [u8; 4] = frame.get(at..at + 4)?.try_into().ok()?;
    Some(i32::from_be_bytes(b))
}

/// Decodes one request frame (the bytes after the length prefix): the API key and
/// version are checked against [`SERVED`] before the crate decodes header and body.
pub fn decode_request(frame: Bytes) -> Result<Decoded, DecodeError> {
    // api_key i16, api_version i16, correlation_id i32: fixed in every header version.
    let (Some(key), Some(version), Some(correlation_id)) =
        (be_i16(&frame, 0), be_i16(&frame, 2), be_i32(&frame, 4))
    else {
        return Err(DecodeError::TooShort { len: frame.len() });
    };
    let api = ApiKey::try_from(key).map_err(|()| DecodeError::UnknownApi {
        key,
        correlation_id,
    })?;
    let range = served(api);
    if !range.is_some_and(|(min, max)| (min..=max).contains(&version)) {
        return Err(DecodeError::Unsupported {
            api,
            version,
            correlation_id,
            served: range.map_or_else(|| "none".to_string(), |(a, b)| format!("{a}..={b}")),
        });
    }
    let malformed = |e: anyhow::Error| DecodeError::Malformed {
        api,
        version,
        correlation_id,
        // kafka-protocol's buffer error ends in a newline: logged on one line.
        detail: crate::engine::error::one_line(&format!("{e:#}")),
    };
    let mut buf = frame;
    let header =
        RequestHeader::decode(&mut buf, api.request_header_version(version)).map_err(malformed)?;
    let request = RequestKind::decode(api, &mut buf, version).map_err(malformed)?;
    Ok(Decoded {
        api,
        version,
        header,
        request,
    })
}

/// Why a response could not be encoded (a broken invariant of ours, logged).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode the {api:?} v{version} response: {detail}")]
pub struct EncodeError {
    pub api: ApiKey,
    pub version: i16,
    pub detail: String,
}

/// Encodes a whole response frame (length prefix, header, body) into `out`.
pub fn encode_response(
    out: &mut BytesMut,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<(), EncodeError> {
    let failed = |e: anyhow::Error| EncodeError {
        api,
        version,
        detail: format!("{e:#}"),
    };
    out.clear();
    out.put_u32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header
        .encode(out, api.response_header_version(version))
        .map_err(failed)?;
    body.encode(out, version).map_err(failed)?;
    let len = u32::try_from(out.len() - LEN_FIELD).map_err(|_| EncodeError {
        api,
        version,
        detail: "response larger than 4 GiB".into(),
    })?;
    if let Some(prefix) = out.get_mut(..LEN_FIELD) {
        prefix.copy_from_slice(&len.to_be_bytes());
    }
    Ok(())
}

/// The ApiVersions response body listing [`SERVED`]. No optional tagged field is
/// sent (supported or finalized features): librdkafka 2.0.2 misreads a version 3
/// response carrying any ("Read underflow"), and Apache Kafka sends none either.
pub fn api_versions_body(error_code: i16) -> kafka_protocol::messages::ApiVersionsResponse {
    use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};
    let mut r = ApiVersionsResponse::default();
    r.error_code = error_code;
    r.api_keys = SERVED
        .iter()
        .map(|(k, min, max)| {
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    r.supported_features = Vec::new();
    r.finalized_features = Vec::new();
    r.finalized_features_epoch = -1;
    r.zk_migration_ready = false;
    r
}

/// A `StrBytes` of `s`.
pub(crate) fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The Kafka error code for an engine error (the message goes where the API has a
/// field for one, and into the log).
pub(crate) fn engine_code(e: &crate::engine::error::EngineError) -> i16 {
    use crate::engine::error::EngineError as E;
    match e {
        E::UnknownTopic { .. } | E::TopicDeleted { .. } | E::UnknownPartition { .. } => {
            code::UNKNOWN_TOPIC_OR_PARTITION
        }
        E::TopicExists { .. } => code::TOPIC_ALREADY_EXISTS,
        E::InvalidName(_) => code::INVALID_TOPIC_EXCEPTION,
        E::InvalidConfig(_) => code::INVALID_CONFIG,
        E::OffsetOutOfRange { .. } => code::OFFSET_OUT_OF_RANGE,
        E::RecordTooLarge { .. } | E::BatchTooLarge { .. } => code::MESSAGE_TOO_LARGE,
        E::InvalidRequest { .. } => code::INVALID_REQUEST,
        E::ShuttingDown => code::COORDINATOR_NOT_AVAILABLE,
        E::PartitionFailed { .. }
        | E::PartitionUnavailable { .. }
        | E::Io { .. }
        | E::Corrupt { .. }
        | E::RecordsDamaged { .. }
        | E::RecordsMissing { .. }
        | E::TopicOffline { .. } => code::KAFKA_STORAGE_ERROR,
        _ => code::UNKNOWN_SERVER_ERROR,
    }
}

/// The Kafka error code for a refusal of the replication layer (a replicated
/// partition's produce or read).
pub(crate) fn replicated_code(c: crate::format::wire::ErrorCode) -> i16 {
    use crate::format::wire::ErrorCode as E;
    match c {
        E::NOT_LEADER => code::NOT_LEADER_OR_FOLLOWER,
        // No leader reachable yet (an election, a peer not connected): retriable.
        E::PARTITION_UNAVAILABLE => code::NOT_ENOUGH_REPLICAS,
        E::OUT_OF_ORDER_SEQUENCE => code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        E::INVALID_PRODUCER_EPOCH => code::INVALID_PRODUCER_EPOCH,
        E::UNKNOWN_PRODUCER => code::UNKNOWN_PRODUCER_ID,
        E::UNKNOWN_TOPIC | E::UNKNOWN_PARTITION => code::UNKNOWN_TOPIC_OR_PARTITION,
        E::RECORD_TOO_LARGE => code::MESSAGE_TOO_LARGE,
        E::INVALID_REQUEST => code::INVALID_REQUEST,
        E::INVALID_CONFIG => code::INVALID_CONFIG,
        E::TOPIC_EXISTS => code::TOPIC_ALREADY_EXISTS,
        E::PARTITION_FAILED | E::STORAGE | E::CORRUPT_DATA => code::KAFKA_STORAGE_ERROR,
        E::SHUTTING_DOWN => code::NOT_LEADER_OR_FOLLOWER,
        _ => code::UNKNOWN_SERVER_ERROR,
    }
}

/// The record batches of one produce partition as the Produce path decodes them
/// (record counts checked first, headers and transactional batches refused): the
/// number of records per batch, or the Kafka error code and message.
pub fn decode_produce_records(records: Option<Bytes>) -> Result<Vec<usize>, (i16, String)> {
    produce::decode_batches(records).map(|b| b.iter().map(Vec::len).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
    use kafka_protocol::protocol::Encodable;

    fn frame(api: ApiKey, version: i16, id: i32, body: &impl Encodable) -> Bytes {
        let mut b = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(sb("t")))
            .encode(&mut b, api.request_header_version(version))
            .unwrap();
        body.encode(&mut b, version).unwrap();
        b.freeze()
    }

    #[test]
    fn served_versions_are_within_the_crate() {
        for (api, min, max) in SERVED {
            let crate_range = api.valid_versions();
            assert!(
                crate_range.min <= *min && *max <= crate_range.max && min <= max,
                "{api:?}"
            );
        }
    }

    #[test]
    fn api_versions_v3_carries_no_tagged_fields() {
        let mut out = BytesMut::new();
        let body = ResponseKind::ApiVersions(api_versions_body(code::NONE));
        encode_response(&mut out, ApiKey::ApiVersions, 3, 7, &body).unwrap();
        // The body ends with throttle_time_ms then a tagged-field count of 0.
        assert_eq!(out.last(), Some(&0));
        let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        // Header v0: the correlation id only.
        assert_eq!(&out[4..8], &7i32.to_be_bytes());
        // error_code 0, then a compact array of SERVED.len() entries of 7 bytes.
        assert_eq!(&out[8..10], &[0, 0]);
        assert_eq!(out[10] as usize, SERVED.len() + 1);
        assert_eq!(out.len(), 4 + 4 + 2 + 1 + SERVED.len() * 7 + 4 + 1);
    }

    #[test]
    fn a_malformed_body_is_reported_on_one_line() {
        let whole = frame(ApiKey::Metadata, 9, 3, &MetadataRequest::default());
        // The header whole, the body cut: kafka-protocol's error text ends in a newline.
        let cut = whole.slice(..whole.len() - 2);
        let e = decode_request(cut).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, DecodeError::Malformed { .. }), "{text}");
        assert!(text.contains("Not enough bytes"), "{text}");
        assert!(!text.contains('\n') && text == text.trim(), "{text:?}");
    }

    #[test]
    fn decode_checks_versions_before_the_body() {
        let ok = frame(ApiKey::Metadata, 9, 3, &MetadataRequest::default());
        let d = decode_request(ok).unwrap();
        assert_eq!(
            (d.api, d.version, d.header.correlation_id),
            (ApiKey::Metadata, 9, 3)
        );
        let too_new = frame(ApiKey::ApiVersions, 4, 5, &ApiVersionsRequest::default());
        let e = decode_request(too_new).unwrap_err();
        assert!(
            matches!(e, DecodeError::Unsupported { version: 4, .. }),
            "{e}"
        );
        assert_eq!(e.correlation_id(), 5);
        assert!(matches!(
            decode_request(Bytes::from_static(&[0, 3, 0])),
            Err(DecodeError::TooShort { len: 3 })
        ));
        assert!(matches!(
            decode_request(Bytes::from_static(&[0x7f, 0x7f, 0, 0, 0, 0, 0, 1])),
            Err(DecodeError::UnknownApi {
                correlation_id: 1,
                ..
            })
        ));
        // A body cut short is malformed, not a panic.
        let whole = frame(ApiKey::Metadata, 9, 3, &MetadataRequest::default());
        for cut in 8..whole.len() {
            let r = decode_request(whole.slice(..cut));
            assert!(r.is_err() || cut == whole.len(), "cut at {cut}");
        }
    }
}
