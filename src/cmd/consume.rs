//! `seglog consume`: read records of a topic (one partition, or all of them).
//!
//! Without `--follow` each partition is read from `--from` up to the end offset it
//! had when the command started, partitions in order. With `--follow` every
//! partition is read by its own thread over its own connection, long-polling for
//! new records, and lines appear as they arrive. Every record's CRC is checked by
//! the client before it is printed.

use std::io::{self, Write};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::json;

use super::connect::{client_error, BrokerArgs};
use super::{exit, BytesAs, ExitError, Global};
use crate::engine::error::damaged_range;
use crate::engine::net::client::{Client, ClientError, Fetched as Fetch, Record};
use crate::format::wire::{ErrorCode, FETCH_BYTES_MAX};

/// How long one long-poll fetch waits for new records under `--follow`.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// Arguments of `seglog consume`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Topic to read.
    pub topic: String,
    /// Read only this partition (default: all).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Where to start in each partition: earliest, latest, or an offset.
    #[arg(long, default_value = "earliest", value_parser = parse_from)]
    pub from: StartAt,
    /// Stop after this many records.
    #[arg(long)]
    pub count: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end of the log.
    #[arg(long)]
    pub follow: bool,
    /// Print JSON Lines {"type": "record", "partition", "offset", "timestamp_ms", "key", "value"}.
    #[arg(long)]
    pub json: bool,
    /// How --json renders keys and values.
    #[arg(long, value_enum, default_value_t = BytesAs::Auto)]
    pub bytes: BytesAs,
    /// What to do at records the broker cannot read: stop (exit 2, naming the
    /// offsets) or skip them (say on stderr what was skipped, and go on).
    #[arg(long, value_enum, default_value_t = OnCorrupt::Stop)]
    pub on_corrupt: OnCorrupt,
    /// Most record bytes per fetch request.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(1..=i64::from(FETCH_BYTES_MAX)))]
    pub max_bytes: u32,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// `--on-corrupt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnCorrupt {
    Stop,
    Skip,
}

/// A fetch refused because the records at `pos` are damaged: under `stop` the
/// command's error (exit 2, one line naming the range); under `skip` a note on stderr
/// and `Ok(Some(next))`, the next readable offset (`Ok(None)`: none follows).
fn damage_step(
    on_corrupt: OnCorrupt,
    topic: &str,
    partition: u32,
    e: &ClientError,
) -> Option<anyhow::Result<Option<u64>>> {
    let ClientError::Refused { message, code, .. } = e else {
        return None;
    };
    if *code != ErrorCode::CORRUPT_DATA {
        return None;
    }
    let (first, next) = damaged_range(message)?;
    let range = match next {
        Some(n) => format!("offsets {first}..{n} (next readable offset {n})"),
        None => format!("offsets from {first} (no readable record follows)"),
    };
    Some(match on_corrupt {
        OnCorrupt::Stop => Err(ExitError::new(
            exit::CORRUPT,
            format!("{topic}/{partition}: {range} cannot be read: {message}"),
        )),
        OnCorrupt::Skip => {
            eprintln!("seglog: {topic}/{partition}: skipped {range}: damaged records");
            Ok(next)
        }
    })
}

/// `--from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    Earliest,
    Latest,
    Offset(u64),
}

fn parse_from(s: &str) -> Result<StartAt, String> {
    match s {
        "earliest" => Ok(StartAt::Earliest),
        "latest" => Ok(StartAt::Latest),
        n => n
            .parse()
            .map(StartAt::Offset)
            .map_err(|_| format!("{s:?} is not earliest, latest or an offset")),
    }
}

impl StartAt {
    fn start(self, start_offset: u64, end_offset: u64) -> u64 {
        match self {
            StartAt::Earliest => start_offset,
            StartAt::Latest => end_offset,
            StartAt::Offset(o) => o,
        }
    }
}

