//! One module per subcommand: parse → engine/format → render. `run` functions return
//! the exit code; errors become one line on stderr and the code their kind implies.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{FromArgMatches as _, Parser, Subcommand};

pub mod bench;
pub mod cluster;
pub mod compact;
pub mod completions;
pub mod connect;
pub mod consume;
pub mod consume_group;
pub mod damage;
pub mod dump;
pub mod escape;
pub mod format_string;
pub mod groups;
pub mod keys;
pub mod produce;
pub mod recover;
pub mod reindex;
pub mod schemas;
pub mod serve;
pub mod topics;
pub mod verify;

/// Exit codes fixed by the command-line contract.
pub mod exit {
    pub const OK: u8 = 0;
    /// Problems `recover` repairs without losing acknowledged data.
    pub const REPAIRABLE: u8 = 1;
    /// Records that cannot be read back, or segments that do not join up.
    pub const CORRUPT: u8 = 2;
    pub const USAGE: u8 = 64;
    /// A produced record was refused by the topic's schema.
    pub const SCHEMA_REFUSED: u8 = 65;
    /// Broker unreachable or it refused the request.
    pub const UNAVAILABLE: u8 = 69;
    /// The data directory is locked by a running broker or another tool.
    pub const LOCKED: u8 = 73;
    /// The broker refused the request for authentication or permission.
    pub const AUTH: u8 = 77;
    /// I/O error, or the command could not run for another reason.
    pub const IO: u8 = 74;
}

/// An error that carries its own exit code. Anything else exits 74.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExitError {
    pub code: u8,
    pub message: String,
}

impl ExitError {
    #[expect(
        clippy::new_ret_no_self,
        reason = "callers want an anyhow::Error to return with `?`"
    )]
    pub fn new(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(ExitError {
            code,
            message: message.into(),
        })
    }

    /// A usage error (exit 64).
    pub fn usage(message: impl Into<String>) -> anyhow::Error {
        Self::new(exit::USAGE, message)
    }
}

/// The exit-code table of `seglog --help` and `man seglog` (the README has the same).
const EXIT_CODES_HELP: &str = "\
Exit codes (the same whichever side, client or broker, finds the mistake):
  0   success; for checks: clean
  1   problems recover repairs without losing acknowledged data
  2   corruption: records that cannot be read back, or segments that do not join up
  64  usage error: a bad flag or argument, a bad topic name or partition, an unknown
      --config key or a value out of range, a record over max_record_bytes, a
      request over one of the broker's limits (serve --max-*)
  65  produce: a record refused by the topic's schema (nothing of that request written)
  69  broker unreachable (a failed TLS handshake too), failing, or refusing the
      request (no such topic, topic exists, offset out of range, storage error on
      the broker, TLS required)
  73  the data directory is locked by a running broker or another tool
  74  I/O error, or the command could not run for another reason
  77  authentication or permission refused (no API key, a bad or revoked one, a
      role or topic the key may not use, too many failed logins)";

#[derive(Debug, Parser)]
#[command(
    name = "seglog",
    version = concat!(env!("CARGO_PKG_VERSION"), " (format version 1)"),
    about = "A durable, partitioned log broker and the offline toolkit for its data directories",
    long_about = "seglog is a durable, partitioned log broker (serve, produce, consume, topics, bench) \
and the offline toolkit for its data directories (verify, recover, compact, reindex, dump).",
    after_long_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// Silence diagnostics and progress on stderr (errors are still printed).
    #[arg(long, short, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check headers, records, CRCs, indexes and segment continuity.
    Verify(verify::Args),
    /// Print records in offset order.
    Dump(dump::Args),
    /// Rebuild missing or invalid index files.
    Reindex(reindex::Args),
    /// Run the startup recovery on a data directory.
    Recover(recover::Args),
    /// Keep the newest record of each key in the sealed segments.
    Compact(compact::Args),
    /// Run the broker.
    Serve(Box<serve::Args>),
    /// Create, list, describe, alter and delete topics.
    Topics(topics::Args),
    /// Send records to a topic.
    Produce(produce::Args),
    /// Read records from a topic.
    Consume(consume::Args),
    /// Register, get, list, check and delete the topics' JSON Schemas.
    Schemas(schemas::Args),
    /// Load generator: measure produce or consume throughput and latency.
    Bench(bench::Args),
    /// Print the shell completion script (bash, zsh, fish).
    Completions(completions::Args),
    /// Damage a copy of a data directory exactly as asked (testing fixtures).
    Damage(damage::Args),
    /// List, describe, reset the offsets of and delete consumer groups.
    Groups(groups::Args),
    /// Create, list and revoke the API keys clients log in with.
    Keys(keys::Args),
    /// Show a cluster's nodes and the Raft state of its replicated partitions.
    Cluster(cluster::Args),
}

