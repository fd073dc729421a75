//! `DATA/schemas.json`: the versioned JSON Schemas of each topic and its
//! compatibility rule.
//!
//! ```text
//! {"format": 1,
//!  "topics": {"orders": {"compatibility": "backward", "next_version": 3,
//!                        "versions": [{"version": 1, "schema": {…}},
//!                                     {"version": 2, "schema": {…}}]}}}
//! ```
//! Invariants checked by [`decode_schemas`]: `format` is 1; every topic name is valid;
//! `compatibility` is one of [`Compatibility`]; a topic has 1..=[`VERSIONS_PER_TOPIC_MAX`]
//! versions, numbered 1 or more, strictly increasing and below `next_version` (numbers
//! are never reused while the topic keeps an entry); each schema is a JSON object or a
//! boolean of at most [`SCHEMA_BYTES_MAX`] bytes as text. Unknown keys are refused.
//! Whether a schema is a valid JSON Schema is the engine's business (it checks at
//! registration).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::names::validate_name;

/// The file's name in the data directory.
pub const SCHEMAS_FILE: &str = "schemas.json";
/// The `format` this build reads and writes.
pub const SCHEMAS_FORMAT: u32 = 1;
/// Largest `schemas.json` any reader accepts (64 MiB).
pub const SCHEMAS_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Largest schema, as compact JSON text (1 MiB).
pub const SCHEMA_BYTES_MAX: usize = 1024 * 1024;
/// Most versions one topic keeps.
pub const VERSIONS_PER_TOPIC_MAX: usize = 1000;

/// A topic's compatibility rule, as Confluent Schema Registry names them. Which
/// changes each accepts is fixed in docs/FORMAT.md (Schemas).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compatibility {
    /// The new schema reads data written with the latest one.
    #[default]
    Backward,
    /// The latest schema reads data written with the new one.
    Forward,
    /// Both.
    Full,
    /// No check.
    None,
}

impl Compatibility {
    pub const ALL: [Compatibility; 4] = [
        Compatibility::Backward,
        Compatibility::Forward,
        Compatibility::Full,
        Compatibility::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Compatibility::Backward => "backward",
            Compatibility::Forward => "forward",
            Compatibility::Full => "full",
            Compatibility::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Compatibility> {
        Compatibility::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// One registered version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaVersion {
    pub version: u32,
    pub schema: Value,
}

/// A topic's entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub compatibility: String,
    pub next_version: u32,
    pub versions: Vec<SchemaVersion>,
}

impl Subject {
    /// The rule (the decoder has checked that it parses).
    pub fn rule(&self) -> Compatibility {
        Compatibility::parse(&self.compatibility).unwrap_or_default()
    }

    /// The newest version.
    pub fn latest(&self) -> Option<&SchemaVersion> {
        self.versions.last()
    }

    /// Version `n`.
    pub fn version(&self, n: u32) -> Option<&SchemaVersion> {
        self.versions.iter().find(|v| v.version == n)
    }
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemasDoc {
    pub format: u32,
    pub topics: BTreeMap<String, Subject>,
}

impl Default for SchemasDoc {
    fn default() -> Self {
        SchemasDoc {
            format: SCHEMAS_FORMAT,
            topics: BTreeMap::new(),
        }
    }
}

/// Why `schemas.json` bytes are not a valid file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemasFileError {
    #[error("{len} bytes is over the limit of {SCHEMAS_FILE_BYTES_MAX}")]
    TooLarge { len: u64 },
    #[error("not valid JSON of the schemas file: {0}")]
    Json(String),
    #[error("format {0} is not {SCHEMAS_FORMAT}")]
    Format(u32),
    #[error("topic name {name:?}: {detail}")]
    BadTopic { name: String, detail: String },
    #[error("topic {topic}: {detail}")]
    BadSubject { topic: String, detail: String },
}

/// Parses and checks the file's bytes.
pub fn decode_schemas(bytes: &[u8]) -> Result<SchemasDoc, SchemasFileError> {
    if bytes.len() as u64 > SCHEMAS_FILE_BYTES_MAX {
        return Err(SchemasFileError::TooLarge {
            len: bytes.len() as u64,
        });
    }
    let doc: SchemasDoc =
        serde_json::from_slice(bytes).map_err(|e| SchemasFileError::Json(e.to_string()))?;
    if doc.format != SCHEMAS_FORMAT {
        return Err(SchemasFileError::Format(doc.format));
    }
    for (name, subject) in &doc.topics {
        validate_name(name).map_err(|e| SchemasFileError::BadTopic {
            name: name.clone(),
            detail: e.to_string(),
        })?;
        check_subject(subject).map_err(|detail| SchemasFileError::BadSubject {
            topic: name.clone(),
            detail,
        })?;
    }
    Ok(doc)
}

/// Checks one topic's entry as the file decoder does: its rule, its versions
/// (1 to [`VERSIONS_PER_TOPIC_MAX`], increasing, below `next_version`) and their sizes.
pub fn check_subject(s: &Subject) -> Result<(), String> {
    if Compatibility::parse(&s.compatibility).is_none() {
        return Err(format!(
            "compatibility {:?} is not backward, forward, full or none",
            s.compatibility
        ));
    }
    if s.versions.is_empty() || s.versions.len() > VERSIONS_PER_TOPIC_MAX {
        return Err(format!(
            "{} versions (1..={VERSIONS_PER_TOPIC_MAX} allowed)",
            s.versions.len()
        ));
    }
    let mut previous = 0;
    for v in &s.versions {
        if v.version <= previous || v.version >= s.next_version {
            return Err(format!(
                "version {} is not above {previous} and below next_version {}",
                v.version, s.next_version
            ));
        }
        previous = v.version;
        if !(v.schema.is_object() || v.schema.is_boolean()) {
            return Err(format!(
                "the schema of version {} is neither an object nor a boolean",
                v.version
            ));
        }
        if schema_text_len(&v.schema) > SCHEMA_BYTES_MAX {
            return Err(format!(
                "the schema of version {} is over {SCHEMA_BYTES_MAX} bytes",
                v.version
            ));
        }
    }
    Ok(())
}

/// Length of a schema as compact JSON text.
pub fn schema_text_len(schema: &Value) -> usize {
    serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len())
}

