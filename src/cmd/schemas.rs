//! `seglog schemas register|get|list|check|delete`: the topics' JSON Schemas, over the
//! wire protocol (version 3) or, for `get` and `list`, read from a data directory with
//! `--data-dir` (no lock: a read of one atomically replaced file).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::connect::{client_error, BrokerArgs};
use super::{exit, ExitError, Global};
use crate::engine::net::client::{ClientError, SchemaListing, SchemaText};
use crate::engine::schemas::read_file;
use crate::format::names::TOPICS_DIR;
use crate::format::schemas::{SchemasDoc, SCHEMA_BYTES_MAX};
use crate::format::wire::ErrorCode;

/// Arguments of `seglog schemas`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: SchemasCommand,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Read this data directory instead of asking a broker (get and list only).
    #[arg(long, value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum SchemasCommand {
    /// Register a new version of a topic's schema (refused when it is not a valid JSON
    /// Schema or not compatible with the latest version under the topic's rule).
    Register {
        topic: String,
        /// The JSON Schema.
        #[arg(long, value_name = "S.json")]
        file: PathBuf,
        /// Set the topic's compatibility rule first (default for a new topic: backward).
        #[arg(long, value_parser = ["backward", "forward", "full", "none"])]
        compatibility: Option<String>,
    },
    /// Print a version of a topic's schema (default: the latest).
    Get {
        topic: String,
        /// The version (from 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        version: Option<u32>,
    },
    /// List the topics with schemas, their rule and versions.
    List,
    /// Check a schema against the topic's latest version without registering it: exit
    /// 0 when compatible, 1 when not (with the reason).
    Check {
        topic: String,
        /// The JSON Schema.
        #[arg(long, value_name = "S.json")]
        file: PathBuf,
    },
    /// Delete one version (--version) or every version of a topic's schema.
    Delete {
        topic: String,
        /// The version to delete (from 1); without it, every version.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        version: Option<u32>,
    },
}

/// Exit code of a register refused because the schema is not compatible (as `check`).
const INCOMPATIBLE: u8 = 1;

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let code = match &args.data_dir {
        Some(dir) => offline(&args, dir, &mut out)?,
        None => online(&args, &mut out)?,
    };
    out.flush()?;
    Ok(code)
}

