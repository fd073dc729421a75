//! `seglog groups list|describe|reset-offsets|delete`: consumer groups, against a
//! broker, or (list and describe) read straight from a data directory's
//! `groups/*.json` with `--data-dir`.
//!
//! describe's JSON: `{"group", "state", "generation", "members": [{"member_id",
//! "client_id", "partitions": [{"topic", "partition"}]}], "offsets": [{"topic",
//! "partition", "committed", "end", "lag"}]}`; lag = end − committed (0 if below).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use comfy_table::Table;
use serde_json::{json, Value};

use super::connect::{client_error, BrokerArgs};
use super::consume::StartAt;
use super::consume_group::PROTOCOL_TYPE as CONSUMER_PROTOCOL_TYPE;
use super::{exit, ExitError, Global};
use crate::engine::groups::offsets::{read_group_file, scan_dir, GroupEntry, Loaded};
use crate::engine::groups::GroupState;
use crate::engine::net::client::Client;
use crate::engine::net::group_client::{GroupInfo, GroupMember};
use crate::engine::net::kafka::consumer_assignment_partitions;
use crate::format::group::{group_file_name, CommittedOffset, GROUPS_DIR};
use crate::format::names::{validate_name, TOPICS_DIR};
use crate::format::wire::groups::decode_topic_partitions;

/// Arguments of `seglog groups`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: GroupsCommand,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Read a data directory instead of asking a broker (list and describe only).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum GroupsCommand {
    /// List the consumer groups and their states.
    List,
    /// A group's members, their partitions, and per partition the committed offset,
    /// the end offset and the lag.
    Describe { group: String },
    /// Set a group's committed offsets of a topic (refused while the group has live
    /// members).
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        /// earliest, latest, or an offset (clamped to each partition's range).
        #[arg(long, value_parser = parse_to, required_unless_present = "to_datetime", conflicts_with = "to_datetime")]
        to: Option<StartAt>,
        /// The first offset stamped at or after this time (RFC 3339 or ms since the
        /// epoch), per partition.
        #[arg(long, value_name = "TIME", value_parser = super::consume::parse_time)]
        to_datetime: Option<i64>,
    },
    /// Delete a group without members: its committed offsets and its file.
    Delete { group: String },
}

fn parse_to(s: &str) -> Result<StartAt, String> {
    match s {
        "earliest" => Ok(StartAt::Earliest),
        "latest" => Ok(StartAt::Latest),
        n => n
            .parse()
            .map(StartAt::Offset)
            .map_err(|_| format!("{s:?} is not earliest, latest or an offset")),
    }
}

fn check_group(group: &str) -> anyhow::Result<()> {
    validate_name(group)
        .map_err(|e| ExitError::new(exit::USAGE, format!("invalid group name: {e}")))
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if let Some(dir) = &args.data_dir {
        return offline(&args, dir, &mut out);
    }
    let group = match &args.command {
        GroupsCommand::List => None,
        GroupsCommand::Describe { group }
        | GroupsCommand::ResetOffsets { group, .. }
        | GroupsCommand::Delete { group } => Some(group.as_str()),
    };
    if let Some(g) = group {
        check_group(g)?;
    }
    let mut client = args.broker.connect_coordinator(group)?;
    match &args.command {
        GroupsCommand::List => {
            let mut groups = client.list_groups().map_err(client_error)?;
            groups.sort();
            write_list(&mut out, args.json, &groups)?;
        }
        GroupsCommand::Describe { group } => {
            check_group(group)?;
            let info = client.describe_group(group).map_err(client_error)?;
            let ends = end_offsets(&mut client, &info.offsets, &info)?;
            write_describe(&mut out, args.json, group, &info, &ends)?;
        }
        GroupsCommand::ResetOffsets {
            group,
            topic,
            to,
            to_datetime,
        } => {
            check_group(group)?;
            let offsets = client.list_offsets(topic).map_err(client_error)?;
            let mut chosen = Vec::with_capacity(offsets.len());
            for o in &offsets {
                let at = match (to, to_datetime) {
                    (_, Some(ms)) => super::consume::first_at_or_after(&mut client, topic, o, *ms)?,
                    (Some(t), None) => t.start_at(o.start_offset, o.end_offset),
                    (None, None) => o.end_offset,
                };
                chosen.push((o.partition, at, ""));
            }
            client
                .commit_offsets(group, -1, "", topic, &chosen)
                .map_err(client_error)?;
            if args.json {
                let parts: Vec<Value> = chosen
                    .iter()
                    .map(|(p, o, _)| json!({"topic": topic, "partition": p, "committed": o}))
                    .collect();
                writeln!(out, "{}", json!({"group": group, "offsets": parts}))?;
            } else {
                for (p, o, _) in &chosen {
                    writeln!(out, "{group} {topic}/{p} -> {o}")?;
                }
            }
        }
        GroupsCommand::Delete { group } => {
            check_group(group)?;
            client.delete_group(group).map_err(client_error)?;
            if args.json {
                writeln!(out, "{}", json!({"group": group, "deleted": true}))?;
            } else {
                writeln!(out, "deleted group {group}")?;
            }
        }
    }
    out.flush()?;
    Ok(exit::OK)
}

