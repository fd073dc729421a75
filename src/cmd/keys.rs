//! `seglog keys create|list|revoke`: the broker's API keys, through an admin request
//! to a running broker (applied at once), or offline on a data directory with
//! `--data-dir` (taking `DATA/LOCK`).
//!
//! `create` prints the token on stdout, once: it is not stored anywhere (the broker
//! keeps a hash). JSON (`--json`): create prints `{"id", "name", "role", "topics",
//! "groups", "created_ms", "token"}`; list prints one object, `{"keys": [{"id",
//! "name", "role", "topics", "groups", "created_ms", "last_used_ms"}]}` (-1: never
//! used); revoke prints `{"revoked": ID}`.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use comfy_table::Table;
use serde_json::json;

use super::connect::{client_error, BrokerArgs};
use super::{exit, ExitError, Global};
use crate::engine::keys::{check_role_patterns, KeyError, KeyStore};
use crate::engine::storage::io::RealStorage;
use crate::engine::storage::lock::{DirLock, LockError};
use crate::format::keys::{KeyEntry, Role};
use crate::format::names::TOPICS_DIR;

/// Arguments of `seglog keys`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: KeysCommand,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Change the data directory's api_keys.json directly (the broker must not be
    /// running: DATA/LOCK is taken) instead of asking a broker.
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Create a key and print its token (shown only this once).
    Create {
        /// A name for the key's holder; several keys may share one (rotation).
        #[arg(long)]
        name: String,
        /// producer: produce to and read metadata of its topics; consumer: fetch,
        /// list offsets and use consumer groups of its topics and groups; admin:
        /// everything.
        #[arg(long, value_parser = ["producer", "consumer", "admin"])]
        role: String,
        /// Topics the key may use: a glob (`orders.*`); repeat for more. Producer and
        /// consumer keys need at least one ('*': every topic); admin keys take none.
        #[arg(long = "topic", value_name = "GLOB")]
        topics: Vec<String>,
        /// Consumer groups the key may use: a glob; repeat for more (consumer keys
        /// only).
        #[arg(long = "group", value_name = "GLOB")]
        groups: Vec<String>,
    },
    /// List the keys (never a secret).
    List,
    /// Revoke a key: logins with it fail, connections using it are refused.
    Revoke { id: String },
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    if let KeysCommand::Create {
        role,
        topics,
        groups,
        ..
    } = &args.command
    {
        if role != Role::Admin.as_str() && topics.is_empty() {
            return Err(ExitError::usage(format!(
                "a {role} key needs at least one --topic GLOB ('*' for every topic)"
            )));
        }
        if let Some(role) = Role::parse(role) {
            check_role_patterns(role, topics, groups).map_err(ExitError::usage)?;
        }
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match &args.data_dir {
        Some(dir) => offline(&args, dir, &mut out)?,
        None => online(&args, &mut out)?,
    }
    out.flush()?;
    Ok(exit::OK)
}

fn online(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let mut client = args.broker.connect()?;
    match &args.command {
        KeysCommand::Create {
            name,
            role,
            topics,
            groups,
        } => {
            let k = client
                .key_create(name, role, topics, groups)
                .map_err(client_error)?;
            let entry = KeyEntry {
                id: k.id,
                name: name.clone(),
                role: Role::parse(role)
                    .ok_or_else(|| ExitError::usage(format!("unknown role {role:?}")))?,
                topics: topics.clone(),
                groups: groups.clone(),
                created_ms: k.created_ms,
                last_used_ms: -1,
                secret_sha256: String::new(),
            };
            write_created(out, args.json, &entry, &k.token)
        }
        KeysCommand::List => {
            let keys = client.key_list().map_err(client_error)?;
            write_list(out, args.json, &keys)
        }
        KeysCommand::Revoke { id } => {
            client.key_revoke(id).map_err(client_error)?;
            write_revoked(out, args.json, id)
        }
    }
}

fn offline(args: &Args, dir: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    if !dir.join(TOPICS_DIR).is_dir() {
        return Err(ExitError::usage(format!(
            "{} is not a seglog data directory (no {TOPICS_DIR}/)",
            dir.display()
        )));
    }
    let _lock = DirLock::acquire(dir).map_err(|e| match e {
        LockError::Held { .. } => ExitError::new(exit::LOCKED, e.to_string()),
        other => ExitError::new(exit::IO, other.to_string()),
    })?;
    let store = KeyStore::open(Arc::new(RealStorage), dir).map_err(key_error)?;
    match &args.command {
        KeysCommand::Create {
            name,
            role,
            topics,
            groups,
        } => {
            let c = store
                .create(name, role, topics, groups)
                .map_err(key_error)?;
            write_created(out, args.json, &c.entry, &c.token)
        }
        KeysCommand::List => write_list(out, args.json, &store.list()),
        KeysCommand::Revoke { id } => {
            store.revoke(id).map_err(key_error)?;
            write_revoked(out, args.json, id)
        }
    }
}

/// Exit 64 for a bad field, 69 for an unknown key id (as for an unknown topic),
/// 2 for an unreadable file, 74 for I/O.
fn key_error(e: KeyError) -> anyhow::Error {
    let code = match &e {
        KeyError::Invalid(_) | KeyError::BadRole(_) | KeyError::TooMany => exit::USAGE,
        KeyError::UnknownKey { .. } => exit::UNAVAILABLE,
        KeyError::Unreadable { .. } => exit::CORRUPT,
        _ => exit::IO,
    };
    ExitError::new(code, e.to_string())
}

fn entry_json(k: &KeyEntry) -> serde_json::Value {
    json!({
        "id": k.id,
        "name": k.name,
        "role": k.role.as_str(),
        "topics": k.topics,
        "groups": k.groups,
        "created_ms": k.created_ms,
        "last_used_ms": k.last_used_ms,
    })
}

fn write_created(
    out: &mut impl Write,
    as_json: bool,
    k: &KeyEntry,
    token: &str,
) -> anyhow::Result<()> {
    if as_json {
        let mut v = entry_json(k);
        if let Some(o) = v.as_object_mut() {
            o.remove("last_used_ms");
            o.insert("token".into(), json!(token));
        }
        writeln!(out, "{v}")?;
    } else {
        let _ = writeln!(
            io::stderr(),
            "seglog: created API key {} ({} {}); its token is shown only this once:",
            k.id,
            k.role.as_str(),
            k.name
        );
        writeln!(out, "{token}")?;
    }
    Ok(())
}

fn write_list(out: &mut impl Write, as_json: bool, keys: &[KeyEntry]) -> anyhow::Result<()> {
    if as_json {
        let keys: Vec<serde_json::Value> = keys.iter().map(entry_json).collect();
        writeln!(out, "{}", json!({ "keys": keys }))?;
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header([
        "id",
        "name",
        "role",
        "topics",
        "groups",
        "created",
        "last used",
    ]);
    for k in keys {
        table.add_row([
            k.id.clone(),
            k.name.clone(),
            k.role.as_str().to_string(),
            k.topics.join(","),
            k.groups.join(","),
            super::dump::format_timestamp_ms(k.created_ms),
            if k.last_used_ms < 0 {
                "never".to_string()
            } else {
                super::dump::format_timestamp_ms(k.last_used_ms)
            },
        ]);
    }
    writeln!(out, "{table}")?;
    Ok(())
}

fn write_revoked(out: &mut impl Write, as_json: bool, id: &str) -> anyhow::Result<()> {
    if as_json {
        writeln!(out, "{}", json!({ "revoked": id }))?;
    } else {
        writeln!(out, "revoked {id}")?;
    }
    Ok(())
}
