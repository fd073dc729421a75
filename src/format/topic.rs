//! `topic.json`: a topic's partition count and configuration.
//!
//! `{"partitions": N, "config": {"segment_bytes": …, …}}`. Keys that are absent take
//! their defaults; unknown keys and out-of-range values are refused.

use super::record::MAX_RECORD_LEN;

/// Largest `topic.json` any reader accepts.
pub const TOPIC_FILE_BYTES_MAX: usize = 64 * 1024;
/// Most partitions a topic may have.
pub const PARTITIONS_MAX: u32 = 1024;
/// Smallest `segment_bytes`.
pub const SEGMENT_BYTES_MIN: u64 = 1024;
/// Largest `segment_bytes`.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 32;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Which background cleanup a topic runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupPolicy {
    Delete,
    Compact,
    CompactDelete,
}

impl CleanupPolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::CompactDelete => "compact,delete",
        }
    }

    pub fn parse(s: &str) -> Option<CleanupPolicy> {
        match s {
            "delete" => Some(CleanupPolicy::Delete),
            "compact" => Some(CleanupPolicy::Compact),
            "compact,delete" | "delete,compact" => Some(CleanupPolicy::CompactDelete),
            _ => None,
        }
    }

    pub fn compacts(&self) -> bool {
        matches!(self, CleanupPolicy::Compact | CleanupPolicy::CompactDelete)
    }

    pub fn deletes(&self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::CompactDelete)
    }
}

/// A topic's configuration, with the defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    /// -1: keep forever.
    pub retention_ms: i64,
    /// -1: no size limit.
    pub retention_bytes: i64,
    pub cleanup_policy: CleanupPolicy,
    pub tombstone_retention_ms: i64,
    pub max_record_bytes: u32,
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            segment_bytes: 64 * 1024 * 1024,
            segment_ms: 7 * DAY_MS,
            retention_ms: 7 * DAY_MS,
            retention_bytes: -1,
            cleanup_policy: CleanupPolicy::Delete,
            tombstone_retention_ms: DAY_MS,
            max_record_bytes: 1024 * 1024,
        }
    }
}

/// The names of every configuration key, in display order.
pub const CONFIG_KEYS: [&str; 7] = [
    "segment_bytes",
    "segment_ms",
    "retention_ms",
    "retention_bytes",
    "cleanup_policy",
    "tombstone_retention_ms",
    "max_record_bytes",
];

/// Why a topic file or a configuration setting was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    #[error("topic.json is {len} bytes (at most {TOPIC_FILE_BYTES_MAX})")]
    TooLarge { len: usize },
    #[error("topic.json is not valid JSON: {detail}")]
    Json { detail: String },
    #[error("topic.json: {detail}")]
    Shape { detail: String },
    #[error("unknown config key {key:?} (known: {})", CONFIG_KEYS.join(", "))]
    UnknownKey { key: String },
    #[error("config {key}={value} is out of range: {allowed}")]
    OutOfRange {
        key: String,
        value: String,
        allowed: &'static str,
    },
    #[error("config {key}={value} is not a number: {allowed}")]
    NotANumber {
        key: String,
        value: String,
        allowed: &'static str,
    },
    #[error("partitions must be 1..={PARTITIONS_MAX}, got {value}")]
    Partitions { value: String },
    #[error("config setting {setting:?} is not KEY=VALUE")]
    NotKeyValue { setting: String },
}

fn int_in(
    key: &str,
    value: &str,
    lo: i64,
    hi: i64,
    allowed: &'static str,
) -> Result<i64, TopicError> {
    let text = value.trim();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TopicError::NotANumber {
            key: key.to_string(),
            value: value.to_string(),
            allowed,
        });
    }
    match text.parse::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(TopicError::OutOfRange {
            key: key.to_string(),
            value: value.to_string(),
            allowed,
        }),
    }
}

fn duration_ms(key: &str, value: &str, allow_forever: bool) -> Result<i64, TopicError> {
    let v = int_in(
        key,
        value,
        -1,
        i64::MAX,
        "milliseconds >= 0, or -1 for forever",
    )?;
    if v == -1 && !allow_forever {
        return Err(TopicError::OutOfRange {
            key: key.into(),
            value: value.into(),
            allowed: "milliseconds >= 1",
        });
    }
    Ok(v)
}