/// The file's bytes (pretty-printed, a trailing newline).
pub fn encode_schemas(doc: &SchemasDoc) -> Vec<u8> {
    // Serialising a tree of strings, numbers and maps cannot fail.
    let mut out = serde_json::to_vec_pretty(doc).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> SchemasDoc {
        let mut d = SchemasDoc::default();
        d.topics.insert(
            "orders".into(),
            Subject {
                compatibility: "full".into(),
                next_version: 3,
                versions: vec![
                    SchemaVersion {
                        version: 1,
                        schema: json!({"type": "object"}),
                    },
                    SchemaVersion {
                        version: 2,
                        schema: json!(true),
                    },
                ],
            },
        );
        d
    }

    #[test]
    fn round_trip() {
        let d = doc();
        let bytes = encode_schemas(&d);
        assert_eq!(decode_schemas(&bytes).unwrap(), d);
        assert_eq!(
            decode_schemas(&encode_schemas(&SchemasDoc::default())).unwrap(),
            SchemasDoc::default()
        );
    }

    #[test]
    fn refuses_bad_files() {
        let bad = |f: &dyn Fn(&mut Value)| {
            let mut v = serde_json::to_value(doc()).unwrap();
            f(&mut v);
            decode_schemas(&serde_json::to_vec(&v).unwrap())
        };
        assert!(matches!(
            bad(&|v| v["format"] = json!(2)),
            Err(SchemasFileError::Format(2))
        ));
        assert!(matches!(
            bad(&|v| v["topics"]["orders"]["compatibility"] = json!("sideways")),
            Err(SchemasFileError::BadSubject { .. })
        ));
        assert!(matches!(
            bad(&|v| v["topics"]["orders"]["next_version"] = json!(2)),
            Err(SchemasFileError::BadSubject { .. })
        ));
        assert!(matches!(
            bad(&|v| v["topics"]["orders"]["versions"][1]["version"] = json!(1)),
            Err(SchemasFileError::BadSubject { .. })
        ));
        assert!(matches!(
            bad(&|v| v["topics"]["orders"]["versions"] = json!([])),
            Err(SchemasFileError::BadSubject { .. })
        ));
        assert!(matches!(
            bad(&|v| v["topics"]["orders"]["versions"][0]["schema"] = json!(3)),
            Err(SchemasFileError::BadSubject { .. })
        ));
        assert!(matches!(
            bad(&|v| v["extra"] = json!(1)),
            Err(SchemasFileError::Json(_))
        ));
        assert!(matches!(
            bad(&|v| {
                let s = v["topics"]["orders"].clone();
                v["topics"]["../x"] = s;
            }),
            Err(SchemasFileError::BadTopic { .. })
        ));
        let bytes = encode_schemas(&doc());
        for cut in 0..bytes.len() - 1 {
            assert!(decode_schemas(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
