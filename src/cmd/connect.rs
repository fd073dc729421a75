//! What the client commands (`topics`, `produce`, `consume`, `bench`) share: the
//! `--broker`/`--timeout` flags, the API key (`--token-file` or `$SEGLOG_TOKEN`, never a
//! flag holding the token itself, which would show in the process list), the TLS flags
//! (`--tls`, `--tls-ca`, a client certificate), duration parsing, and the mapping of client errors
//! to exit codes: 64 for an invalid argument, whichever side finds it (the broker's
//! error code says which refusals are that), 69 when the broker is unreachable or
//! fails.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use super::{exit, ExitError};
use crate::engine::net::client::{Client, ClientError, DEFAULT_BROKER};
use crate::engine::net::tls::{ClientTls, TlsError};
use crate::format::wire::{ErrorCode, PartitionOffsets};

/// `--broker` and `--timeout`.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    /// Broker address (host:port); several, comma-separated, for a cluster (the
    /// first that answers is used, and requests follow partition leaders).
    #[arg(long, env = "SEGLOG_BROKER", default_value = DEFAULT_BROKER, global = true, value_parser = parse_broker_addrs)]
    pub broker: String,
    /// How long to wait for each response: 500ms, 10s, 1m.
    #[arg(long, allow_hyphen_values = true, default_value = "30s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,
    /// Longest a connection's setup (TCP connect, TLS, the version handshake) takes
    /// before the next --broker address is tried (at most --timeout): a broker that
    /// accepts but does not answer, such as a paused process, costs this much.
    #[arg(long, allow_hyphen_values = true, default_value = "10s", value_parser = parse_positive_duration, global = true)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl BrokerArgs {
    /// Connects (over TLS with `--tls`) and performs the handshake, logging in with
    /// the API key if one is given.
    pub fn connect(&self) -> anyhow::Result<Client> {
        self.try_connect()?.map_err(client_error)
    }

    /// [`BrokerArgs::connect`] that keeps why the last address failed as a
    /// [`ClientError`] (a reconnect reports it as the cause); the outer error is one
    /// of the flags (token file, TLS files, no address).
    pub fn try_connect(&self) -> anyhow::Result<Result<Client, ClientError>> {
        let token = self.token.token()?;
        let tls = self.tls.client_tls()?;
        // `--broker A,B,C`: the first broker that answers.
        let mut errors = Vec::new();
        for addr in crate::engine::net::cluster_client::broker_list(&self.broker) {
            match Client::connect_within(
                &addr,
                self.connect_timeout,
                self.timeout,
                tls.as_ref(),
                token.as_deref(),
            ) {
                Ok(c) => return Ok(Ok(c)),
                Err(e) => errors.push(e),
            }
        }
        ClientError::of_all(errors)
            .map(Err)
            .ok_or_else(|| ExitError::usage("--broker names no address"))
    }

    /// A connection to `addr` with this command's timeout, TLS and token.
    pub fn connect_to(&self, addr: &str) -> anyhow::Result<Client> {
        let token = self.token.token()?;
        let tls = self.tls.client_tls()?;
        Client::connect_within(
            addr,
            self.connect_timeout,
            self.timeout,
            tls.as_ref(),
            token.as_deref(),
        )
        .map_err(client_error)
    }

    /// A connection to the group coordinator: in a cluster, the node leading the
    /// offsets topic, which the other nodes name in their refusals (followed for up
    /// to `cluster_client::FOLLOW_TIMEOUT`, through an election); a single broker is
    /// its own.
    /// `group`: the group the command is about (a cluster that has no offsets
    /// topic yet creates it when asked about a group).
    pub fn connect_coordinator(&self, group: Option<&str>) -> anyhow::Result<Client> {
        let mut cluster = self.cluster()?;
        let addr = cluster
            .on_coordinator(|c| {
                let probe = match group {
                    Some(g) => c.describe_group(g).map(drop),
                    None => c.list_groups().map(drop),
                };
                match probe {
                    // Any answer but a refusal naming another node comes from the
                    // coordinator (the group may not exist yet).
                    Err(ClientError::Refused { code, .. }) if code != ErrorCode::NOT_LEADER => {
                        Ok(c.addr().to_string())
                    }
                    Err(e) => Err(e),
                    Ok(()) => Ok(c.addr().to_string()),
                }
            })
            .map_err(client_error)?;
        self.connect_to(&addr)
    }

    /// The `--broker` address after `addr` (the first when `addr` is not listed),
    /// wrapping around; `None` when there is no other. Where a request goes next
    /// when a node refuses it with NOT_LEADER naming no leader (a node whose replica
    /// stopped, or one that has not heard of the new leader yet): another node may
    /// know the leader, or be it.
    pub fn next_broker(&self, addr: &str) -> Option<String> {
        let list = crate::engine::net::cluster_client::broker_list(&self.broker);
        let next = match list.iter().position(|a| a == addr) {
            Some(i) => list.get((i + 1) % list.len()),
            None => list.first(),
        };
        next.filter(|a| a.as_str() != addr).cloned()
    }

    /// Whether `--broker` names several addresses (a cluster's nodes).
    pub fn several(&self) -> bool {
        crate::engine::net::cluster_client::broker_list(&self.broker).len() > 1
    }

    /// With several `--broker` addresses (a cluster), a connection to the node that
    /// leads `topic/partition` as the first node that answers knows it; otherwise
    /// (one address, no cluster, no leader known) [`BrokerArgs::connect`].
    ///
    /// A cluster node holding no replica of the topic names one that does (NOT_LEADER
    /// to its list-offsets); the connection moves there first, so one `--broker`
    /// address of any node of the cluster is enough.
    ///
    /// Also returns the topic's list-offsets as the node connected to answered it
    /// (asked once: a refusal, such as an unknown topic, is one request and one log
    /// line on the broker).
    pub fn connect_leader(&self, topic: &str, partition: u32) -> anyhow::Result<(Client, Offsets)> {
        let (mut client, moved, offsets) = self.connect_holder(topic)?;
        if !self.several() && !moved {
            return Ok((client, offsets));
        }
        let leaders = leader_addrs(&mut client, topic);
        match leaders.get(&partition) {
            Some(a) if a != client.addr() => match self.connect_to(a) {
                Ok(mut leader) => {
                    let offsets = leader.list_offsets(topic);
                    Ok((leader, offsets))
                }
                Err(_) => Ok((client, offsets)),
            },
            _ => Ok((client, offsets)),
        }
    }

    /// [`BrokerArgs::connect`], moved to a node holding a replica of `topic` when
    /// the node answering holds none and names one ([`HOLDER_HOPS_MAX`] moves at
    /// most). True when the connection moved; the last node's answer to the
    /// list-offsets that asked.
    pub fn connect_holder(&self, topic: &str) -> anyhow::Result<(Client, bool, Offsets)> {
        let mut client = self.connect()?;
        let mut moved = false;
        let mut offsets = client.list_offsets(topic);
        for _ in 0..HOLDER_HOPS_MAX {
            let Some(addr) = holder_named(&offsets, client.addr()) else {
                break;
            };
            client = self.connect_to(&addr)?;
            moved = true;
            offsets = client.list_offsets(topic);
        }
        Ok((client, moved, offsets))
    }

    /// A client of every broker `--broker` lists, following partition leaders.
    pub fn cluster(&self) -> anyhow::Result<crate::engine::net::cluster_client::ClusterClient> {
        let brokers = crate::engine::net::cluster_client::broker_list(&self.broker);
        if brokers.is_empty() {
            return Err(ExitError::usage("--broker names no address"));
        }
        Ok(crate::engine::net::cluster_client::ClusterClient::new(
            brokers,
            self.timeout,
            self.tls.client_tls()?,
            self.token.token()?,
        )
        .with_connect_timeout(self.connect_timeout))
    }
}