/// End offsets of every topic named in the offsets or in the members' assignments.
fn end_offsets(
    client: &mut Client,
    offsets: &[CommittedOffset],
    info: &GroupInfo,
) -> anyhow::Result<BTreeMap<(String, u32), u64>> {
    let mut topics: Vec<String> = offsets.iter().map(|o| o.topic.clone()).collect();
    for m in &info.members {
        topics.extend(
            member_partitions(&info.protocol_type, &m.assignment)
                .into_iter()
                .map(|(t, _)| t),
        );
    }
    topics.sort();
    topics.dedup();
    let mut ends = BTreeMap::new();
    for t in topics {
        // A topic deleted since the commit has no end: its offsets show none.
        if let Ok(list) = client.list_offsets(&t) {
            for o in list {
                ends.insert((t.clone(), o.partition), o.end_offset);
            }
        }
    }
    Ok(ends)
}

fn write_list(out: &mut impl Write, as_json: bool, groups: &[(String, String)]) -> io::Result<()> {
    if as_json {
        let list: Vec<Value> = groups
            .iter()
            .map(|(g, s)| json!({"group": g, "state": s}))
            .collect();
        writeln!(out, "{}", json!({ "groups": list }))
    } else {
        for (g, s) in groups {
            writeln!(out, "{g} {s}")?;
        }
        Ok(())
    }
}

/// A member's assigned (topic, partitions), from its assignment as the group's
/// leader gave it: seglog's own encoding (`consume --group`), or, in a group of
/// protocol type `consumer`, Kafka's consumer-protocol assignment (members of the
/// Kafka listener). seglog's is tried first: it starts with a u32 topic count, Kafka's
/// with an i16 version 0–3 and an i32 count, so a Kafka assignment read as seglog's
/// claims either no topic and then has bytes left over, or 65536 topics or more (of
/// 6 bytes at least each, ending exactly at the end), which no assignor's output is.
/// Anything else (no sync yet, another protocol type, bytes of neither) has no
/// partitions; the rest of the description is unaffected.
fn member_partitions(protocol_type: &str, assignment: &[u8]) -> Vec<(String, Vec<u32>)> {
    if let Ok(a) = decode_topic_partitions(assignment) {
        return a;
    }
    if protocol_type == CONSUMER_PROTOCOL_TYPE {
        if let Some(a) = consumer_assignment_partitions(assignment) {
            return a;
        }
    }
    Vec::new()
}

/// (member id, client id, assigned (topic, partition)s).
type MemberRow = (String, String, Vec<(String, u32)>);

