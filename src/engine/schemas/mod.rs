//! The schema registry: each topic's versioned JSON Schemas and compatibility rule,
//! kept in `DATA/schemas.json` (bytes: [`crate::format::schemas`]), and the check of
//! produced values against a topic's latest schema.
//!
//! Invariants:
//! - The file is only ever replaced whole with the atomic-replace helper, and a
//!   register or delete returns only after that replace (with its fsyncs) finished:
//!   an acknowledged change survives a crash, an unacknowledged one leaves the old or
//!   the new file. After a failed replace the registry refuses further changes until
//!   a restart (the file on disk may be either version).
//! - `doc` is exactly what the file holds. Every registered schema passed the
//!   meta-schema check and compiles.
//! - `cache` holds at most one compiled validator per topic, for its latest version.
//!   It is filled only while `doc` is read-locked and emptied for a topic while `doc`
//!   is write-locked, so a validator of a replaced version is never used after the
//!   change is acknowledged.
//! - A produced value is checked read in place ([`in_place`]), without building a
//!   `serde_json::Value`; only a value that fails there is checked again on a `Value`,
//!   which decides and reports it, so a refusal names the same record and pointer.
//!
//! Lock order: `change` → `doc` → `cache`. Changes are also serialised by the
//! broker's admin lock (taken outside `change`), so a topic cannot be deleted while a
//! schema is registered for it.

pub mod compat;
pub mod in_place;
pub mod net;
mod pool;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use serde_json::Value;

use crate::engine::storage::io::{write_file_atomic, StorageRef};
use crate::format::names::validate_name;
use crate::format::schemas::{
    check_subject, decode_schemas, encode_schemas, schema_text_len, Compatibility, SchemaVersion,
    SchemasDoc, Subject, SCHEMAS_FILE, SCHEMAS_FILE_BYTES_MAX, SCHEMA_BYTES_MAX,
    VERSIONS_PER_TOPIC_MAX,
};
use crate::format::wire::PartitionBatch;

pub use compat::Incompatible;
use in_place::{InPlace, Parsed};
use pool::{CheckPool, Values};

/// Why a schema operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("not a valid JSON Schema: {detail}")]
    InvalidSchema { detail: String },
    #[error(
        "the schema is not {rule}-compatible with version {version} of topic {topic:?}: {reason}"
    )]
    Incompatible {
        topic: String,
        version: u32,
        rule: &'static str,
        reason: Incompatible,
    },
    #[error("topic {topic:?} has no schema")]
    NoSchema { topic: String },
    #[error("topic {topic:?} has no schema version {version}")]
    NoVersion { topic: String, version: u32 },
    #[error("unknown compatibility {0:?} (backward, forward, full or none)")]
    BadCompatibility(String),
    #[error(
        "topic {topic:?} already has {VERSIONS_PER_TOPIC_MAX} schema versions; delete some first"
    )]
    TooManyVersions { topic: String },
    #[error("invalid topic name: {0}")]
    InvalidName(String),
    /// The topic is unknown, offline, or the broker is shutting down.
    #[error("{0}")]
    Engine(crate::engine::error::EngineError),
    #[error("{path} is unreadable: {detail}")]
    Unreadable { path: PathBuf, detail: String },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("schema changes are refused until a restart: an earlier replace of {path} failed")]
    Poisoned { path: PathBuf },
    /// A produced value does not match the topic's latest schema. `index` is the
    /// record's position in its partition's batch of the request, `pointer` the JSON
    /// pointer of the first violation in the value (empty: the whole value).
    #[error("{}", violation_message(*partition, *index, *version, pointer, detail))]
    Violation {
        partition: u32,
        index: u64,
        version: u32,
        pointer: String,
        detail: String,
    },
}

/// The message of a refused produce, whose start docs/PROTOCOL.md fixes:
/// `record I of partition P ...` then `at pointer "PTR"`.
fn violation_message(partition: u32, index: u64, version: u32, pointer: &str, d: &str) -> String {
    format!(
        "record {index} of partition {partition} does not match schema version {version}: \
         at pointer {pointer:?}: {d}"
    )
}

