//! `seglog topics create|list|describe|alter|delete`: topic administration over the
//! wire protocol. The broker validates names and settings; this side only checks
//! that each `--config` is `KEY=VALUE`.

use std::io::{self, Write};

use comfy_table::Table;
use serde_json::{json, Map, Value};

use super::connect::{client_error, holder_named, parse_settings, BrokerArgs};
use super::{exit, Global};
use crate::engine::net::client::TopicInfo;
use crate::engine::partition::now_ms;
use crate::format::topic::TopicConfig;
use crate::format::wire::{CleanupInfo, PartitionDescription, PartitionHealth};

/// Arguments of `seglog topics`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: TopicsCommand,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// The topic configuration keys with units, defaults and ranges (`topics --help`,
/// `topics create --help`, `topics alter --help`, their man pages and the README).
pub const CONFIG_KEYS_HELP: &str = "\
Topic configuration keys (--config KEY=VALUE; whole numbers only):
  key                     unit          default              range
  segment_bytes           bytes         67108864 (64 MiB)    1024..=4294967296
  segment_ms              milliseconds  604800000 (7 days)   >= 1
  retention_ms            milliseconds  604800000 (7 days)   >= 0, or -1: keep forever
  retention_bytes         bytes         -1 (no limit)        >= 0, or -1: no limit
  cleanup_policy          -             delete               delete, compact, compact,delete
  tombstone_retention_ms  milliseconds  86400000 (1 day)     >= 0
  max_record_bytes        bytes         1048576 (1 MiB)      1..=16777216
segment_bytes and segment_ms roll the active segment; retention_ms and retention_bytes
apply with cleanup_policy delete, tombstone_retention_ms with compact; a record over
max_record_bytes is refused (exit 64).";

#[derive(Debug, clap::Subcommand)]
#[command(after_long_help = CONFIG_KEYS_HELP)]
pub enum TopicsCommand {
    /// Create a topic.
    #[command(after_long_help = CONFIG_KEYS_HELP)]
    Create {
        name: String,
        /// Number of partitions (1..=1024).
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// A configuration setting, KEY=VALUE; repeat for several.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        /// Replicas of each partition, on distinct nodes of a cluster (1..=7; more
        /// than 1 needs brokers started with --peers, at least as many nodes).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=7))]
        replication_factor: u32,
    },
    /// List topic names.
    List,
    /// Show each partition's offsets, records present, segment count and bytes, the
    /// state of its data (ok, damaged, failed), what retention and compaction last
    /// did, and the configuration.
    Describe { name: String },
    /// Change configuration settings.
    #[command(after_long_help = CONFIG_KEYS_HELP)]
    Alter {
        name: String,
        /// A configuration setting, KEY=VALUE; repeat for several.
        #[arg(long = "config", value_name = "KEY=VALUE", required = true)]
        config: Vec<String>,
    },
    /// Delete a topic and all its data.
    Delete { name: String },
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let mut client = args.broker.connect()?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match args.command {
        TopicsCommand::Create {
            name,
            partitions,
            config,
            replication_factor,
        } => {
            let mut settings = parse_settings(&config)?;
            if replication_factor > 1 {
                settings.push((
                    crate::engine::net::dispatch::REPLICATION_FACTOR_SETTING.to_string(),
                    replication_factor.to_string(),
                ));
            }
            client
                .create_topic(&name, partitions, &settings)
                .map_err(client_error)?;
            if args.json {
                writeln!(
                    out,
                    "{}",
                    json!({ "topic": name, "partitions": partitions, "created": true })
                )?;
            } else {
                writeln!(
                    out,
                    "created topic {name} with {partitions} partition{}",
                    plural(partitions)
                )?;
            }
        }
        TopicsCommand::List => {
            let mut topics = client.list_topics().map_err(client_error)?;
            topics.sort();
            let offline = offline_topics(&mut client, &topics).map_err(client_error)?;
            if args.json {
                let mut v = json!({ "topics": topics });
                if !offline.is_empty() {
                    let map: Map<String, Value> = offline
                        .iter()
                        .map(|(t, why)| (t.clone(), Value::String(why.clone())))
                        .collect();
                    v["offline"] = Value::Object(map);
                }
                writeln!(out, "{v}")?;
            } else {
                for t in topics {
                    match offline.iter().find(|(name, _)| *name == t) {
                        Some((_, why)) => writeln!(out, "{t} (offline: {why})")?,
                        None => writeln!(out, "{t}")?,
                    }
                }
            }
        }
        TopicsCommand::Describe { name } => {
            // A cluster node holding no replica of the topic names one that does.
            let mut info = client.describe_topic(&name);
            if let Some(addr) = holder_named(&info, client.addr()) {
                client = args.broker.connect_to(&addr)?;
                info = client.describe_topic(&name);
            }
            let info = info.map_err(client_error)?;
            if args.json {
                writeln!(out, "{}", describe_json(&name, &info))?;
            } else {
                write_description(&mut out, &name, &info)?;
            }
        }
        TopicsCommand::Alter { name, config } => {
            let settings = parse_settings(&config)?;
            let after = client.alter_topic(&name, &settings).map_err(client_error)?;
            if args.json {
                writeln!(
                    out,
                    "{}",
                    json!({ "topic": name, "config": config_json(&after) })
                )?;
            } else {
                writeln!(out, "altered topic {name}")?;
                writeln!(out, "{}", config_table(&after))?;
            }
        }
        TopicsCommand::Delete { name } => {
            client.delete_topic(&name).map_err(client_error)?;
            if args.json {
                writeln!(out, "{}", json!({ "topic": name, "deleted": true }))?;
            } else {
                writeln!(out, "deleted topic {name}")?;
            }
        }
    }
    out.flush()?;
    Ok(exit::OK)
}