/// Writes one record as a line.
fn write_record(out: &mut impl Write, args: &Args, partition: u32, r: &Record) -> io::Result<()> {
    if args.json {
        let line = json!({
            "type": "record",
            "partition": partition,
            "offset": r.offset,
            "timestamp_ms": r.timestamp_ms,
            "key": args.bytes.json(r.key.as_deref()),
            "value": args.bytes.json(Some(&r.value)),
        });
        writeln!(out, "{line}")
    } else {
        out.write_all(&r.value)?;
        out.write_all(b"\n")
    }
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let mut client = args.broker.connect()?;
    let offsets = client.list_offsets(&args.topic).map_err(client_error)?;
    let chosen: Vec<_> = match args.partition {
        Some(p) => match offsets.iter().find(|o| o.partition == p) {
            Some(o) => vec![*o],
            None => {
                return Err(ExitError::new(
                    exit::USAGE,
                    format!(
                        "topic {} has {} partitions; there is no partition {p}",
                        args.topic,
                        offsets.len()
                    ),
                ))
            }
        },
        None => offsets,
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let limit = args.count.unwrap_or(u64::MAX);
    if limit == 0 {
        return Ok(exit::OK);
    }
    if args.follow {
        return follow(
            &args,
            chosen
                .iter()
                .map(|o| (o.partition, args.from.start(o.start_offset, o.end_offset)))
                .collect(),
            limit,
            &mut out,
        );
    }
    let mut printed = 0u64;
    for o in chosen {
        let mut pos = args.from.start(o.start_offset, o.end_offset);
        if pos < o.start_offset || pos > o.end_offset {
            // Outside the log: the broker's refusal names the range (exit 69).
            client
                .fetch(
                    &args.topic,
                    o.partition,
                    pos,
                    args.max_bytes,
                    Duration::ZERO,
                )
                .map_err(client_error)?;
        }
        while pos < o.end_offset && printed < limit {
            let fetched = client.fetch(
                &args.topic,
                o.partition,
                pos,
                args.max_bytes,
                Duration::ZERO,
            );
            if let Err(e) = &fetched {
                if let Some(step) = damage_step(args.on_corrupt, &args.topic, o.partition, e) {
                    match step? {
                        Some(next) => {
                            pos = next;
                            continue;
                        }
                        None => break,
                    }
                }
            }
            let f = match moved_start(
                &mut client,
                &args.topic,
                args.from == StartAt::Earliest,
                o.partition,
                pos,
                fetched,
            )? {
                Ok(f) => f,
                Err(start) => {
                    pos = start;
                    continue;
                }
            };
            if f.records.is_empty() {
                // Nothing at or after `pos` below the end we started with (the
                // tail was compacted away): this partition is done.
                break;
            }
            for r in f.records.iter().take_while(|r| r.offset < o.end_offset) {
                if printed >= limit {
                    break;
                }
                write_record(&mut out, &args, o.partition, r)?;
                printed += 1;
            }
            pos = f.records.last().map_or(pos, |r| r.offset + 1);
            out.flush()?;
        }
    }
    out.flush()?;
    Ok(exit::OK)
}

/// Under `--from earliest`, retention may remove the records at `pos` while we read:
/// the fetch is then refused as out of range, and reading goes on from the
/// partition's new start (`Err(start)`), as a Kafka consumer with
/// `auto.offset.reset=earliest` does. Any other refusal is the command's error.
fn moved_start(
    client: &mut Client,
    topic: &str,
    earliest: bool,
    partition: u32,
    pos: u64,
    fetched: Result<Fetch, ClientError>,
) -> anyhow::Result<Result<Fetch, u64>> {
    match fetched {
        Ok(f) => Ok(Ok(f)),
        Err(e) if earliest && e.code() == Some(ErrorCode::OFFSET_OUT_OF_RANGE) => {
            let offsets = client.list_offsets(topic).map_err(client_error)?;
            match offsets.iter().find(|o| o.partition == partition) {
                Some(o) if o.start_offset > pos => Ok(Err(o.start_offset)),
                _ => Err(client_error(e)),
            }
        }
        Err(e) => Err(client_error(e)),
    }
}

/// What a follower thread sends to the printer.
enum Fetched {
    Records(u32, Vec<Record>),
    Failed(anyhow::Error),
}

/// Reads every partition on its own thread and connection; prints in arrival order
/// until `limit` records were printed (or forever).
fn follow(
    args: &Args,
    starts: Vec<(u32, u64)>,
    limit: u64,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let (tx, rx) = mpsc::sync_channel::<Fetched>(64);
    for (partition, mut pos) in starts {
        let tx = tx.clone();
        let broker = args.broker.clone();
        let topic = args.topic.clone();
        let max_bytes = args.max_bytes;
        let earliest = args.from == StartAt::Earliest;
        let on_corrupt = args.on_corrupt;
        thread::spawn(move || {
            let mut run = || -> anyhow::Result<()> {
                let mut client: Client = broker.connect()?;
                loop {
                    let fetched = client.fetch(&topic, partition, pos, max_bytes, FOLLOW_WAIT);
                    if let Err(e) = &fetched {
                        if let Some(step) = damage_step(on_corrupt, &topic, partition, e) {
                            match step? {
                                Some(next) => {
                                    pos = next;
                                    continue;
                                }
                                None => return Ok(()),
                            }
                        }
                    }
                    let f = match moved_start(
                        &mut client,
                        &topic,
                        earliest,
                        partition,
                        pos,
                        fetched,
                    )? {
                        Ok(f) => f,
                        Err(start) => {
                            pos = start;
                            continue;
                        }
                    };
                    if let Some(last) = f.records.last() {
                        pos = last.offset + 1;
                        if tx.send(Fetched::Records(partition, f.records)).is_err() {
                            return Ok(());
                        }
                    }
                }
            };
            if let Err(e) = run() {
                let _ = tx.send(Fetched::Failed(e));
            }
        });
    }
    drop(tx);
    let mut printed = 0u64;
    for msg in rx {
        match msg {
            Fetched::Records(partition, records) => {
                for r in &records {
                    if printed >= limit {
                        break;
                    }
                    write_record(out, args, partition, r)?;
                    printed += 1;
                }
                out.flush()?;
                if printed >= limit {
                    break;
                }
            }
            Fetched::Failed(e) => return Err(e),
        }
    }
    Ok(exit::OK)
}