/// A topic's list-offsets answer.
pub type Offsets = Result<Vec<PartitionOffsets>, ClientError>;

/// Per partition of `topic`, the client address of its leader as the node behind
/// `client` knows it (`cluster status`); empty when the node is not part of a
/// cluster or holds no replica of the topic.
pub fn leader_addrs(client: &mut Client, topic: &str) -> std::collections::HashMap<u32, String> {
    let mut leaders = std::collections::HashMap::new();
    let Ok(json) = client.cluster_status() else {
        return leaders;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else {
        return leaders;
    };
    let nodes: std::collections::HashMap<u64, &str> = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_u64()?, n["client_addr"].as_str()?)))
        .collect();
    for p in v["partitions"].as_array().into_iter().flatten() {
        if p["topic"] != topic {
            continue;
        }
        let partition = p["partition"].as_u64().and_then(|n| u32::try_from(n).ok());
        let addr = p["leader"].as_u64().and_then(|id| nodes.get(&id));
        if let (Some(partition), Some(addr)) = (partition, addr) {
            leaders.insert(partition, (*addr).to_string());
        }
    }
    leaders
}

/// Most times in a row one partition's request follows a NOT_LEADER (or, on a
/// cluster, a lost leader) to another node: an election takes about a second, and
/// each follow waits [`LEADER_PAUSE`] first.
pub const LEADER_FOLLOWS_MAX: u32 = 100;
pub const LEADER_PAUSE: Duration = Duration::from_millis(100);

