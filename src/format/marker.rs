//! `compaction.marker`: written once a compaction's results are durable in their
//! temporary files, so a crash in the middle of the swap is finished at the next start.
//!
//! `{"version": 1, "new": ["00000000000000000000"], "replaced": ["00000000000000000000",
//! "00000000000000000147"]}` — segments by their 20-digit base, without extension.

use super::names::{parse_stem, segment_stem};

/// Version of the marker JSON.
pub const MARKER_VERSION: u64 = 1;
/// Largest marker file any reader accepts.
pub const MARKER_BYTES_MAX: usize = 1024 * 1024;

/// A decoded compaction marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionMarker {
    /// Base offsets of the segments the compaction wrote (as `<stem>.log.tmp` first).
    pub new: Vec<u64>,
    /// Base offsets of the segments it replaces.
    pub replaced: Vec<u64>,
}

/// Why a marker file could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MarkerError {
    #[error("compaction marker is {len} bytes (at most {MARKER_BYTES_MAX})")]
    TooLarge { len: usize },
    #[error("compaction marker is not valid JSON: {detail}")]
    Json { detail: String },
    #[error("compaction marker has version {found} (expected {MARKER_VERSION})")]
    Version { found: String },
    #[error("compaction marker field {field:?} is missing or not a list of segment names")]
    Field { field: &'static str },
    #[error("compaction marker names {name:?}, not a 20-digit segment base")]
    BadName { name: String },
    /// Parses, but its new segments cannot be a swap's output for the segments on
    /// disk (checked by the data-directory check, not by the decoder).
    #[error("compaction marker does not fit the segments on disk: {detail}")]
    DoesNotFit { detail: String },
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MarkerJson {
    version: serde_json::Value,
    new: Option<Vec<String>>,
    replaced: Option<Vec<String>>,
}

impl CompactionMarker {
    /// The marker's JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        let json = MarkerJson {
            version: MARKER_VERSION.into(),
            new: Some(self.new.iter().map(|&b| segment_stem(b)).collect()),
            replaced: Some(self.replaced.iter().map(|&b| segment_stem(b)).collect()),
        };
        let mut out = serde_json::to_vec(&json).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Parses a marker file.
    pub fn decode(bytes: &[u8]) -> Result<CompactionMarker, MarkerError> {
        if bytes.len() > MARKER_BYTES_MAX {
            return Err(MarkerError::TooLarge { len: bytes.len() });
        }
        let json: MarkerJson = serde_json::from_slice(bytes).map_err(|e| MarkerError::Json {
            detail: e.to_string(),
        })?;
        if json.version.as_u64() != Some(MARKER_VERSION) {
            return Err(MarkerError::Version {
                found: json.version.to_string(),
            });
        }
        let parse = |names: Option<Vec<String>>, field| -> Result<Vec<u64>, MarkerError> {
            names
                .ok_or(MarkerError::Field { field })?
                .into_iter()
                .map(|n| parse_stem(&n).ok_or(MarkerError::BadName { name: n }))
                .collect()
        };
        Ok(CompactionMarker {
            new: parse(json.new, "new")?,
            replaced: parse(json.replaced, "replaced")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_spec_example() {
        let spec = br#"{"version": 1, "new": ["00000000000000000000"], "replaced": ["00000000000000000000",
"00000000000000000147"]}"#;
        let m = CompactionMarker::decode(spec).unwrap();
        assert_eq!(
            m,
            CompactionMarker {
                new: vec![0],
                replaced: vec![0, 147]
            }
        );
        assert_eq!(CompactionMarker::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn rejects_bad_markers() {
        for bad in [
            &br#"{"version": 2, "new": [], "replaced": []}"#[..],
            br#"{"version": 1, "new": ["147"], "replaced": []}"#,
            br#"{"version": 1, "replaced": []}"#,
            br#"{"version": 1, "new": ["../../etc"], "replaced": []}"#,
            b"{",
            b"",
        ] {
            assert!(
                CompactionMarker::decode(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