/// A compiled validator for one version of a topic's schema, twice: over values read
/// in place (the check of every produced value) and over `serde_json::Value` (what
/// builds the error of a refused value).
pub struct Compiled {
    pub version: u32,
    validator: jsonschema::Validator,
    in_place: jsonschema::Validator<InPlace>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Compiled {
    /// Checks one value: it must be JSON and valid under the schema. On failure: the
    /// JSON pointer of the first violation and what is wrong.
    pub fn check_value(&self, value: &[u8]) -> Result<(), (String, String)> {
        self.check_value_in(&mut Parsed::default(), value)
    }

    /// [`Compiled::check_value`] reusing `parsed` (its memory) across values.
    pub fn check_value_in<'v>(
        &self,
        parsed: &mut Parsed<'v>,
        value: &'v [u8],
    ) -> Result<(), (String, String)> {
        // A value that parses and is valid in place is valid as a `Value` (see
        // `in_place`); anything else is decided, and its error built, on a `Value`.
        if parsed.parse(value).is_ok() && parsed.root().is_some_and(|v| self.in_place.is_valid(v)) {
            return Ok(());
        }
        self.check_value_exact(value)
    }

    /// The check on a `serde_json::Value`, which reports the first violation.
    fn check_value_exact(&self, value: &[u8]) -> Result<(), (String, String)> {
        let v: Value = serde_json::from_slice(value)
            .map_err(|e| (String::new(), format!("the value is not JSON: {e}")))?;
        // The boolean check is the cheaper pass; only a failure pays for the error.
        if self.validator.is_valid(&v) {
            return Ok(());
        }
        self.validator
            .validate(&v)
            .map_err(|e| (e.instance_path().as_str().to_string(), e.to_string()))
    }