fn write_describe(
    out: &mut impl Write,
    as_json: bool,
    group: &str,
    info: &GroupInfo,
    ends: &BTreeMap<(String, u32), u64>,
) -> io::Result<()> {
    let members: Vec<MemberRow> = info
        .members
        .iter()
        .map(|m| {
            let parts = member_partitions(&info.protocol_type, &m.assignment)
                .into_iter()
                .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
                .collect();
            (m.member_id.clone(), m.client_id.clone(), parts)
        })
        .collect();
    // Every committed partition, and every assigned partition without a commit.
    let mut rows: BTreeMap<(String, u32), Option<u64>> = info
        .offsets
        .iter()
        .map(|o| ((o.topic.clone(), o.partition), Some(o.offset)))
        .collect();
    for (_, _, parts) in &members {
        for tp in parts {
            rows.entry(tp.clone()).or_insert(None);
        }
    }
    let row_json = |(t, p): &(String, u32), committed: &Option<u64>| {
        let end = ends.get(&(t.clone(), *p));
        let lag = match (committed, end) {
            (Some(c), Some(e)) => json!(e.saturating_sub(*c)),
            (None, Some(e)) => json!(e),
            _ => Value::Null,
        };
        json!({"topic": t, "partition": p, "committed": committed, "end": end, "lag": lag})
    };
    if as_json {
        let v = json!({
            "group": group,
            "state": info.state,
            "generation": info.generation,
            "members": members.iter().map(|(id, client, parts)| json!({
                "member_id": id,
                "client_id": client,
                "partitions": parts.iter().map(|(t, p)| json!({"topic": t, "partition": p})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "offsets": rows.iter().map(|(k, c)| row_json(k, c)).collect::<Vec<_>>(),
        });
        return writeln!(out, "{v}");
    }
    writeln!(
        out,
        "group {group}: {} (generation {}), {} member{}",
        info.state,
        info.generation,
        members.len(),
        if members.len() == 1 { "" } else { "s" }
    )?;
    let owner = |tp: &(String, u32)| {
        members
            .iter()
            .find(|(_, _, parts)| parts.contains(tp))
            .map_or("-".to_string(), |(id, _, _)| id.clone())
    };
    let mut table = Table::new();
    table.set_header(["topic", "partition", "committed", "end", "lag", "member"]);
    for (k, committed) in &rows {
        let v = row_json(k, committed);
        let show = |x: &Value| {
            if x.is_null() {
                "-".to_string()
            } else {
                x.to_string()
            }
        };
        table.add_row([
            k.0.clone(),
            k.1.to_string(),
            show(&v["committed"]),
            show(&v["end"]),
            show(&v["lag"]),
            owner(k),
        ]);
    }
    writeln!(out, "{table}")
}

/// list and describe over a data directory: the group files, and the end offsets
/// found by checking each partition's segments.
fn offline(args: &Args, dir: &Path, out: &mut impl Write) -> anyhow::Result<u8> {
    if !dir.join(TOPICS_DIR).is_dir() {
        return Err(ExitError::new(
            exit::USAGE,
            format!("{} is not a seglog data directory", dir.display()),
        ));
    }
    let groups_dir = dir.join(GROUPS_DIR);
    match &args.command {
        GroupsCommand::List => {
            let mut groups = Vec::new();
            for e in scan_dir(&groups_dir) {
                match e {
                    GroupEntry::Group(g, l) => groups.push((g, offline_info(l).state)),
                    GroupEntry::Leftover(_) => {}
                    GroupEntry::Problem(p) => eprintln!("seglog: groups/{p}"),
                }
            }
            write_list(out, args.json, &groups)?;
        }
        GroupsCommand::Describe { group } => {
            check_group(group)?;
            let path = groups_dir.join(group_file_name(group));
            if !path.exists() {
                return Err(ExitError::new(
                    exit::UNAVAILABLE,
                    format!("group {group} does not exist in {}", dir.display()),
                ));
            }
            let (_, loaded) = read_group_file(&path)
                .map_err(|e| ExitError::new(exit::CORRUPT, format!("groups/{e}")))?;
            if let Some(p) = &loaded.membership_problem {
                eprintln!(
                    "seglog: groups/{}: {p}; the broker loads the group without members, who rejoin",
                    group_file_name(group)
                );
            }
            let info = offline_info(loaded);
            let mut partitions: Vec<(String, u32)> = info
                .offsets
                .iter()
                .map(|o| (o.topic.clone(), o.partition))
                .collect();
            for m in &info.members {
                for (t, ps) in member_partitions(&info.protocol_type, &m.assignment) {
                    partitions.extend(ps.into_iter().map(|p| (t.clone(), p)));
                }
            }
            partitions.sort();
            partitions.dedup();
            let mut ends = BTreeMap::new();
            for (t, p) in partitions {
                if let Some(end) = offline_end(dir, &t, p) {
                    ends.insert((t, p), end);
                }
            }
            write_describe(out, args.json, group, &info, &ends)?;
        }
        _ => {
            return Err(ExitError::new(
                exit::USAGE,
                "--data-dir serves only groups list and groups describe; reset-offsets and \
                 delete need a running broker (--broker)",
            ))
        }
    }
    out.flush()?;
    Ok(exit::OK)
}

/// A group as a broker started on the data directory loads it (docs/FORMAT.md,
/// groups): with a stored membership, Stable with that generation, protocol and
/// members; else Empty.
fn offline_info(l: Loaded) -> GroupInfo {
    let (state, protocol, members) = match l.membership {
        Some(m) => (
            GroupState::Stable,
            m.protocol,
            m.members
                .into_iter()
                .map(|x| GroupMember {
                    member_id: x.member_id,
                    client_id: x.client_id,
                    assignment: x.assignment,
                })
                .collect(),
        ),
        None => (GroupState::Empty, String::new(), Vec::new()),
    };
    GroupInfo {
        state: state.name().to_string(),
        generation: l.generation,
        protocol_type: l.protocol_type,
        protocol,
        members,
        offsets: l.offsets,
    }
}

/// The next offset of a partition on disk, from a quick check of its segments.
fn offline_end(dir: &Path, topic: &str, partition: u32) -> Option<u64> {
    use crate::engine::maintenance::check::{check_partition, CheckMode};
    let topic_dir = dir.join(TOPICS_DIR).join(topic);
    let parts = crate::engine::storage::layout::topic_partitions(&topic_dir).ok()?;
    let p = parts.iter().find(|p| p.partition == Some(partition))?;
    let check = check_partition(p, CheckMode::Quick).ok()?;
    check.next_offset().or_else(|| {
        check
            .segments
            .iter()
            .map(crate::engine::maintenance::check::SegmentCheck::base_offset)
            .max()
    })
}
