//! `seglog cluster status`: a cluster node's view of its nodes and of the Raft group
//! of each replicated partition it holds (leader, term, commit and applied index, and,
//! on the leader, each replica's match index and lag and the in-sync replicas).

use std::fmt::Write as _;
use std::io::{self, Write};

use comfy_table::Table;
use serde_json::Value;

use super::connect::{client_error, BrokerArgs};
use super::{exit, ExitError, Global};
use crate::engine::net::client::ClientError;
use crate::format::wire::ErrorCode;

/// Arguments of `seglog cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: ClusterCommand,
    /// Print the JSON object the broker answers instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Show the nodes and, per replicated partition, its leader, term, commit
    /// index, the replicas' lag and the in-sync replicas.
    Status,
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let ClusterCommand::Status = args.command;
    let mut client = args.broker.cluster()?;
    let json = client.cluster_status().map_err(|e| match &e {
        // A broker of an earlier release refuses the request when it has no
        // --peers: the user asked nothing wrong.
        ClientError::Refused {
            code: ErrorCode::INVALID_REQUEST,
            message,
            ..
        } if message.contains("not part of a cluster") => ExitError::new(
            exit::UNAVAILABLE,
            "the broker is standalone (started without --peers): it has no cluster status",
        ),
        _ => client_error(e),
    })?;
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{json}")?;
        return Ok(exit::OK);
    }
    let v: Value = serde_json::from_str(&json)?;
    write!(out, "{}", render(&v))?;
    Ok(exit::OK)
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The text form: the cluster id and node, a table of nodes, a table of partitions.
/// A standalone broker (no `--peers`) is one line and its one node.
pub fn render(v: &Value) -> String {
    let standalone = v["standalone"].as_bool() == Some(true);
    let mut s = if standalone {
        format!(
            "standalone broker (started without --peers): node {} only, no replicated partitions\n",
            text(&v["node_id"])
        )
    } else {
        format!(
            "cluster {} (node {})\n",
            text(&v["cluster_id"]),
            text(&v["node_id"])
        )
    };
    let mut nodes = Table::new();
    nodes.set_header(["node", "raft address", "client address", "reachable"]);
    for n in v["nodes"].as_array().into_iter().flatten() {
        nodes.add_row([
            text(&n["id"]),
            text(&n["raft_addr"]),
            text(&n["client_addr"]),
            text(&n["reachable"]),
        ]);
    }
    let _ = writeln!(s, "{nodes}");
    if standalone {
        return s;
    }
    let mut parts = Table::new();
    parts.set_header([
        "partition",
        "leader",
        "term",
        "commit",
        "applied",
        "replicas (match/lag)",
        "in sync",
    ]);
    for p in v["partitions"].as_array().into_iter().flatten() {
        let replicas: Vec<String> = p["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}:{}/{}",
                    text(&r["node"]),
                    text(&r["match_index"]),
                    text(&r["lag"])
                )
            })
            .collect();
        parts.add_row([
            format!("{}/{}", text(&p["topic"]), text(&p["partition"])),
            text(&p["leader"]),
            text(&p["term"]),
            text(&p["commit_index"]),
            text(&p["applied_index"]),
            if replicas.is_empty() {
                "-".into()
            } else {
                replicas.join(" ")
            },
            match p["in_sync"].as_array() {
                Some(ids) => ids.iter().map(text).collect::<Vec<_>>().join(","),
                None => "-".into(),
            },
        ]);
    }
    let _ = writeln!(s, "{parts}");
    // A fail-stopped replica leads nothing (its row names the leader the others
    // name, if any): why, below the table, whose cells stay short.
    for p in v["partitions"].as_array().into_iter().flatten() {
        if let Some(why) = p["failed"].as_str() {
            let _ = writeln!(
                s,
                "{}/{}: this node's replica is stopped until a restart runs recovery: {why}",
                text(&p["topic"]),
                text(&p["partition"])
            );
        }
        if let Some(why) = p["closed"].as_str() {
            let _ = writeln!(
                s,
                "{}/{}: this node's replica is not open: {why}",
                text(&p["topic"]),
                text(&p["partition"])
            );
        }
    }
    s
}
