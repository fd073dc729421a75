//! `seglog consume`: read records of a topic (one partition, or all of them).
//!
//! Without `--follow` each partition is read from `--from` up to the end offset it
//! had when the command started, partitions in order. With `--follow` every
//! partition is read by its own thread over its own connection, long-polling for
//! new records, and lines appear as they arrive. Every record's CRC is checked by
//! the client before it is printed.
//!
//! Text output is bytes: the value and `--delimiter` (default `\n`, nothing under
//! `--raw`), optionally after the key (`--print-key`), or a kcat-style `--format`
//! template ([`RecordFormat`]). Where each partition starts is decided once, up front,
//! by [`plan_starts`].

use std::io::{self, Write};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::json;

use super::connect::{
    client_error, first_request_error, parse_positive_duration, BrokerArgs, LEADER_FOLLOWS_MAX,
    LEADER_PAUSE,
};
use super::consume_group::Assignor;
use super::escape::{parse_bytes, Bytes};
use super::format_string::RecordFormat;
use super::{exit, BytesAs, ExitError, Global};
use crate::engine::error::{counted, damaged_range};
use crate::engine::net::client::{Client, ClientError, Fetched as Fetch, Record};
use crate::format::wire::{parse_not_leader, ErrorCode, PartitionOffsets, FETCH_BYTES_MAX};

/// How long one long-poll fetch waits for new records under `--follow`.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// The connection each partition is read through. On a cluster that is its
/// leader's (as the first node's `cluster status` names it, then wherever a
/// NOT_LEADER refusal points, or, after a lost connection, as a node that answers
/// names it), so a topic whose partitions have different leaders is read whole and
/// a read goes on across a leader change; otherwise the one connection.
pub(super) struct Readers<'a> {
    broker: &'a BrokerArgs,
    topic: String,
    /// Whether a node named leaders of the topic's partitions or refused a read
    /// with NOT_LEADER (a cluster): only then is a lost connection followed to the
    /// next leader.
    cluster: bool,
    first: Client,
    /// Per partition, the client address of its leader, where known.
    leaders: std::collections::HashMap<u32, String>,
    /// Connections to nodes other than the first's, by address.
    others: std::collections::HashMap<String, Client>,
    /// Retries of a partition's read since its last success.
    follows: std::collections::HashMap<u32, u32>,
    /// Whether a lost connection to a standalone broker is made again (`--follow`
    /// goes on across a broker's restart, as a Kafka consumer does).
    reconnect: bool,
}

impl<'a> Readers<'a> {
    pub(super) fn new(broker: &'a BrokerArgs, topic: &str, mut first: Client) -> Readers<'a> {
        // With one address the leaders are learnt from NOT_LEADER refusals alone (a
        // standalone broker is not asked for a cluster status it does not have).
        let leaders = if broker.several() {
            super::connect::leader_addrs(&mut first, topic)
        } else {
            std::collections::HashMap::new()
        };
        Readers {
            broker,
            topic: topic.to_string(),
            cluster: !leaders.is_empty(),
            first,
            leaders,
            others: std::collections::HashMap::new(),
            follows: std::collections::HashMap::new(),
            reconnect: false,
        }
    }

    /// A lost connection is made again, within the retries of [`Readers::follow`],
    /// also to a standalone broker (`--follow`: a broker restarted meanwhile).
    pub(super) fn reconnecting(mut self) -> Readers<'a> {
        self.reconnect = true;
        self
    }

    /// The address `partition` is read from: its leader's, else the first node's.
    fn addr_of(&self, partition: u32) -> &str {
        self.leaders
            .get(&partition)
            .map_or_else(|| self.first.addr(), String::as_str)
    }

    /// The connection `partition` is read through, made on first use.
    fn client(&mut self, partition: u32) -> anyhow::Result<&mut Client> {
        let first = self.first.addr();
        let Some(addr) = self.leaders.get(&partition).filter(|a| a.as_str() != first) else {
            return Ok(&mut self.first);
        };
        match self.others.entry(addr.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(v) => {
                Ok(v.insert(self.broker.connect_to(addr)?))
            }
        }
    }