/// Most moves of [`BrokerArgs::connect_holder`] (a node holding no replica names one
/// that does: one move, unless the topic moved meanwhile).
pub(crate) const HOLDER_HOPS_MAX: usize = 3;

/// The address a NOT_LEADER refusal names, when it is not `here`.
pub fn holder_named<T>(result: &Result<T, ClientError>, here: &str) -> Option<String> {
    match result {
        Err(ClientError::Refused {
            code: ErrorCode::NOT_LEADER,
            message,
            ..
        }) => crate::format::wire::parse_not_leader(message)
            .map(|(_, addr)| addr)
            .filter(|a| a != here),
        _ => None,
    }
}

/// Longest token file read (a token is under 100 bytes).
const TOKEN_FILE_BYTES_MAX: u64 = 4096;

/// `--token-file`, or the token itself in `$SEGLOG_TOKEN`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// File holding the API key token to log in with (`seglog keys create` prints
    /// it; keep the file 0600). Default: the token in $SEGLOG_TOKEN, if set.
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
}

impl TokenArgs {
    /// The token: the first line of `--token-file`, else `$SEGLOG_TOKEN`, else none.
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(std::env::var("SEGLOG_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()));
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(TOKEN_FILE_BYTES_MAX).read_to_string(&mut text))
            .map_err(|e| {
                ExitError::new(
                    exit::IO,
                    format!("cannot read --token-file {}: {e}", path.display()),
                )
            })?;
        let token = text.lines().next().unwrap_or("").trim();
        if token.is_empty() {
            return Err(ExitError::usage(format!(
                "--token-file {} holds no token",
                path.display()
            )));
        }
        Ok(Some(token.to_string()))
    }
}

/// `--tls`, `--tls-ca` and the client certificate, shared by every client command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Connect over TLS, trusting the CA of --tls-ca.
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM file of the CA that signed the broker's certificate (with --tls).
    #[arg(long, env = "SEGLOG_TLS_CA", value_name = "PEM", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this client's certificate chain, for a broker that requires client
    /// certificates (serve --tls-client-ca); with --tls-key.
    #[arg(
        long,
        env = "SEGLOG_TLS_CERT",
        value_name = "PEM",
        global = true,
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --tls-cert.
    #[arg(
        long,
        env = "SEGLOG_TLS_KEY",
        value_name = "PEM",
        global = true,
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS settings to connect with (`None` without `--tls`). Exit 64 when
    /// `--tls` has no CA or a PEM file holds no usable certificate or key, 74 when a
    /// file cannot be read.
    pub fn client_tls(&self) -> anyhow::Result<Option<ClientTls>> {
        if !self.tls {
            return Ok(None);
        }
        let Some(ca) = &self.tls_ca else {
            return Err(ExitError::usage(
                "--tls needs the CA that signed the broker's certificate: --tls-ca PEM or $SEGLOG_TLS_CA",
            ));
        };
        let client = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        ClientTls::from_pem_files(ca, client)
            .map(Some)
            .map_err(|e| tls_setup_error(&e, ""))
    }
}

