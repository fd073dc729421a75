//! What the client commands (`topics`, `produce`, `consume`, `bench`) share: the
//! `--broker`/`--timeout` flags, duration parsing, and the mapping of client errors
//! to exit codes (69 when the broker is unreachable or refuses).

use std::time::Duration;

use super::{exit, ExitError};
use crate::engine::net::client::{Client, ClientError, DEFAULT_BROKER};

/// `--broker` and `--timeout`.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    /// Broker address (host:port).
    #[arg(long, env = "SEGLOG_BROKER", default_value = DEFAULT_BROKER, global = true)]
    pub broker: String,
    /// How long to wait to connect and for each response: 500ms, 10s, 1m.
    #[arg(long, default_value = "30s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,
}

impl BrokerArgs {
    /// Connects and performs the handshake.
    pub fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(&self.broker, self.timeout).map_err(client_error)
    }
}

/// Exit 69 for an unreachable or refusing broker (the message names the address),
/// 64 for a request that cannot be encoded, 74 for a record that fails its check.
pub fn client_error(e: ClientError) -> anyhow::Error {
    let code = match e {
        ClientError::Encode(_) => exit::USAGE,
        ClientError::BadRecord { .. } => exit::IO,
        _ => exit::UNAVAILABLE,
    };
    ExitError::new(code, e.to_string())
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
    }

    #[test]
    fn settings() {
        let ok = parse_settings(&["a=1".into(), "b=x=y".into()]).unwrap();
        assert_eq!(ok, [("a".into(), "1".into()), ("b".into(), "x=y".into())]);
        assert!(parse_settings(&["novalue".into()]).is_err());
        assert!(parse_settings(&["=1".into()]).is_err());
    }
}