/// The schema in `path` as compact JSON text: exit 74 for a file that cannot be read
/// (as any input file), 64 for one that is too long or not JSON.
fn read_schema(path: &Path) -> anyhow::Result<String> {
    let unreadable =
        |e: io::Error| ExitError::new(exit::IO, format!("cannot read {}: {e}", path.display()));
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > SCHEMA_BYTES_MAX as u64 {
        return Err(ExitError::usage(format!(
            "{} is {len} bytes; a schema is at most {SCHEMA_BYTES_MAX}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    // Sent as compact text; a file that is not JSON is refused here already.
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| ExitError::usage(format!("{} is not JSON: {e}", path.display())))?;
    Ok(v.to_string())
}

fn schema_error(e: ClientError) -> anyhow::Error {
    match e.code() {
        Some(ErrorCode::INVALID_SCHEMA) => ExitError::new(exit::USAGE, e.to_string()),
        Some(ErrorCode::SCHEMA_INCOMPATIBLE) => ExitError::new(INCOMPATIBLE, e.to_string()),
        _ => client_error(e),
    }
}

fn online(args: &Args, out: &mut impl Write) -> anyhow::Result<u8> {
    let mut client = args.broker.connect()?;
    match &args.command {
        SchemasCommand::Register {
            topic,
            file,
            compatibility,
        } => {
            let schema = read_schema(file)?;
            let version = client
                .schema_register(topic, compatibility.as_deref(), &schema)
                .map_err(schema_error)?;
            if args.json {
                writeln!(out, "{}", json!({ "topic": topic, "version": version }))?;
            } else {
                writeln!(out, "registered version {version} of the schema of {topic}")?;
            }
        }
        SchemasCommand::Get { topic, version } => {
            let s = client.schema_get(topic, *version).map_err(schema_error)?;
            write_get(out, args.json, topic, &s)?;
        }
        SchemasCommand::List => {
            let list = client.schema_list().map_err(schema_error)?;
            write_list(out, args.json, &list)?;
        }
        SchemasCommand::Check { topic, file } => {
            let schema = read_schema(file)?;
            let verdict = client.schema_check(topic, &schema).map_err(schema_error)?;
            if args.json {
                let v =
                    json!({ "topic": topic, "compatible": verdict.is_none(), "reason": verdict });
                writeln!(out, "{v}")?;
            } else {
                match &verdict {
                    None => writeln!(out, "compatible with the latest schema of {topic}")?,
                    Some(reason) => writeln!(out, "not compatible: {reason}")?,
                }
            }
            return Ok(if verdict.is_none() {
                exit::OK
            } else {
                INCOMPATIBLE
            });
        }
        SchemasCommand::Delete { topic, version } => {
            let deleted = client
                .schema_delete(topic, *version)
                .map_err(schema_error)?;
            if args.json {
                writeln!(out, "{}", json!({ "topic": topic, "deleted": deleted }))?;
            } else {
                let list: Vec<String> = deleted.iter().map(u32::to_string).collect();
                writeln!(
                    out,
                    "deleted version{} {} of the schema of {topic}",
                    if deleted.len() == 1 { "" } else { "s" },
                    list.join(", ")
                )?;
            }
        }
    }
    Ok(exit::OK)
}

fn offline(args: &Args, dir: &Path, out: &mut impl Write) -> anyhow::Result<u8> {
    if !dir.join(TOPICS_DIR).is_dir() {
        return Err(ExitError::usage(format!(
            "{} is not a seglog data directory (no {TOPICS_DIR}/)",
            dir.display()
        )));
    }
    let doc = || -> anyhow::Result<SchemasDoc> {
        read_file(dir).map_err(|e| ExitError::new(exit::CORRUPT, e.to_string()))
    };
    match &args.command {
        SchemasCommand::Get { topic, version } => {
            let doc = doc()?;
            let subject = doc.topics.get(topic).ok_or_else(|| {
                ExitError::new(exit::UNAVAILABLE, format!("topic {topic:?} has no schema"))
            })?;
            let v = match version {
                None => subject.latest(),
                Some(n) => subject.version(*n),
            }
            .ok_or_else(|| {
                ExitError::new(
                    exit::UNAVAILABLE,
                    format!(
                        "topic {topic:?} has no schema version {}",
                        version.unwrap_or_default()
                    ),
                )
            })?;
            let s = SchemaText {
                version: v.version,
                compatibility: subject.rule().as_str().to_string(),
                schema: v.schema.to_string(),
            };
            write_get(out, args.json, topic, &s)?;
        }
        SchemasCommand::List => {
            let list: Vec<SchemaListing> = doc()?
                .topics
                .into_iter()
                .map(|(topic, s)| SchemaListing {
                    compatibility: s.rule().as_str().to_string(),
                    versions: s.versions.iter().map(|v| v.version).collect(),
                    topic,
                })
                .collect();
            write_list(out, args.json, &list)?;
        }
        _ => {
            return Err(ExitError::usage(
                "--data-dir reads only (schemas get, schemas list); changes go through a broker",
            ))
        }
    }
    Ok(exit::OK)
}

fn write_get(
    out: &mut impl Write,
    json_out: bool,
    topic: &str,
    s: &SchemaText,
) -> anyhow::Result<()> {
    let schema: Value = serde_json::from_str(&s.schema)
        .map_err(|e| ExitError::new(exit::UNAVAILABLE, format!("the schema is not JSON: {e}")))?;
    if json_out {
        let v = json!({
            "topic": topic,
            "version": s.version,
            "compatibility": s.compatibility,
            "schema": schema,
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{}", serde_json::to_string_pretty(&schema)?)?;
    }
    Ok(())
}

fn write_list(out: &mut impl Write, json_out: bool, list: &[SchemaListing]) -> anyhow::Result<()> {
    if json_out {
        let topics: Vec<Value> = list
            .iter()
            .map(|s| {
                json!({
                    "topic": s.topic,
                    "compatibility": s.compatibility,
                    "versions": s.versions,
                    "latest": s.versions.last(),
                })
            })
            .collect();
        writeln!(out, "{}", json!({ "topics": topics }))?;
    } else {
        for s in list {
            let versions: Vec<String> = s.versions.iter().map(u32::to_string).collect();
            writeln!(
                out,
                "{} compatibility={} versions={}",
                s.topic,
                s.compatibility,
                versions.join(",")
            )?;
        }
    }
    Ok(())
}

/// The exit error of a produce the broker refused: for a schema violation (exit 65)
/// the message names the input record (`seq` counts from 0 over the whole input) as
/// well as the broker's partition, index and JSON pointer. `targets` is the partition
/// of each record of the request, in input order, starting at `first_seq`.
pub fn produce_refusal(
    e: ClientError,
    topic: &str,
    targets: &[u32],
    first_seq: u64,
) -> anyhow::Error {
    let ClientError::Refused { code, message, .. } = &e else {
        return client_error(e);
    };
    if *code != ErrorCode::SCHEMA_VIOLATION {
        return client_error(e);
    }
    let seq = violation_place(message).and_then(|(index, partition)| {
        let pos = targets
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == partition)
            .nth(usize::try_from(index).ok()?)?
            .0;
        Some(first_seq + pos as u64)
    });
    let record = match seq {
        Some(seq) => format!("record {} of the input (seq {seq})", seq + 1),
        None => "a record".to_string(),
    };
    ExitError::new(
        exit::SCHEMA_REFUSED,
        format!("{record} refused by the schema of {topic}, nothing of the request was written: {message}"),
    )
}

/// `(index, partition)` from a violation message `record I of partition P ...`.
fn violation_place(message: &str) -> Option<(u64, u32)> {
    let rest = message.strip_prefix("record ")?;
    let (index, rest) = rest.split_once(" of partition ")?;
    let partition = rest.split(' ').next()?;
    Some((index.parse().ok()?, partition.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violation_places() {
        assert_eq!(
            violation_place(
                "record 12 of partition 3 does not match schema version 1: at pointer \"/a\": x"
            ),
            Some((12, 3))
        );
        assert_eq!(violation_place("something else"), None);
        let e = ClientError::Refused {
            addr: "a".into(),
            code: ErrorCode::SCHEMA_VIOLATION,
            message:
                "record 1 of partition 0 does not match schema version 2: at pointer \"/x\": bad"
                    .into(),
        };
        // Records 0..4 of this request went to partitions 1, 0, 1, 0: the second
        // record of partition 0 is the fourth of the request.
        let err = produce_refusal(e, "t", &[1, 0, 1, 0], 10);
        let x = err.downcast_ref::<ExitError>().unwrap();
        assert_eq!(x.code, exit::SCHEMA_REFUSED);
        assert!(
            x.message.starts_with("record 14 of the input (seq 13)"),
            "{}",
            x.message
        );
        assert!(x.message.contains("\"/x\""), "{}", x.message);
    }
}