/// The environment variable naming the broker of the client commands.
pub const BROKER_ENV: &str = "SEGLOG_BROKER";

/// Options every command sees.
#[derive(Debug, Clone, Copy)]
pub struct Global {
    pub quiet: bool,
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    // An empty `$SEGLOG_BROKER` is as good as unset (the contract: "default
    // `$SEGLOG_BROKER`, else 127.0.0.1:9494"), not an invalid `--broker ''`. Done
    // before any thread starts.
    if std::env::var_os(BROKER_ENV).is_some_and(|v| v.to_string_lossy().trim().is_empty()) {
        std::env::remove_var(BROKER_ENV);
    }
    let cli = match command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(&e)),
    };
    let global = Global { quiet: cli.quiet };
    let result = match cli.command {
        Command::Verify(a) => verify::run(a, global),
        Command::Dump(a) => dump::run(a, global),
        Command::Reindex(a) => reindex::run(a, global),
        Command::Recover(a) => recover::run(a, global),
        Command::Compact(a) => compact::run(a, global),
        Command::Serve(a) => serve::run(*a, global),
        Command::Topics(a) => topics::run(a, global),
        Command::Produce(a) => produce::run(a, global),
        Command::Consume(a) => consume::run(a, global),
        Command::Schemas(a) => schemas::run(a, global),
        Command::Bench(a) => bench::run(a, global),
        Command::Completions(a) => completions::run(a, global),
        Command::Damage(a) => damage::run(a, global),
        Command::Groups(a) => groups::run(a, global),
        Command::Keys(a) => keys::run(a, global),
        Command::Cluster(a) => cluster::run(a, global),
    };
    ExitCode::from(finish(result))
}

/// The command line as parsed: [`Cli`], with every option that takes a value also
/// taking a negative number (`--partition -1`), so that its parser says what is wrong
/// with it and names the option, instead of clap reporting an unexpected argument
/// `-1`. Positional arguments are left alone, and so are `--` and flags. (The
/// duration options take any value starting with `-`, `-1s` included, the same way.)
pub fn command() -> clap::Command {
    fn negatives(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| {
            if !a.is_positional() && a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
        .mut_subcommands(negatives)
    }
    negatives(<Cli as clap::CommandFactory>::command())
}

/// Prints a clap outcome: `--help` and `--version` as clap renders them (exit 0), a
/// missing subcommand as the help (64), every other usage error as one line with a
/// hint where the help is (64).
fn usage_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    if !e.use_stderr() {
        let _ = e.print();
        return exit::OK;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return exit::USAGE;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _ = writeln!(
        io::stderr(),
        "{}",
        usage_line(&e.render().to_string(), &command_path(&args))
    );
    exit::USAGE
}

/// The subcommand path the arguments name ("seglog topics create"): each word that
/// is a subcommand of the one before, skipping flags.
fn command_path(args: &[String]) -> String {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut path = vec![cmd.get_name().to_string()];
    for a in args {
        if a.starts_with('-') {
            continue;
        }
        let Some(sub) = cmd.find_subcommand(a).cloned() else {
            break;
        };
        path.push(sub.get_name().to_string());
        cmd = sub;
    }
    path.join(" ")
}

/// `error: <clap's message, one line> (see '<command> --help')`: the first paragraph
/// of clap's text joined into one line (a missing argument's name and the possible
/// values stay in it), without the usage and tips that follow.
fn usage_line(rendered: &str, command: &str) -> String {
    let first: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let text = first.join(" ");
    let text = text.strip_prefix("error:").unwrap_or(&text).trim();
    let text = if text.is_empty() {
        "invalid command line"
    } else {
        text
    };
    format!("error: {text} (see '{command} --help')")
}

/// Maps a command's result to an exit code, printing the error as one line.
pub fn finish(result: anyhow::Result<u8>) -> u8 {
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => exit::OK,
        Err(e) => {
            let code = e.downcast_ref::<ExitError>().map_or(exit::IO, |x| x.code);
            let _ = writeln!(io::stderr(), "seglog: {}", one_line(&e));
            code
        }
    }
}

