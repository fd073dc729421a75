//! The schema requests of the native protocol (version 3) and the schema check of
//! a produce request, as the server calls them: each returns the response body to
//! send or the wire error code and message.

use crate::engine::broker::{Broker, EngineError};
use crate::engine::net::server::engine_error;
use crate::format::schemas::Compatibility;
use crate::format::wire::{
    ErrorCode, PartitionBatch, Request, ResponseBody, SchemaSubjectInfo, SCHEMAS_VERSION,
};

use super::{parse_schema, SchemaError};

/// An owned answer; [`SchemaAnswer::body`] borrows it as a response body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaAnswer {
    Register {
        version: u32,
    },
    Get {
        version: u32,
        compatibility: &'static str,
        schema: String,
    },
    List {
        topics: Vec<(String, &'static str, Vec<u32>)>,
    },
    Check {
        compatible: bool,
        reason: String,
    },
    Delete {
        versions: Vec<u32>,
    },
}

impl SchemaAnswer {
    pub fn body(&self) -> ResponseBody<'_> {
        match self {
            SchemaAnswer::Register { version } => {
                ResponseBody::SchemaRegister { version: *version }
            }
            SchemaAnswer::Get {
                version,
                compatibility,
                schema,
            } => ResponseBody::SchemaGet {
                version: *version,
                compatibility,
                schema,
            },
            SchemaAnswer::List { topics } => ResponseBody::SchemaList {
                topics: topics
                    .iter()
                    .map(|(t, c, v)| SchemaSubjectInfo {
                        topic: t,
                        compatibility: c,
                        versions: v.clone(),
                    })
                    .collect(),
            },
            SchemaAnswer::Check { compatible, reason } => ResponseBody::SchemaCheck {
                compatible: *compatible,
                reason,
            },
            SchemaAnswer::Delete { versions } => ResponseBody::SchemaDelete {
                versions: versions.clone(),
            },
        }
    }
}

/// The wire code and message of a schema error on a connection of `version`.
/// Connections older than version 3 do not know the schema codes: they get
/// `invalid_request` with the same message.
pub fn wire_error(e: SchemaError, version: u16) -> (ErrorCode, String) {
    let e = match e {
        SchemaError::Engine(inner) => return engine_error(inner),
        other => other,
    };
    let code = match &e {
        SchemaError::Engine(_) => ErrorCode::INTERNAL,
        SchemaError::Violation { .. } => ErrorCode::SCHEMA_VIOLATION,
        SchemaError::InvalidSchema { .. } | SchemaError::BadCompatibility(_) => {
            ErrorCode::INVALID_SCHEMA
        }
        SchemaError::Incompatible { .. } => ErrorCode::SCHEMA_INCOMPATIBLE,
        SchemaError::NoSchema { .. } | SchemaError::NoVersion { .. } => ErrorCode::UNKNOWN_SCHEMA,
        SchemaError::TooManyVersions { .. } => ErrorCode::INVALID_REQUEST,
        SchemaError::InvalidName(_) => ErrorCode::INVALID_NAME,
        SchemaError::Unreadable { .. } => ErrorCode::CORRUPT_DATA,
        SchemaError::Io { .. } | SchemaError::Poisoned { .. } => ErrorCode::STORAGE,
    };
    let code = if version < SCHEMAS_VERSION && code.0 >= ErrorCode::SCHEMA_VIOLATION.0 {
        ErrorCode::INVALID_REQUEST
    } else {
        code
    };
    (code, e.to_string())
}

/// Checks every value of a produce request against the topic's latest schema, on
/// threads other than the event loop's when the request is large enough.
pub async fn check_produce<'b, 'r: 'b>(
    broker: &Broker,
    version: u16,
    topic: &str,
    batches: impl IntoIterator<Item = &'b PartitionBatch<'r>>,
) -> Result<(), (ErrorCode, String)> {
    broker
        .schemas()
        .check_produce_off_thread(topic, batches)
        .await
        .map_err(|e| wire_error(e, version))
}

/// Answers a schema request (`req` is one of the five).
pub fn answer(
    broker: &Broker,
    version: u16,
    req: &Request<'_>,
) -> Result<SchemaAnswer, (ErrorCode, String)> {
    if version < SCHEMAS_VERSION {
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!(
                "{} needs protocol version {SCHEMAS_VERSION}; this connection agreed on {version}",
                req.api_key().name()
            ),
        ));
    }
    answer_v3(broker, req).map_err(|e| wire_error(e, version))
}

fn version_arg(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

fn answer_v3(broker: &Broker, req: &Request<'_>) -> Result<SchemaAnswer, SchemaError> {
    Ok(match req {
        Request::SchemaRegister {
            topic,
            compatibility,
            schema,
        } => {
            let rule = match *compatibility {
                "" => None,
                c => Some(
                    Compatibility::parse(c)
                        .ok_or_else(|| SchemaError::BadCompatibility(c.to_string()))?,
                ),
            };
            let schema = parse_schema(schema)?;
            let r = broker.register_schema(topic, &schema, rule)?;
            SchemaAnswer::Register { version: r.version }
        }
        Request::SchemaGet { topic, version } => {
            let doc = broker.schemas().snapshot();
            let subject = doc
                .topics
                .get(*topic)
                .ok_or_else(|| SchemaError::NoSchema {
                    topic: topic.to_string(),
                })?;
            let v = match version_arg(*version) {
                None => subject.latest(),
                Some(n) => subject.version(n),
            }
            .ok_or_else(|| SchemaError::NoVersion {
                topic: topic.to_string(),
                version: *version,
            })?;
            SchemaAnswer::Get {
                version: v.version,
                compatibility: subject.rule().as_str(),
                schema: v.schema.to_string(),
            }
        }
        Request::SchemaList => SchemaAnswer::List {
            topics: broker
                .schemas()
                .snapshot()
                .topics
                .into_iter()
                .map(|(t, s)| {
                    let versions = s.versions.iter().map(|v| v.version).collect();
                    (t, s.rule().as_str(), versions)
                })
                .collect(),
        },
        Request::SchemaCheck { topic, schema } => {
            let schema = parse_schema(schema)?;
            match broker.check_schema(topic, &schema)? {
                None => SchemaAnswer::Check {
                    compatible: true,
                    reason: String::new(),
                },
                Some(reason) => SchemaAnswer::Check {
                    compatible: false,
                    reason,
                },
            }
        }
        Request::SchemaDelete { topic, version } => SchemaAnswer::Delete {
            versions: broker.delete_schema(topic, version_arg(*version))?,
        },
        other => {
            return Err(SchemaError::Engine(EngineError::InvalidRequest {
                detail: format!("{} is not a schema request", other.api_key().name()),
            }))
        }
    })
}