/// The listed topics the broker keeps offline (their metadata has a problem), with
/// the broker's message: each answers a describe with `corrupt_data`.
fn offline_topics(
    client: &mut crate::engine::net::client::Client,
    topics: &[String],
) -> Result<Vec<(String, String)>, crate::engine::net::client::ClientError> {
    use crate::engine::net::client::ClientError;
    use crate::format::wire::ErrorCode;
    let mut out = Vec::new();
    for t in topics {
        match client.describe_topic(t) {
            Ok(_) => {}
            Err(ClientError::Refused { code, message, .. }) if code == ErrorCode::CORRUPT_DATA => {
                out.push((t.clone(), message));
            }
            // Deleted since the list, or any other refusal: not an offline topic.
            Err(ClientError::Refused { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The configuration as JSON with the same value types as `topic.json`.
fn config_json(settings: &[(String, String)]) -> Value {
    let mut config = TopicConfig::default();
    if settings.iter().all(|(k, v)| config.set(k, v).is_ok()) {
        return config.to_json();
    }
    // A key this build does not know (a newer broker): show the text as given.
    let map: Map<String, Value> = settings
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    Value::Object(map)
}

/// The cleanup info of `partition`, if the broker sent any (protocol version 2 on).
fn cleanup_of(info: &TopicInfo, partition: u32) -> Option<&CleanupInfo> {
    info.cleanup.iter().find(|c| c.partition == partition)
}

/// The records and state of `partition`, if the broker sent them (protocol version
/// 3 on).
fn health_of(info: &TopicInfo, partition: u32) -> Option<&PartitionHealth> {
    info.health.iter().find(|h| h.partition == partition)
}

/// Records present: the broker's count, or `end - start` from a broker older than
/// protocol version 3 (which is too high where compaction left gaps).
fn records_of(info: &TopicInfo, p: &PartitionDescription) -> u64 {
    health_of(info, p.partition).map_or(p.end_offset.saturating_sub(p.start_offset), |h| h.records)
}

fn cleanup_json(c: &CleanupInfo) -> Value {
    let ms = |v: i64| if v < 0 { Value::Null } else { json!(v) };
    json!({
        "last_retention_ms": ms(c.last_retention_ms),
        "segments_deleted": c.segments_deleted,
        "bytes_deleted": c.bytes_deleted,
        "segments_archived": c.segments_archived,
        "last_compaction_ms": ms(c.last_compaction_ms),
        "compactions": c.compactions,
        "records_dropped": c.records_dropped,
        "bytes_compacted": c.bytes_compacted,
        "error": (!c.last_error.is_empty()).then_some(c.last_error.as_str()),
    })
}

fn describe_json(name: &str, info: &TopicInfo) -> Value {
    let partitions: Vec<Value> = info
        .partitions
        .iter()
        .map(|p| {
            let mut v = json!({
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "records": records_of(info, p),
                "segments": p.segments,
                "bytes": p.bytes,
                "cleanup": cleanup_of(info, p.partition).map(cleanup_json),
            });
            if let (Some(h), Some(m)) = (health_of(info, p.partition), v.as_object_mut()) {
                m.insert("state".into(), json!(h.state.as_str()));
                let detail = (!h.detail.is_empty()).then_some(h.detail.as_str());
                m.insert("detail".into(), json!(detail));
                m.insert("spares".into(), json!(h.spares));
                m.insert("preallocated_bytes".into(), json!(h.preallocated_bytes));
            }
            v
        })
        .collect();
    json!({ "topic": name, "partitions": partitions, "config": config_json(&info.config) })
}

fn config_table(settings: &[(String, String)]) -> Table {
    let mut t = Table::new();
    t.set_header(["config", "value"]);
    for (k, v) in settings {
        t.add_row([k.as_str(), v.as_str()]);
    }
    t
}

fn write_description(out: &mut impl Write, name: &str, info: &TopicInfo) -> io::Result<()> {
    writeln!(
        out,
        "topic {name}: {} partition{}",
        info.partitions.len(),
        plural(info.partitions.len() as u32)
    )?;
    let mut t = Table::new();
    let mut header = vec![
        "partition",
        "start_offset",
        "end_offset",
        "records",
        "segments",
        "bytes",
    ];
    let with_state = !info.health.is_empty();
    if with_state {
        header.extend(["state", "spares", "preallocated_bytes"]);
    }
    t.set_header(header);
    let mut details = Vec::new();
    for p in &info.partitions {
        let mut row = vec![
            p.partition.to_string(),
            p.start_offset.to_string(),
            p.end_offset.to_string(),
            records_of(info, p).to_string(),
            p.segments.to_string(),
            p.bytes.to_string(),
        ];
        if with_state {
            let h = health_of(info, p.partition);
            row.push(h.map_or("-", |h| h.state.as_str()).to_string());
            row.push(h.map_or_else(|| "-".into(), |h| h.spares.to_string()));
            row.push(h.map_or_else(|| "-".into(), |h| h.preallocated_bytes.to_string()));
            if let Some(h) = h.filter(|h| !h.detail.is_empty()) {
                details.push(format!(
                    "partition {} {}: {}",
                    p.partition,
                    h.state.as_str(),
                    h.detail
                ));
            }
        }
        t.add_row(row);
    }
    writeln!(out, "{t}")?;
    for line in details {
        writeln!(out, "{line}")?;
    }
    if !info.cleanup.is_empty() {
        writeln!(out, "{}", cleanup_table(&info.cleanup, now_ms()))?;
    }
    writeln!(out, "{}", config_table(&info.config))
}

/// When a background task last ran, as an age: `never`, `12s ago`.
fn ago(at_ms: i64, now: i64) -> String {
    if at_ms < 0 {
        return "never".into();
    }
    let s = now.saturating_sub(at_ms).max(0) / 1000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}m ago", s / 60),
        7200..=172_799 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn cleanup_table(cleanup: &[CleanupInfo], now: i64) -> Table {
    let mut t = Table::new();
    t.set_header([
        "partition",
        "retention",
        "segments_deleted",
        "bytes_deleted",
        "archived",
        "compaction",
        "records_dropped",
        "bytes_compacted",
        "error",
    ]);
    for c in cleanup {
        t.add_row([
            c.partition.to_string(),
            ago(c.last_retention_ms, now),
            c.segments_deleted.to_string(),
            c.bytes_deleted.to_string(),
            c.segments_archived.to_string(),
            ago(c.last_compaction_ms, now),
            c.records_dropped.to_string(),
            c.bytes_compacted.to_string(),
            c.last_error.clone(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::topic::CONFIG_KEYS;

    /// The help table names every key with its default, so it cannot fall behind
    /// `src/format/topic.rs`.
    #[test]
    fn config_help_lists_every_key_with_its_default() {
        let defaults = TopicConfig::default().to_json();
        for key in CONFIG_KEYS {
            let row = CONFIG_KEYS_HELP
                .lines()
                .find(|l| l.split_whitespace().next() == Some(key))
                .unwrap_or_else(|| panic!("{key} missing from the help table"));
            let default = match &defaults[key] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let cols: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cols.get(2), Some(&default.as_str()), "{row}");
        }
    }
}