/// The error and its causes on one line: "outer: inner: root".
pub fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string().replace('\n', " ");
        if parts.last().is_none_or(|p| !p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

/// True when the error is a write to a closed pipe (`seglog dump | head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Formats a byte string for JSON output: a string when valid UTF-8, else `{"base64": …}`;
/// with `hex`/`base64` every value in that encoding as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BytesAs {
    /// Strings when valid UTF-8, else {"base64": "..."}.
    #[default]
    Auto,
    /// Every key and value as a hex string.
    Hex,
    /// Every key and value as a base64 string.
    Base64,
}

impl BytesAs {
    pub fn json(self, bytes: Option<&[u8]>) -> serde_json::Value {
        use base64::Engine as _;
        let Some(b) = bytes else {
            return serde_json::Value::Null;
        };
        match self {
            BytesAs::Auto => match std::str::from_utf8(b) {
                Ok(s) => serde_json::Value::String(s.to_string()),
                Err(_) => {
                    serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) })
                }
            },
            BytesAs::Hex => serde_json::Value::String(hex(b)),
            BytesAs::Base64 => {
                serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's first line for a command line [`command`] refuses.
    fn refused(args: &[&str]) -> String {
        let e = command()
            .try_get_matches_from(std::iter::once("seglog").chain(args.iter().copied()))
            .unwrap_err();
        e.render()
            .to_string()
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn negative_numbers_are_values_of_their_option() {
        for (args, named) in [
            (
                &["produce", "t", "--partition", "-1"][..],
                "'-1' for '--partition",
            ),
            (&["produce", "t", "--batch", "-5"], "'-5' for '--batch"),
            (&["dump", "d", "--from", "-1"], "'-1' for '--from"),
            (
                &["serve", "--preallocate-bytes", "-1"],
                "'-1' for '--preallocate-bytes",
            ),
            (
                &["topics", "list", "--timeout", "-1s"],
                "'-1s' for '--timeout",
            ),
            (&["consume", "t", "--timeout", "-1"], "'-1' for '--timeout"),
        ] {
            let line = refused(args);
            assert!(line.contains(named), "{args:?}: {line}");
        }
        // A topic after `--` may start with '-'; a stray negative positional is still
        // an unexpected argument.
        let m = command()
            .try_get_matches_from(["seglog", "produce", "--value", "v", "--", "-x"])
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        assert!(matches!(cli.command, Command::Produce(p) if p.topic == "-x"));
        assert!(refused(&["verify", "d", "-1"]).contains("unexpected argument '-1'"));
    }

    #[test]
    fn usage_errors_are_one_line() {
        let clap_text = "error: the following required arguments were not provided:\n  <PATH>\n\nUsage: seglog verify <PATH>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_line(clap_text, "seglog verify"),
            "error: the following required arguments were not provided: <PATH> (see 'seglog verify --help')"
        );
        assert_eq!(
            usage_line("", "seglog"),
            "error: invalid command line (see 'seglog --help')"
        );
        let args = |a: &[&str]| a.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            command_path(&args(&["-q", "topics", "create", "x", "--partitions", "y"])),
            "seglog topics create"
        );
        assert_eq!(command_path(&args(&["bogus"])), "seglog");
    }
}