    /// One fetch of `partition` through its connection; a connection that cannot be
    /// made is a [`ClientError::Connect`], which [`Readers::follow`] handles.
    pub(super) fn fetch(
        &mut self,
        partition: u32,
        pos: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<Fetch, ClientError> {
        let topic = self.topic.clone();
        self.through(partition, |c| {
            c.fetch(&topic, partition, pos, max_bytes, wait)
        })
    }

    /// `call` on `partition`'s connection.
    fn through<T>(
        &mut self,
        partition: u32,
        call: impl FnOnce(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        match self.client(partition) {
            Ok(c) => call(c),
            Err(e) => Err(ClientError::Connect {
                addr: self.addr_of(partition).to_string(),
                source: io::Error::other(super::one_line(&e)),
            }),
        }
    }

    /// After `e` from `partition`'s connection: true when the read should be tried
    /// again (at most [`LEADER_FOLLOWS_MAX`] times in a row for a partition). The
    /// next read goes to the leader a NOT_LEADER refusal named or, on a cluster after
    /// a lost connection (a leader killed), to the leaders as a node that answers
    /// knows them then.
    pub(super) fn follow(&mut self, partition: u32, e: &ClientError) -> bool {
        let named = match e {
            ClientError::Refused {
                code: ErrorCode::NOT_LEADER,
                message,
                ..
            } => Some(parse_not_leader(message).map(|(_, addr)| addr)),
            e if e.is_lost_connection() && (self.cluster || self.reconnect) => None,
            _ => return false,
        };
        let follows = self.follows.entry(partition).or_insert(0);
        if *follows >= LEADER_FOLLOWS_MAX {
            return false;
        }
        *follows += 1;
        thread::sleep(LEADER_PAUSE);
        // A NOT_LEADER comes from a cluster node.
        self.cluster |= named.is_some();
        match named {
            Some(Some(addr)) => {
                self.leaders.insert(partition, addr);
            }
            // No leader named (the node's replica stopped, or an election is under
            // way): the next `--broker` address, which may know it.
            Some(None) => match self.broker.next_broker(self.addr_of(partition)) {
                Some(next) => {
                    self.cluster = true;
                    self.leaders.insert(partition, next);
                }
                None => {
                    self.leaders.remove(&partition);
                }
            },
            None => {
                let lost = self.addr_of(partition).to_string();
                if lost == self.first.addr() {
                    // A new first connection, to whichever node answers (the same
                    // node again if it is back).
                    if let Ok(c) = self.broker.connect() {
                        self.first = c;
                    }
                } else {
                    self.others.remove(&lost);
                }
                if self.cluster {
                    let known = super::connect::leader_addrs(&mut self.first, &self.topic);
                    if !known.is_empty() {
                        self.leaders = known;
                    }
                }
            }
        }
        true
    }

    /// A read of `partition` succeeded: its retry count starts again (a long
    /// `--follow` may see many elections).
    pub(super) fn served(&mut self, partition: u32) {
        self.follows.remove(&partition);
    }

    /// `o` as the partition's own connection reads it (on a cluster, its leader's
    /// offsets rather than the first node's), following a leader as a fetch does.
    pub(super) fn offsets(&mut self, o: PartitionOffsets) -> anyhow::Result<PartitionOffsets> {
        if !self.leaders.contains_key(&o.partition) {
            return Ok(o);
        }
        let topic = self.topic.clone();
        loop {
            match self.through(o.partition, |c| c.list_offsets(&topic)) {
                Ok(all) => {
                    self.served(o.partition);
                    return Ok(all
                        .into_iter()
                        .find(|x| x.partition == o.partition)
                        .unwrap_or(o));
                }
                Err(e) if self.follow(o.partition, &e) => {}
                Err(e) => return Err(client_error(e)),
            }
        }
    }
}

/// Arguments of `seglog consume`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Topic to read.
    pub topic: String,
    /// Read only this partition (default: all).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Where to start in each partition: earliest, latest, an offset, or -N for the
    /// last N offsets of each partition. Reading all partitions, one that ends before
    /// the offset is read from its own start (said on stderr); only when every
    /// partition ends before it is the offset refused.
    #[arg(long, default_value = "earliest", value_parser = parse_from, allow_negative_numbers = true)]
    pub from: StartAt,
    /// Start in each partition at its first record stamped at or after this time:
    /// RFC 3339 (2024-05-01T12:00:00Z, 2024-05-01T14:00:00.5+02:00) or milliseconds
    /// since the epoch. The protocol has no lookup by time, so the client
    /// binary-searches each partition with small fetches; this is exact when
    /// timestamps do not decrease along the log (as when the broker stamps them).
    #[arg(long, value_name = "TIME", value_parser = parse_time, conflicts_with = "from", allow_negative_numbers = true)]
    pub from_time: Option<i64>,
    /// Stop after this many records.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    pub count: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end of the log; a lost
    /// connection is made again (a broker restarting), for about 10 s at most.
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
    /// Print each record through this kcat-style template instead of the value and a
    /// newline: %s or %v value, %S or %V value length, %R value length as a 4-byte
    /// big-endian integer, %k key, %K key length (-1 without a key), %t topic,
    /// %p partition, %o offset, %T timestamp (ms since the epoch), %h headers (none in
    /// seglog: empty), %% a percent sign; escapes \n \r \t \0 \\ \xNN. Nothing is
    /// added after it: end it with \n for lines.
    #[arg(long, value_name = "STRING", value_parser = RecordFormat::parse, conflicts_with_all = ["json", "print_key", "raw", "delimiter"])]
    pub format: Option<RecordFormat>,
    /// Print each record's key (empty without one), --key-delimiter, then its value.
    #[arg(long, conflicts_with = "json")]
    pub print_key: bool,
    /// What --print-key puts between key and value (escapes as for --delimiter).
    #[arg(long, value_name = "BYTES", default_value = "\\t", value_parser = parse_bytes, requires = "print_key")]
    pub key_delimiter: Bytes,
    /// What follows each record's value (default \n; escapes \n \r \t \0 \\ \xNN).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, conflicts_with = "json")]
    pub delimiter: Option<Bytes>,
    /// Values exactly as stored, nothing added after them (unless --delimiter is given).
    #[arg(long, conflicts_with = "json")]
    pub raw: bool,
    /// Most record bytes per fetch request.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(1..=i64::from(FETCH_BYTES_MAX)))]
    pub max_bytes: u32,
    /// Read as a member of this consumer group: only the partitions the group assigns
    /// to this member, from the group's committed offsets (--from applies only where
    /// the group has none), following the log until Ctrl-C or --count.
    #[arg(long, value_name = "GROUP", conflicts_with_all = ["partition", "from_time", "follow"])]
    pub group: Option<String>,
    /// With --group: how often to commit what was read (also on a clean exit).
    #[arg(long, allow_hyphen_values = true, default_value = "5s", value_parser = parse_positive_duration, requires = "group")]
    pub commit_interval: Duration,
    /// With --group: how the group's leader splits partitions between members.
    #[arg(long, value_enum, default_value_t = Assignor::Range)]
    pub assignor: Assignor,
    /// With --group: how long the broker waits for this member's heartbeat before
    /// giving its partitions to others (within the broker's
    /// --group-min-session-timeout and --group-max-session-timeout).
    #[arg(long, allow_hyphen_values = true, default_value = "45s", value_parser = parse_session_timeout)]
    pub session_timeout: Duration,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// `--session-timeout`: longer than zero, and at most what a join request carries
/// (milliseconds in 32 bits, about 49 days); a longer one is refused, not cut down.
fn parse_session_timeout(text: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(text)?;
    if d.as_millis() > u128::from(u32::MAX) {
        return Err(format!(
            "{text:?} is over the limit of {} ms (about 49 days) for a session timeout",
            u32::MAX
        ));
    }
    Ok(d)
}

/// `--on-corrupt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnCorrupt {
    Stop,
    Skip,
}

/// A fetch refused because the records at `pos` are damaged or missing (a lost
/// segment): under `stop` the
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
            let what = if message.starts_with("missing records") {
                "missing records (their segment is lost)"
            } else {
                "damaged records"
            };
            eprintln!("seglog: {topic}/{partition}: skipped {range}: {what}");
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
    /// `-N`: the last N offsets of each partition.
    Last(u64),
}