/// A TLS set-up error as the commands exit with it: 74 for a PEM file that cannot
/// be read, 64 for one that holds nothing usable; `context`, when not empty, goes
/// before the error.
pub(crate) fn tls_setup_error(e: &TlsError, context: &str) -> anyhow::Error {
    let code = if e.is_unreadable_file() {
        exit::IO
    } else {
        exit::USAGE
    };
    if context.is_empty() {
        ExitError::new(code, e.to_string())
    } else {
        ExitError::new(code, format!("{context}: {e}"))
    }
}

/// Checks a `--broker` value: one or more comma-separated `HOST:PORT` (a port of
/// 1 to 65535). A value that is no address is a usage error (64), told apart from an
/// address that cannot be reached (69).
pub fn parse_broker_addrs(text: &str) -> Result<String, String> {
    let addrs = crate::engine::net::cluster_client::broker_list(text);
    if addrs.is_empty() {
        return Err("names no address (HOST:PORT)".into());
    }
    for a in &addrs {
        let ok = a.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(format!("{a:?} is not HOST:PORT"));
        }
    }
    Ok(text.to_string())
}

/// Checks a listen address (`serve --listen` and the other listeners): `HOST:PORT`,
/// a port of 0 (a free one) to 65535. A value that is no address is a usage error
/// (64); one that cannot be bound is told when binding (74).
pub fn parse_listen_addr(text: &str) -> Result<String, String> {
    let ok = text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains(char::is_whitespace) && port.parse::<u16>().is_ok()
    });
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not HOST:PORT"))
    }
}

/// Exit 64 for a request that cannot be encoded, an address that is a Raft
/// listener, or a request the broker refuses as an invalid argument
/// ([`refusal_exit`]), 74 for a record that fails its check, 69 otherwise
/// (unreachable or failing broker; the message names the address).
pub fn client_error(e: ClientError) -> anyhow::Error {
    let code = match &e {
        ClientError::Encode(_) | ClientError::RaftListener { .. } => exit::USAGE,
        ClientError::BadRecord { .. } => exit::IO,
        ClientError::Refused { code, .. } => refusal_exit(*code),
        _ => exit::UNAVAILABLE,
    };
    ExitError::new(code, e.to_string())
}

/// [`client_error`] for the list-offsets a command sends before its own requests,
/// told as what the user asked (`verb`: "produce to", "consume from"). A producer or
/// consumer key may describe exactly the topics it may produce to or consume from,
/// so a key refused the list-offsets of a topic may not `verb` it either.
pub fn first_request_error(e: ClientError, verb: &str) -> anyhow::Error {
    if let ClientError::Refused {
        addr,
        code: ErrorCode::NOT_AUTHORIZED,
        message,
    } = &e
    {
        if let Some((key, topic)) = message.split_once(" may not list_offsets on topic ") {
            return ExitError::new(
                exit::AUTH,
                format!(
                    "the broker at {addr} refused the request: {key} may not {verb} topic {topic} [{}]",
                    ErrorCode::NOT_AUTHORIZED
                ),
            );
        }
    }
    client_error(e)
}