impl TopicConfig {
    /// Sets one key from its text form (`--config KEY=VALUE`, or a JSON value's text).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TopicError> {
        match key {
            "segment_bytes" => {
                self.segment_bytes = int_in(
                    key,
                    value,
                    SEGMENT_BYTES_MIN as i64,
                    SEGMENT_BYTES_MAX as i64,
                    "bytes in 1024..=4294967296",
                )? as u64;
            }
            "segment_ms" => {
                self.segment_ms = int_in(key, value, 1, i64::MAX, "milliseconds >= 1")?;
            }
            "retention_ms" => self.retention_ms = duration_ms(key, value, true)?,
            "retention_bytes" => {
                self.retention_bytes =
                    int_in(key, value, -1, i64::MAX, "bytes >= 0, or -1 for no limit")?;
            }
            "cleanup_policy" => {
                self.cleanup_policy =
                    CleanupPolicy::parse(value.trim()).ok_or(TopicError::OutOfRange {
                        key: key.into(),
                        value: value.into(),
                        allowed: "delete, compact or compact,delete",
                    })?;
            }
            "tombstone_retention_ms" => {
                self.tombstone_retention_ms = int_in(key, value, 0, i64::MAX, "milliseconds >= 0")?;
            }
            "max_record_bytes" => {
                self.max_record_bytes = int_in(
                    key,
                    value,
                    1,
                    i64::from(MAX_RECORD_LEN),
                    "bytes in 1..=16777216",
                )? as u32;
            }
            _ => {
                return Err(TopicError::UnknownKey {
                    key: key.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Applies a `KEY=VALUE` setting.
    pub fn set_pair(&mut self, setting: &str) -> Result<(), TopicError> {
        let (k, v) = setting.split_once('=').ok_or(TopicError::NotKeyValue {
            setting: setting.to_string(),
        })?;
        self.set(k.trim(), v)
    }

    /// The configuration as a JSON object, every key present.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "segment_bytes": self.segment_bytes,
            "segment_ms": self.segment_ms,
            "retention_ms": self.retention_ms,
            "retention_bytes": self.retention_bytes,
            "cleanup_policy": self.cleanup_policy.as_str(),
            "tombstone_retention_ms": self.tombstone_retention_ms,
            "max_record_bytes": self.max_record_bytes,
        })
    }

    /// Reads a `config` object: absent keys take defaults, unknown keys are refused.
    pub fn from_json(value: &serde_json::Value) -> Result<TopicConfig, TopicError> {
        let obj = value.as_object().ok_or(TopicError::Shape {
            detail: "\"config\" is not an object".into(),
        })?;
        let mut config = TopicConfig::default();
        for (k, v) in obj {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                other => {
                    return Err(TopicError::OutOfRange {
                        key: k.clone(),
                        value: other.to_string(),
                        allowed: "a number or a string",
                    })
                }
            };
            config.set(k, &text)?;
        }
        Ok(config)
    }
}

/// The content of `topic.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicMeta {
    pub partitions: u32,
    pub config: TopicConfig,
}

impl TopicMeta {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let v =
            serde_json::json!({ "partitions": self.partitions, "config": self.config.to_json() });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Parses and validates a `topic.json`.
    pub fn decode(bytes: &[u8]) -> Result<TopicMeta, TopicError> {
        if bytes.len() > TOPIC_FILE_BYTES_MAX {
            return Err(TopicError::TooLarge { len: bytes.len() });
        }
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| TopicError::Json {
            detail: e.to_string(),
        })?;
        let obj = v.as_object().ok_or(TopicError::Shape {
            detail: "not a JSON object".into(),
        })?;
        for k in obj.keys() {
            if k != "partitions" && k != "config" {
                return Err(TopicError::Shape {
                    detail: format!("unknown field {k:?}"),
                });
            }
        }
        let partitions = match obj.get("partitions").and_then(serde_json::Value::as_u64) {
            Some(p) if (1..=u64::from(PARTITIONS_MAX)).contains(&p) => p as u32,
            other => {
                return Err(TopicError::Partitions {
                    value: other.map_or_else(
                        || {
                            obj.get("partitions").map_or_else(
                                || "no \"partitions\" field".into(),
                                std::string::ToString::to_string,
                            )
                        },
                        |p| p.to_string(),
                    ),
                })
            }
        };
        let config = match obj.get("config") {
            Some(c) => TopicConfig::from_json(c)?,
            None => TopicConfig::default(),
        };
        Ok(TopicMeta { partitions, config })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_round_trip() {
        let m = TopicMeta::decode(br#"{"partitions": 3}"#).unwrap();
        assert_eq!(m.config, TopicConfig::default());
        assert_eq!(m.config.segment_bytes, 64 << 20);
        let mut c = TopicConfig::default();
        c.set_pair("cleanup_policy=compact,delete").unwrap();
        c.set_pair("retention_ms=-1").unwrap();
        let m = TopicMeta {
            partitions: 4,
            config: c,
        };
        assert_eq!(TopicMeta::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn refusals() {
        let mut c = TopicConfig::default();
        assert!(matches!(
            c.set_pair("segment_byte=1"),
            Err(TopicError::UnknownKey { .. })
        ));
        assert!(matches!(
            c.set_pair("segment_bytes=10"),
            Err(TopicError::OutOfRange { .. })
        ));
        assert!(matches!(
            c.set_pair("max_record_bytes=16777217"),
            Err(TopicError::OutOfRange { .. })
        ));
        for bad in [
            "retention_ms=abc",
            "segment_bytes=",
            "max_record_bytes=1.5",
            "segment_ms=-",
        ] {
            let e = c.set_pair(bad).unwrap_err();
            assert!(matches!(e, TopicError::NotANumber { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("is not a number"), "{e}");
        }
        assert!(matches!(
            c.set_pair("retention_ms=99999999999999999999"),
            Err(TopicError::OutOfRange { .. })
        ));
        assert!(matches!(
            c.set_pair("cleanup_policy=keep"),
            Err(TopicError::OutOfRange { .. })
        ));
        assert!(matches!(
            c.set_pair("retention_ms"),
            Err(TopicError::NotKeyValue { .. })
        ));
        assert!(TopicMeta::decode(br#"{"partitions": 0}"#).is_err());
        assert!(TopicMeta::decode(br#"{"partitions": 2, "extra": 1}"#).is_err());
        assert!(TopicMeta::decode(br#"{"partitions": 2, "config": {"nope": 1}}"#).is_err());
    }
}