fn parse_from(s: &str) -> Result<StartAt, String> {
    match s {
        "earliest" => Ok(StartAt::Earliest),
        "latest" => Ok(StartAt::Latest),
        n => match n.strip_prefix('-') {
            Some(last) => last.parse().map(StartAt::Last),
            None => n.parse().map(StartAt::Offset),
        }
        .map_err(|_| format!("{s:?} is not earliest, latest, an offset or -N (the last N)")),
    }
}

impl StartAt {
    fn start(self, start_offset: u64, end_offset: u64) -> u64 {
        match self {
            StartAt::Earliest => start_offset,
            StartAt::Latest => end_offset,
            StartAt::Offset(o) => o,
            StartAt::Last(n) => end_offset.saturating_sub(n).max(start_offset),
        }
    }
}

/// Writes one record as a line.
pub(super) fn write_record(
    out: &mut impl Write,
    args: &Args,
    partition: u32,
    r: &Record,
) -> io::Result<()> {
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
        write_text(out, args, partition, r)
    }
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    if let Some(group) = &args.group {
        return super::consume_group::run(&args, group, global);
    }
    let (client, offsets) = args
        .broker
        .connect_leader(&args.topic, args.partition.unwrap_or(0))?;
    let mut readers = Readers::new(&args.broker, &args.topic, client);
    let offsets = offsets.map_err(|e| first_request_error(e, "consume from"))?;
    let chosen: Vec<_> = match args.partition {
        Some(p) => match offsets.iter().find(|o| o.partition == p) {
            Some(o) => vec![*o],
            None => {
                return Err(ExitError::new(
                    exit::USAGE,
                    format!(
                        "topic {} has {}; there is no partition {p}",
                        args.topic,
                        counted(offsets.len() as u64, "partition", "partitions")
                    ),
                ))
            }
        },
        None => offsets,
    };
    let chosen = chosen
        .into_iter()
        .map(|o| readers.offsets(o))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let limit = args.count.unwrap_or(u64::MAX);
    if limit == 0 {
        return Ok(exit::OK);
    }
    let planned = plan_starts(&mut readers, &args, &chosen, global)?;
    if args.follow {
        return follow(
            &args,
            chosen
                .iter()
                .zip(&planned)
                .map(|(o, &pos)| (o.partition, pos))
                .collect(),
            limit,
            &mut out,
        );
    }
    let mut printed = 0u64;
    for (o, pos) in chosen.into_iter().zip(planned) {
        let mut pos = pos;
        if pos < o.start_offset || pos > o.end_offset {
            // Outside the log: the broker's refusal names the range (exit 69).
            readers
                .client(o.partition)?
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
            let fetched = readers.fetch(o.partition, pos, args.max_bytes, Duration::ZERO);
            match &fetched {
                Err(e) if readers.follow(o.partition, e) => continue,
                Err(e) => {
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
                Ok(_) => readers.served(o.partition),
            }
            let f = match moved_start(
                readers.client(o.partition)?,
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
                let (first, _) = broker.connect_leader(&topic, partition)?;
                let mut readers = Readers::new(&broker, &topic, first).reconnecting();
                loop {
                    let fetched = readers.fetch(partition, pos, max_bytes, FOLLOW_WAIT);
                    match &fetched {
                        Err(e) if readers.follow(partition, e) => continue,
                        Err(e) => {
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
                        Ok(_) => readers.served(partition),
                    }
                    let f = match moved_start(
                        readers.client(partition)?,
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

/// Writes one record in text form: `--format`, or [key, key delimiter,] value and the
/// record delimiter (`\n`; nothing under `--raw`).
fn write_text(out: &mut impl Write, args: &Args, partition: u32, r: &Record) -> io::Result<()> {
    if let Some(format) = &args.format {
        return format.write(out, &args.topic, partition, r);
    }
    if args.print_key {
        out.write_all(r.key.as_deref().unwrap_or_default())?;
        out.write_all(&args.key_delimiter.0)?;
    }
    out.write_all(&r.value)?;
    match &args.delimiter {
        Some(d) => out.write_all(&d.0),
        None if args.raw => Ok(()),
        None => out.write_all(b"\n"),
    }
}

/// The offset each chosen partition is read from (same order as `chosen`).
///
/// `--from-time` searches each partition ([`first_at_or_after`]). With an offset and
/// no `--partition`, a partition that ends before the offset is read from its own
/// start and stderr says so, so one short partition never stops the others; when
/// every partition ends before it, the offset is left as given and the broker's
/// refusal names the range.
fn plan_starts(
    readers: &mut Readers<'_>,
    args: &Args,
    chosen: &[PartitionOffsets],
    global: Global,
) -> anyhow::Result<Vec<u64>> {
    if let Some(t) = args.from_time {
        return chosen
            .iter()
            .map(|o| first_at_or_after(readers.client(o.partition)?, &args.topic, o, t))
            .collect();
    }
    let mut starts: Vec<u64> = chosen
        .iter()
        .map(|o| args.from.start(o.start_offset, o.end_offset))
        .collect();
    let StartAt::Offset(from) = args.from else {
        return Ok(starts);
    };
    let short = |o: &PartitionOffsets| from > o.end_offset;
    if args.partition.is_some() || chosen.iter().all(short) {
        return Ok(starts);
    }
    for (o, pos) in chosen.iter().zip(&mut starts) {
        if short(o) {
            *pos = o.start_offset;
            if !global.quiet {
                eprintln!(
                    "seglog: {}/{} ends at offset {}, before --from {from}: reading it from its start (offset {})",
                    args.topic, o.partition, o.end_offset, o.start_offset
                );
            }
        }
    }
    Ok(starts)
}

/// The first offset of partition `o` whose record is stamped at or after
/// `time_ms` (its end offset when none is), by binary search over offsets with
/// one-record fetches. Exact when timestamps do not decrease along the log; otherwise
/// some record at or after the time whose predecessor in the search is earlier.
pub(super) fn first_at_or_after(
    client: &mut Client,
    topic: &str,
    o: &PartitionOffsets,
    time_ms: i64,
) -> anyhow::Result<u64> {
    let (mut lo, mut hi) = (o.start_offset, o.end_offset);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        // max_bytes 1 still returns one whole record when there is one.
        let f = client
            .fetch(topic, o.partition, mid, 1, Duration::ZERO)
            .map_err(client_error)?;
        match f.records.first() {
            Some(r) if r.offset < hi && r.timestamp_ms < time_ms => lo = r.offset + 1,
            _ => hi = mid,
        }
    }
    Ok(lo)
}

/// `--count`: a number of records, refusing negative ones with a hint.
fn parse_count(s: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: --count takes a number of records (for the last N records use --from -N)"
        ));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not a number of records"))
}

/// `--from-time`: RFC 3339 or milliseconds since the epoch.
pub(super) fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    rfc3339_ms(s).ok_or_else(|| {
        format!("{s:?} is neither an RFC 3339 time (2024-05-01T12:00:00Z) nor milliseconds since the epoch")
    })
}

/// Milliseconds since the epoch of an RFC 3339 date-time
/// (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`); `None` when malformed.
fn rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let d = b.get(from..from + len)?;
        if !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    let sep = |at: usize, allowed: &[u8]| b.get(at).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if sep(i, b".") {
        i += 1;
        let digits = b
            .get(i..)?
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        let frac = std::str::from_utf8(b.get(i..i + digits.min(3))?).ok()?;
        millis = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        i += digits;
    }
    let offset_min = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let total = h * 60 + m;
            if *sign == b'-' {
                -total
            } else {
                total
            }
        }
        _ => return None,
    };
    // Days from 1970-01-01 of the proleptic Gregorian date (H. Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    Some(seconds * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_values() {
        assert_eq!(parse_from("earliest"), Ok(StartAt::Earliest));
        assert_eq!(parse_from("latest"), Ok(StartAt::Latest));
        assert_eq!(parse_from("7"), Ok(StartAt::Offset(7)));
        assert_eq!(parse_from("-10"), Ok(StartAt::Last(10)));
        assert!(parse_from("-x").is_err());
        assert_eq!(StartAt::Last(10).start(5, 12), 5);
        assert_eq!(StartAt::Last(3).start(5, 12), 9);
        assert_eq!(StartAt::Last(0).start(5, 12), 12);
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("3"), Ok(3));
        assert!(parse_count("-1").unwrap_err().contains("--from -N"));
        assert!(parse_count("x").is_err());
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("0"), Ok(0));
        assert_eq!(parse_time("1700000000123"), Ok(1_700_000_000_123));
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
        assert_eq!(
            parse_time("2023-11-14T22:13:20.123Z"),
            Ok(1_700_000_000_123)
        );
        assert_eq!(parse_time("2023-11-14T22:13:20.5Z"), Ok(1_700_000_000_500));
        assert_eq!(
            parse_time("2023-11-15T00:13:20+02:00"),
            Ok(1_700_000_000_000)
        );
        assert_eq!(
            parse_time("2023-11-14T21:13:20.1234-01:00"),
            Ok(1_700_000_000_123)
        );
        assert_eq!(parse_time("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        for bad in [
            "",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-13-01T00:00:00Z",
            "2023-11-14T22:13:20.Z",
            "yesterday",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