/// The exit code of a request the broker refused with `code`: 64 for the
/// invalid-argument family (a bad topic name, a bad partition count or partition, an
/// unknown configuration key or a value out of range, a record over the topic's
/// `max_record_bytes`, a session timeout outside the broker's range, a request the
/// broker cannot carry out as asked), the same
/// code the client gives when it notices the mistake itself; 77 for authentication
/// and permission refusals; 69 for the rest (no such topic, topic exists, offset out
/// of range, and every broker-side failure).
pub fn refusal_exit(code: ErrorCode) -> u8 {
    match code {
        ErrorCode::INVALID_NAME
        | ErrorCode::INVALID_CONFIG
        | ErrorCode::UNKNOWN_PARTITION
        | ErrorCode::RECORD_TOO_LARGE
        | ErrorCode::INVALID_REQUEST
        | ErrorCode::INVALID_SCHEMA
        | ErrorCode::INVALID_SESSION_TIMEOUT
        | ErrorCode::LIMIT_EXCEEDED => exit::USAGE,
        ErrorCode::SCHEMA_VIOLATION => exit::SCHEMA_REFUSED,
        ErrorCode::AUTH_REQUIRED
        | ErrorCode::AUTH_FAILED
        | ErrorCode::NOT_AUTHORIZED
        | ErrorCode::AUTH_RATE_LIMITED => exit::AUTH,
        _ => exit::UNAVAILABLE,
    }
}

/// Parses a duration that must be longer than zero (`--flush-interval`, the check
/// intervals): `0s` is a usage error, not a broker that fails to start.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    Ok(d)
}

/// Parses a positive duration, or `off` (zero).
pub fn parse_interval_or_off(text: &str) -> Result<Duration, String> {
    if text.trim() == "off" {
        return Ok(Duration::ZERO);
    }
    parse_positive_duration(text)
}

/// Parses `500ms`, `2s`, `1m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 2s or 1m"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?} (use ms, s, m or h)"
            ))
        }
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Splits `KEY=VALUE` settings given with `--config`.
pub fn parse_settings(settings: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    settings
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => Err(ExitError::usage(format!("--config {s:?} is not KEY=VALUE"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "-1s", "10x", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_positive_duration("0ms").is_err());
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn refusals_by_kind() {
        for code in [
            ErrorCode::INVALID_NAME,
            ErrorCode::INVALID_CONFIG,
            ErrorCode::UNKNOWN_PARTITION,
            ErrorCode::RECORD_TOO_LARGE,
            ErrorCode::INVALID_REQUEST,
            ErrorCode::INVALID_SESSION_TIMEOUT,
        ] {
            assert_eq!(refusal_exit(code), exit::USAGE, "{code}");
        }
        for code in [
            ErrorCode::UNKNOWN_TOPIC,
            ErrorCode::TOPIC_EXISTS,
            ErrorCode::OFFSET_OUT_OF_RANGE,
            ErrorCode::STORAGE,
            ErrorCode::PARTITION_FAILED,
            ErrorCode::INTERNAL,
            ErrorCode(999),
        ] {
            assert_eq!(refusal_exit(code), exit::UNAVAILABLE, "{code}");
        }
        for code in [
            ErrorCode::AUTH_REQUIRED,
            ErrorCode::AUTH_FAILED,
            ErrorCode::NOT_AUTHORIZED,
            ErrorCode::AUTH_RATE_LIMITED,
        ] {
            assert_eq!(refusal_exit(code), exit::AUTH, "{code}");
        }
    }

    #[test]
    fn broker_addresses() {
        for ok in [
            "127.0.0.1:9494",
            "a:1,b:2",
            "[::1]:9092",
            "localhost:65535, h:3",
        ] {
            assert!(parse_broker_addrs(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ",",
            "not an address",
            "host",
            "host:",
            ":9",
            "h:0",
            "h:70000",
            "h:x",
        ] {
            assert!(parse_broker_addrs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn listen_addresses() {
        for ok in [
            "127.0.0.1:0",
            "0.0.0.0:9494",
            "[::1]:9092",
            "localhost:65535",
        ] {
            assert!(parse_listen_addr(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "bogus",
            "host:",
            ":9",
            "127.0.0.1:99999",
            "x:y",
            "a b:1",
        ] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings() {
        let ok = parse_settings(&["a=1".into(), "b=x=y".into()]).unwrap();
        assert_eq!(ok, [("a".into(), "1".into()), ("b".into(), "x=y".into())]);
        assert!(parse_settings(&["novalue".into()]).is_err());
        assert!(parse_settings(&["=1".into()]).is_err());
    }
}