    /// Checks every record of a produce request; the first failure names the record.
    /// A keyed record with an empty value is a tombstone and is not checked.
    pub fn check_batches<'b, 'r: 'b>(
        &self,
        batches: impl IntoIterator<Item = &'b PartitionBatch<'r>>,
    ) -> Result<(), SchemaError> {
        let mut parsed = Parsed::default();
        for b in batches {
            for (index, r) in (0u64..).zip(&b.records) {
                if r.key.is_some() && r.value.is_empty() {
                    continue;
                }
                if let Err((pointer, detail)) = self.check_value_in(&mut parsed, r.value) {
                    return Err(SchemaError::Violation {
                        partition: b.partition,
                        index,
                        version: self.version,
                        pointer,
                        detail,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Requests with fewer records to check are checked on the calling thread: their
/// check is short, and a hand-off to a checker thread ([`pool`]) costs two wake-ups
/// and a copy of the values. A request below [`SPLIT_RECORDS_MIN`] that arrives
/// while every checker has a job is checked there too, so the loop and the checkers
/// share the work of a burst.
pub const OFF_THREAD_RECORDS_MIN: usize = 32;

/// Requests with at least this many records to check are split between the checker
/// threads.
pub const SPLIT_RECORDS_MIN: usize = 1024;

impl Compiled {
    /// [`Compiled::check_batches`] over copied values.
    fn check_spans(
        &self,
        bytes: &[u8],
        spans: &[(u32, u64, std::ops::Range<usize>)],
    ) -> Result<(), SchemaError> {
        let mut parsed = Parsed::default();
        for (partition, index, range) in spans {
            if let Err((pointer, detail)) = self.check_value_in(&mut parsed, &bytes[range.clone()])
            {
                return Err(SchemaError::Violation {
                    partition: *partition,
                    index: *index,
                    version: self.version,
                    pointer,
                    detail,
                });
            }
        }
        Ok(())
    }

    /// [`Compiled::check_batches`] without holding the calling thread (an event
    /// loop): the values are copied out and checked on the node's checker threads, a
    /// request of [`SPLIT_RECORDS_MIN`] records or more in contiguous parts, one per
    /// checker. The first failure in request order is the one reported, as on one
    /// thread. Small requests, and requests below [`SPLIT_RECORDS_MIN`] while every
    /// checker is busy, are checked here.
    async fn check_batches_off_thread<'b, 'r: 'b>(
        self: &Arc<Self>,
        checkers: &CheckPool,
        batches: impl IntoIterator<Item = &'b PartitionBatch<'r>>,
    ) -> Result<(), SchemaError> {
        let batches: Vec<&PartitionBatch<'_>> = batches.into_iter().collect();
        let n: usize = batches.iter().map(|b| b.records.len()).sum();
        if n < OFF_THREAD_RECORDS_MIN || (n < SPLIT_RECORDS_MIN && checkers.busy()) {
            return self.check_batches(batches);
        }
        let mut v = Values {
            bytes: Vec::with_capacity(
                batches
                    .iter()
                    .flat_map(|b| &b.records)
                    .map(|r| r.value.len())
                    .sum(),
            ),
            spans: Vec::with_capacity(n),
        };
        for b in &batches {
            for (index, r) in (0u64..).zip(&b.records) {
                if r.key.is_some() && r.value.is_empty() {
                    continue;
                }
                let start = v.bytes.len();
                v.bytes.extend_from_slice(r.value);
                v.spans.push((b.partition, index, start..v.bytes.len()));
            }
        }
        let v = Arc::new(v);
        // Concurrent requests already keep every checker busy; only a request whose
        // check alone would take about a millisecond is split between them.
        let parts = if n >= SPLIT_RECORDS_MIN {
            checkers.threads()
        } else {
            1
        };
        let per = v.spans.len().div_ceil(parts).max(1);
        let parts: Vec<_> = (0..v.spans.len())
            .step_by(per)
            .map(|start| checkers.submit(self, &v, start..(start + per).min(v.spans.len())))
            .collect();
        // Awaited in request order: the first failure reported is the first in order.
        for part in parts {
            part.answer().await?;
        }
        Ok(())
    }
}

/// Meta-validates and compiles a schema.
pub fn compile(schema: &Value, version: u32) -> Result<Compiled, SchemaError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(SchemaError::InvalidSchema {
            detail: "a schema is a JSON object or a boolean".to_string(),
        });
    }
    if schema_text_len(schema) > SCHEMA_BYTES_MAX {
        return Err(SchemaError::InvalidSchema {
            detail: format!("over {SCHEMA_BYTES_MAX} bytes"),
        });
    }
    jsonschema::meta::validate(schema).map_err(|e| SchemaError::InvalidSchema {
        detail: format!("at {:?}: {e}", e.instance_path().as_str()),
    })?;
    let validator = jsonschema::validator_for(schema).map_err(|e| SchemaError::InvalidSchema {
        detail: e.to_string(),
    })?;
    let in_place = jsonschema::options_for::<InPlace>()
        .build(schema)
        .map_err(|e| SchemaError::InvalidSchema {
            detail: e.to_string(),
        })?;
    Ok(Compiled {
        version,
        validator,
        in_place,
    })
}

/// Parses schema text as given by a client or a file.
pub fn parse_schema(text: &str) -> Result<Value, SchemaError> {
    if text.len() > SCHEMA_BYTES_MAX {
        return Err(SchemaError::InvalidSchema {
            detail: format!(
                "{} bytes is over the limit of {SCHEMA_BYTES_MAX}",
                text.len()
            ),
        });
    }
    serde_json::from_str(text).map_err(|e| SchemaError::InvalidSchema {
        detail: format!("not JSON: {e}"),
    })
}

/// Reads `DATA/schemas.json`; a missing file is an empty registry.
pub fn read_file(data_dir: &Path) -> Result<SchemasDoc, SchemaError> {
    let path = data_dir.join(SCHEMAS_FILE);
    let unreadable = |detail: String| SchemaError::Unreadable {
        path: path.clone(),
        detail,
    };
    // A regular file, bounded before anything is allocated (a FIFO is never opened).
    let Some(bytes) =
        crate::engine::producers::read_state_file(&path, SCHEMAS_FILE_BYTES_MAX as usize)
            .map_err(unreadable)?
    else {
        return Ok(SchemasDoc::default());
    };
    decode_schemas(&bytes).map_err(|e| unreadable(e.to_string()))
}

/// What a successful register did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub version: u32,
    /// False when the schema equals the latest version (nothing was written).
    pub created: bool,
}

/// The registry of a running broker.
#[derive(Debug)]
pub struct SchemaRegistry {
    storage: StorageRef,
    data_dir: PathBuf,
    change: Mutex<()>,
    doc: RwLock<SchemasDoc>,
    cache: RwLock<HashMap<String, Arc<Compiled>>>,
    poisoned: AtomicBool,
    /// Started at the first request large enough to be checked off the event loop.
    checkers: OnceLock<CheckPool>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl SchemaRegistry {
    /// Loads `DATA/schemas.json`. Entries of topics not in `topics` (left by a crash
    /// between deleting a topic and dropping its schemas) are dropped, durably.
    pub fn open(
        storage: StorageRef,
        data_dir: &Path,
        topics: &[String],
    ) -> Result<SchemaRegistry, SchemaError> {
        let doc = read_file(data_dir)?;
        let registry = SchemaRegistry {
            storage,
            data_dir: data_dir.to_path_buf(),
            change: Mutex::new(()),
            doc: RwLock::new(doc.clone()),
            cache: RwLock::new(HashMap::new()),
            poisoned: AtomicBool::new(false),
            checkers: OnceLock::new(),
        };
        let stale: Vec<String> = doc
            .topics
            .keys()
            .filter(|t| !topics.contains(t))
            .cloned()
            .collect();
        if !stale.is_empty() {
            let mut next = doc;
            for t in &stale {
                tracing::warn!(topic = %t, "dropping the schemas of a topic that no longer exists");
                next.topics.remove(t);
            }
            let _change = registry
                .change
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            registry.replace(next, &stale)?;
        }
        Ok(registry)
    }

    fn path(&self) -> PathBuf {
        self.data_dir.join(SCHEMAS_FILE)
    }

    /// A copy of the registry's content.
    pub fn snapshot(&self) -> SchemasDoc {
        read(&self.doc).clone()
    }

    /// Writes `next` atomically, then makes it current and drops the cached
    /// validators of `changed`. The caller holds `change`.
    fn replace(&self, next: SchemasDoc, changed: &[String]) -> Result<(), SchemaError> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(SchemaError::Poisoned { path: self.path() });
        }
        let bytes = encode_schemas(&next);
        // 1. write a temporary file, 2. fsync it, 3. rename it over schemas.json,
        // 4. fsync the data directory (the helper numbers the same steps).
        if let Err(source) = write_file_atomic(&*self.storage, &self.data_dir, SCHEMAS_FILE, &bytes)
        {
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(SchemaError::Io {
                context: format!("replacing {}", self.path().display()),
                source,
            });
        }
        // 5. only now does the change become visible.
        let mut doc = write(&self.doc);
        *doc = next;
        let mut cache = write(&self.cache);
        for t in changed {
            cache.remove(t);
        }
        Ok(())
    }

    /// Registers `schema` as the next version of `topic`'s schema, after checking
    /// it is a valid JSON Schema and compatible with the latest version under the
    /// topic's rule (`compatibility`, when given, first becomes the topic's rule).
    /// A schema equal to the latest version is not registered again: its version is
    /// returned.
    pub fn register(
        &self,
        topic: &str,
        schema: &Value,
        compatibility: Option<Compatibility>,
    ) -> Result<Registered, SchemaError> {
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        let _change = self.change.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = self.snapshot();
        let compiled = compile(schema, 0)?;
        let subject = next.topics.get(topic);
        let old_rule = subject.map(Subject::rule);
        let rule = compatibility.or(old_rule).unwrap_or_default();
        if let Some(latest) = subject.and_then(Subject::latest) {
            if &latest.schema != schema {
                compat::check(rule, &latest.schema, schema).map_err(|reason| {
                    SchemaError::Incompatible {
                        topic: topic.to_string(),
                        version: latest.version,
                        rule: rule.as_str(),
                        reason,
                    }
                })?;
            } else if Some(rule) == old_rule {
                return Ok(Registered {
                    version: latest.version,
                    created: false,
                });
            }
        }
        let subject = next.topics.entry(topic.to_string()).or_insert(Subject {
            compatibility: rule.as_str().to_string(),
            next_version: 1,
            versions: Vec::new(),
        });
        subject.compatibility = rule.as_str().to_string();
        let unchanged = subject.latest().is_some_and(|l| &l.schema == schema);
        let version = if unchanged {
            subject.latest().map_or(0, |l| l.version)
        } else {
            if subject.versions.len() >= VERSIONS_PER_TOPIC_MAX {
                return Err(SchemaError::TooManyVersions {
                    topic: topic.to_string(),
                });
            }
            let version = subject.next_version;
            subject.versions.push(SchemaVersion {
                version,
                schema: schema.clone(),
            });
            subject.next_version = version.saturating_add(1);
            version
        };
        self.replace(next, &[topic.to_string()])?;
        // The new latest version is compiled already: cache it.
        let doc = read(&self.doc);
        if doc
            .topics
            .get(topic)
            .and_then(Subject::latest)
            .is_some_and(|l| l.version == version)
        {
            write(&self.cache).insert(
                topic.to_string(),
                Arc::new(Compiled {
                    version,
                    ..compiled
                }),
            );
        }
        Ok(Registered {
            version,
            created: !unchanged,
        })
    }

    /// Checks `schema` against `topic`'s latest version without registering it.
    /// `Ok(None)`: compatible (or the topic has no schema yet); `Ok(Some(reason))`:
    /// not compatible.
    pub fn check(&self, topic: &str, schema: &Value) -> Result<Option<String>, SchemaError> {
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        compile(schema, 0)?;
        let doc = read(&self.doc);
        let Some(subject) = doc.topics.get(topic) else {
            return Ok(None);
        };
        let Some(latest) = subject.latest() else {
            return Ok(None);
        };
        let rule = subject.rule();
        Ok(compat::check(rule, &latest.schema, schema)
            .err()
            .map(|reason| {
                SchemaError::Incompatible {
                    topic: topic.to_string(),
                    version: latest.version,
                    rule: rule.as_str(),
                    reason,
                }
                .to_string()
            }))
    }

    /// Deletes one version (`Some(n)`) or every version of `topic`'s schema; a topic
    /// left with no version loses its entry (and its rule). Returns the versions
    /// deleted.
    pub fn delete(&self, topic: &str, version: Option<u32>) -> Result<Vec<u32>, SchemaError> {
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        let _change = self.change.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = self.snapshot();
        let no_schema = || SchemaError::NoSchema {
            topic: topic.to_string(),
        };
        let subject = next.topics.get_mut(topic).ok_or_else(no_schema)?;
        let deleted = match version {
            None => {
                let all = subject.versions.iter().map(|v| v.version).collect();
                next.topics.remove(topic);
                all
            }
            Some(n) => {
                let before = subject.versions.len();
                subject.versions.retain(|v| v.version != n);
                if subject.versions.len() == before {
                    return Err(SchemaError::NoVersion {
                        topic: topic.to_string(),
                        version: n,
                    });
                }
                if subject.versions.is_empty() {
                    next.topics.remove(topic);
                }
                vec![n]
            }
        };
        self.replace(next, &[topic.to_string()])?;
        Ok(deleted)
    }

    /// Makes `topic`'s entry `subject` as another node of the cluster has it (`None`:
    /// no schema), after checking it as the file's decoder does and compiling every
    /// version; nothing is written when it is already so. Returns whether it changed.
    pub fn set_subject(&self, topic: &str, subject: Option<Subject>) -> Result<bool, SchemaError> {
        validate_name(topic).map_err(|e| SchemaError::InvalidName(e.to_string()))?;
        if let Some(s) = &subject {
            check_subject(s).map_err(|detail| SchemaError::InvalidSchema { detail })?;
            for v in &s.versions {
                compile(&v.schema, v.version)?;
            }
        }
        let _change = self.change.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = self.snapshot();
        if next.topics.get(topic) == subject.as_ref() {
            return Ok(false);
        }
        match subject {
            Some(s) => next.topics.insert(topic.to_string(), s),
            None => next.topics.remove(topic),
        };
        self.replace(next, &[topic.to_string()])?;
        Ok(true)
    }

    /// Drops every schema of a deleted topic (nothing if it had none).
    pub fn drop_topic(&self, topic: &str) -> Result<(), SchemaError> {
        let _change = self.change.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = self.snapshot();
        if next.topics.remove(topic).is_none() {
            return Ok(());
        }
        self.replace(next, &[topic.to_string()])
    }

    /// The validator of `topic`'s latest version, compiled once and cached; `None`
    /// when the topic has no schema.
    pub fn validator(&self, topic: &str) -> Result<Option<Arc<Compiled>>, SchemaError> {
        if let Some(c) = read(&self.cache).get(topic) {
            return Ok(Some(c.clone()));
        }
        let doc = read(&self.doc);
        let Some(latest) = doc.topics.get(topic).and_then(Subject::latest) else {
            return Ok(None);
        };
        let compiled = Arc::new(compile(&latest.schema, latest.version)?);
        write(&self.cache).insert(topic.to_string(), compiled.clone());
        Ok(Some(compiled))
    }

    /// Checks a produce request against the topic's latest schema (if any). Runs
    /// before anything is appended and takes no partition lock.
    pub fn check_produce<'b, 'r: 'b>(
        &self,
        topic: &str,
        batches: impl IntoIterator<Item = &'b PartitionBatch<'r>>,
    ) -> Result<(), SchemaError> {
        match self.validator(topic)? {
            Some(c) => c.check_batches(batches),
            None => Ok(()),
        }
    }

    /// [`SchemaRegistry::check_produce`] for an event loop: the values are checked on
    /// other threads while the loop serves other connections
    /// ([`Compiled::check_batches_off_thread`]).
    pub async fn check_produce_off_thread<'b, 'r: 'b>(
        &self,
        topic: &str,
        batches: impl IntoIterator<Item = &'b PartitionBatch<'r>>,
    ) -> Result<(), SchemaError> {
        match self.validator(topic)? {
            Some(c) => {
                let checkers = self.checkers.get_or_init(CheckPool::start);
                c.check_batches_off_thread(checkers, batches).await
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests;
