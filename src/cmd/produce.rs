//! `seglog produce`: send records to a topic, one per stdin record (or `--value`,
//! `--value-file`).
//!
//! Stdin is split at `--delimiter` (default `\n`; `-0` for NUL) and every other byte
//! is kept: values and keys are bytes, never text. `--value-file`/`--key-file` send a
//! file's whole content as one value or key.
//!
//! Partition choice: `--partition` if given; else a keyed record goes to
//! CRC-32(key) mod partitions ([`partition_for_key`]); keyless records go
//! round-robin from partition 0. Lines are batched: a request carries up to
//! `--batch` records, and is sent as soon as no further line is waiting, so an
//! interactive producer is never held back. Exit 0 only when every record was
//! acknowledged. `--json` acks carry `seq`, the record's 0-based position in the
//! input, besides the contract's `type`, `partition` and `offset`.

use std::ffi::OsString;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::json;

use super::connect::{
    client_error, first_request_error, parse_duration, refusal_exit, BrokerArgs,
    LEADER_FOLLOWS_MAX, LEADER_PAUSE,
};
use super::escape::{parse_bytes, Bytes};
use super::{exit, ExitError, Global};
use crate::engine::error::counted;
use crate::engine::net::client::{partition_for_key, Ack, Client, ClientError};
use crate::format::wire::{
    parse_not_leader, ErrorCode, PartitionBatch, WireRecord, GROUPS_VERSION,
    RECORDS_PER_PARTITION_MAX,
};

/// Arguments of `seglog produce`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Topic to write to.
    pub topic: String,
    /// Send every record to this partition.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Key of every record (its bytes exactly as given).
    #[arg(long, conflicts_with_all = ["key_separator", "key_file"])]
    pub key: Option<OsString>,
    /// Key of every record: the whole content of this file.
    #[arg(long, value_name = "PATH", conflicts_with = "key_separator")]
    pub key_file: Option<PathBuf>,
    /// Each stdin record is KEY<SEP>VALUE, split at the first SEP.
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// Send this one value instead of reading stdin, every byte as given (an argument
    /// cannot hold a NUL byte: use --value-file or -0 for those).
    #[arg(long, conflicts_with = "value_file")]
    pub value: Option<OsString>,
    /// Send one record whose value is the whole content of this file ("-": all of stdin).
    #[arg(long, value_name = "PATH", conflicts_with = "key_separator")]
    pub value_file: Option<PathBuf>,
    /// What separates records on stdin; escapes \n \r \t \0 \\ \xNN are understood.
    #[arg(long, value_name = "BYTES", default_value = "\\n", value_parser = parse_bytes, conflicts_with = "null")]
    pub delimiter: Bytes,
    /// Records on stdin are separated by NUL bytes (as from `find -print0`); the same
    /// as --delimiter '\0'.
    #[arg(short = '0', long)]
    pub null: bool,
    /// Remove one \r at the end of each stdin record (CRLF line ends with the default
    /// \n delimiter).
    #[arg(long)]
    pub strip_cr: bool,
    /// Most records per request.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(RECORDS_PER_PARTITION_MAX)))]
    pub batch: u32,
    /// Print {"type": "ack", "partition", "offset"} per record.
    #[arg(long)]
    pub json: bool,
    /// Idempotent production (the default): the broker hands out a producer id, each
    /// batch carries a sequence number, and a batch sent again after a lost
    /// connection or a timeout is written once (its retry gets the original offsets).
    #[arg(long, overrides_with = "no_idempotent")]
    pub idempotent: bool,
    /// Plain produce requests, without retries (a broker older than protocol version
    /// 3 is also served this way).
    #[arg(long)]
    pub no_idempotent: bool,
    /// With idempotence: how many times a request is sent again after a lost
    /// connection, a timeout or a broker busy with the same producer's batch.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
    /// Wait before the first retry; doubled for each next one.
    #[arg(long, allow_hyphen_values = true, default_value = "100ms", value_parser = parse_duration)]
    pub retry_backoff: Duration,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

impl Args {
    /// The record separator on stdin.
    fn separator(&self) -> Vec<u8> {
        if self.null {
            vec![0]
        } else {
            self.delimiter.0.clone()
        }
    }
}

/// One record to send.
struct Pending {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
}

/// Chooses partitions in the documented way.
struct Partitioner {
    fixed: Option<u32>,
    count: u32,
    next: u32,
}

impl Partitioner {
    fn pick(&mut self, key: Option<&[u8]>) -> u32 {
        if let Some(p) = self.fixed {
            return p;
        }
        if let Some(k) = key {
            return partition_for_key(k, self.count);
        }
        let p = self.next % self.count.max(1);
        self.next = self.next.wrapping_add(1);
        p
    }
}

/// Sends `records` as one request and writes an ack line per record (input order;
/// `seq` counts records from 0 across the whole input, starting at `first_seq` here).
/// Returns the number acknowledged, or the error after printing the acks it got.
fn send(
    session: &mut Session<'_>,
    topic: &str,
    first_seq: u64,
    records: &[Pending],
    partitioner: &mut Partitioner,
    json_out: bool,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let targets: Vec<u32> = records
        .iter()
        .map(|r| partitioner.pick(r.key.as_deref()))
        .collect();
    let mut batches: Vec<PartitionBatch<'_>> = Vec::new();
    // (batch index, index within the batch) of each record.
    let mut place = Vec::with_capacity(records.len());
    for (r, &p) in records.iter().zip(&targets) {
        let b = match batches.iter().position(|b| b.partition == p) {
            Some(b) => b,
            None => {
                batches.push(PartitionBatch {
                    partition: p,
                    records: Vec::new(),
                });
                batches.len() - 1
            }
        };
        let slot = batches.get_mut(b).map_or(0, |batch| {
            batch.records.push(WireRecord {
                timestamp_ms: -1,
                key: r.key.as_deref(),
                value: &r.value,
            });
            batch.records.len() - 1
        });
        place.push((b, slot as u64));
    }
    let sizes: Vec<u64> = batches.iter().map(|b| b.records.len() as u64).collect();
    let acks = session.produce(topic, batches).map_err(|e| {
        let e = super::schemas::produce_refusal(e, topic, &targets, first_seq);
        acked_before(e, first_seq)
    })?;
    for (ack, &n) in acks.iter().zip(&sizes) {
        if let Ok((base, last)) = ack.result {
            if last.checked_sub(base).map(|d| d + 1) != Some(n) {
                return Err(ExitError::new(
                    exit::UNAVAILABLE,
                    format!(
                        "the broker at {} acknowledged {} of partition {} as offsets {base}..={last}",
                        session.addr_of(ack.partition),
                        counted(n, "record", "records"),
                        ack.partition
                    ),
                ));
            }
        }
    }
    let mut acked = 0;
    for (seq, &(b, slot)) in (first_seq..).zip(&place) {
        if let Some(Ok((base, _))) = acks.get(b).map(|a| &a.result) {
            acked += 1;
            if json_out {
                let partition = acks.get(b).map_or(0, |a| a.partition);
                let line = json!({ "type": "ack", "partition": partition, "offset": base + slot, "seq": seq });
                writeln!(out, "{line}")?;
            }
        }
    }
    out.flush()?;
    if let Some((failed, Err((code, message)))) = acks
        .iter()
        .map(|a| (a, &a.result))
        .find(|(_, r)| r.is_err())
    {
        let lost: u64 = acks
            .iter()
            .zip(&sizes)
            .filter(|(a, _)| a.result.is_err())
            .map(|(_, n)| n)
            .sum();
        return Err(acked_before(
            ExitError::new(
                refusal_exit(*code),
                format!(
                    "the broker at {} refused {lost} record{} for {topic}/{}: {message} [{code}]",
                    session.addr_of(failed.partition),
                    if lost == 1 { "" } else { "s" },
                    failed.partition
                ),
            ),
            first_seq + acked,
        ));
    }
    Ok(acked)
}

/// `e` with how many records were acknowledged before it, keeping its exit code.
fn acked_before(e: anyhow::Error, acked: u64) -> anyhow::Error {
    let code = e.downcast_ref::<ExitError>().map_or(exit::IO, |x| x.code);
    ExitError::new(
        code,
        format!(
            "{}; {acked} record{} acknowledged before it",
            super::one_line(&e),
            if acked == 1 { " was" } else { "s were" }
        ),
    )
}

/// A line from stdin, or the read error that ended it.
enum Line {
    Bytes(Vec<u8>),
    Failed(io::Error),
}

/// Reads stdin on its own thread so the sender can batch whatever is waiting; records
/// are split at `delimiter` (which is removed, as is one final `\r` with `strip_cr`).
fn spawn_reader(depth: usize, delimiter: Vec<u8>, strip_cr: bool) -> mpsc::Receiver<Line> {
    let (tx, rx) = mpsc::sync_channel(depth);
    thread::spawn(move || {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        loop {
            match read_record(&mut input, &delimiter) {
                Ok(None) => return,
                Ok(Some(mut record)) => {
                    if strip_cr && record.last() == Some(&b'\r') {
                        record.pop();
                    }
                    if tx.send(Line::Bytes(record)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Line::Failed(e));
                    return;
                }
            }
        }
    });
    rx
}

/// The next record of `input` up to (and without) `delimiter`, which may be several
/// bytes long; the last record needs no delimiter after it. `None` at the end.
fn read_record(input: &mut impl BufRead, delimiter: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let Some(&last) = delimiter.last() else {
        // An empty delimiter: the whole input is one record.
        let mut all = Vec::new();
        input.read_to_end(&mut all)?;
        return Ok((!all.is_empty()).then_some(all));
    };
    let mut record = Vec::new();
    loop {
        if input.read_until(last, &mut record)? == 0 {
            return Ok((!record.is_empty()).then_some(record));
        }
        if record.ends_with(delimiter) {
            record.truncate(record.len() - delimiter.len());
            return Ok(Some(record));
        }
    }
}

/// The whole content of `path` (`-`: stdin).
fn read_file(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context as _;
    if path == Path::new("-") {
        let mut all = Vec::new();
        io::stdin()
            .lock()
            .read_to_end(&mut all)
            .with_context(|| format!("reading the {what} from stdin"))?;
        return Ok(all);
    }
    std::fs::read(path).with_context(|| format!("reading the {what} file {}", path.display()))
}

/// Splits `line` at the first `sep`.
fn split_key(line: &[u8], sep: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if sep.is_empty() {
        return None;
    }
    let at = line.windows(sep.len()).position(|w| w == sep)?;
    Some((
        line.get(..at)?.to_vec(),
        line.get(at + sep.len()..)?.to_vec(),
    ))
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    if args.key_separator.as_deref() == Some("") {
        return Err(ExitError::usage("--key-separator must not be empty"));
    }
    if args.delimiter.0.is_empty() {
        return Err(ExitError::usage(
            "--delimiter must not be empty (use --value-file - to send all of stdin as one record)",
        ));
    }
    let (client, offsets) = args
        .broker
        .connect_leader(&args.topic, args.partition.unwrap_or(0))?;
    let partitions = offsets
        .map_err(|e| first_request_error(e, "produce to"))?
        .len() as u32;
    if let Some(p) = args.partition.filter(|&p| p >= partitions) {
        return Err(ExitError::new(
            exit::USAGE,
            format!(
                "topic {} has {}; there is no partition {p}",
                args.topic,
                counted(partitions, "partition", "partitions")
            ),
        ));
    }
    let mut session = Session::new(client, &args)?;
    let mut partitioner = Partitioner {
        fixed: args.partition,
        count: partitions,
        next: 0,
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let key = match (&args.key, &args.key_file) {
        (Some(k), _) => Some(k.as_bytes().to_vec()),
        (None, Some(path)) => Some(read_file(path, "key")?),
        (None, None) => None,
    };

    let single = match (&args.value, &args.value_file) {
        (Some(v), _) => Some(v.as_bytes().to_vec()),
        (None, Some(path)) => Some(read_file(path, "value")?),
        (None, None) => None,
    };
    if let Some(value) = single {
        let one = [Pending { key, value }];
        let total = send(
            &mut session,
            &args.topic,
            0,
            &one,
            &mut partitioner,
            args.json,
            &mut out,
        )?;
        out.flush()?;
        report_total(&global, &args, total, &session);
        return Ok(exit::OK);
    }

    let batch = args.batch as usize;
    let rx = spawn_reader(
        batch.saturating_mul(2).max(1024),
        args.separator(),
        args.strip_cr,
    );
    let sep = args.key_separator.as_ref().map(|s| s.as_bytes().to_vec());
    let mut line_no: u64 = 0;
    let mut total: u64 = 0;
    let mut pending: Vec<Pending> = Vec::with_capacity(batch);
    let mut done = false;
    while !done {
        // Block for the first line, then take whatever else is already waiting.
        let mut next = rx.recv().ok();
        while let Some(line) = next {
            let bytes = match line {
                Line::Bytes(b) => b,
                Line::Failed(e) => return Err(anyhow::Error::new(e).context("reading stdin")),
            };
            line_no += 1;
            let record = match &sep {
                Some(sep) => match split_key(&bytes, sep) {
                    Some((k, v)) => Pending {
                        key: Some(k),
                        value: v,
                    },
                    None => {
                        if !pending.is_empty() {
                            total += send(
                                &mut session,
                                &args.topic,
                                total,
                                &pending,
                                &mut partitioner,
                                args.json,
                                &mut out,
                            )?;
                        }
                        return Err(ExitError::usage(format!(
                            "stdin {} {line_no} has no key separator {:?} ({total} earlier records were sent)",
                            if args.separator() == b"\n" { "line" } else { "record" },
                            args.key_separator.as_deref().unwrap_or_default()
                        )));
                    }
                },
                None => Pending {
                    key: key.clone(),
                    value: bytes,
                },
            };
            pending.push(record);
            if pending.len() >= batch {
                break;
            }
            next = match rx.try_recv() {
                Ok(l) => Some(l),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => {
                    done = true;
                    None
                }
            };
        }
        if pending.is_empty() {
            break;
        }
        total += send(
            &mut session,
            &args.topic,
            total,
            &pending,
            &mut partitioner,
            args.json,
            &mut out,
        )?;
        pending.clear();
    }
    out.flush()?;
    report_total(&global, &args, total, &session);
    Ok(exit::OK)
}

/// The closing line on stderr: how many records which broker acknowledged.
fn report_total(global: &Global, args: &Args, total: u64, session: &Session) {
    if !global.quiet && !args.json {
        eprintln!(
            "seglog: {total} record{} acknowledged by {}",
            if total == 1 { "" } else { "s" },
            session.answered_by()
        );
    }
}

/// Longest wait between two retries (the backoff doubles up to it).
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// An idempotent producer's identity and next sequence per partition.
struct Idempotence {
    producer_id: u64,
    epoch: u16,
    next_sequence: std::collections::HashMap<u32, i32>,
}

/// The connections produce requests go through, plain or idempotent with retries
/// (reconnecting after a lost connection; a retried batch keeps its sequence, so the
/// broker writes it once). On a cluster each partition's batch goes to the node
/// that leads it: the first connection until a NOT_LEADER names another node, then
/// a connection to that node, so a request spanning partitions led by different
/// nodes is split among them, and a refused batch is resent alone.
struct Session<'a> {
    /// The first connection (the bootstrap broker).
    client: Client,
    /// Connections to other nodes, by address.
    others: std::collections::HashMap<String, Client>,
    /// Per partition, the address of its leader as a NOT_LEADER named it.
    leaders: std::collections::HashMap<u32, String>,
    /// Per partition, the address of the node that answered its last batch.
    answered: std::collections::HashMap<u32, String>,
    broker: &'a BrokerArgs,
    idempotence: Option<Idempotence>,
    retries: u32,
    backoff: Duration,
}

impl<'a> Session<'a> {
    fn new(mut client: Client, args: &'a Args) -> anyhow::Result<Session<'a>> {
        let idempotence = if args.no_idempotent || client.version() < GROUPS_VERSION {
            None
        } else {
            let (producer_id, epoch) = client.init_producer(None).map_err(client_error)?;
            Some(Idempotence {
                producer_id,
                epoch,
                next_sequence: std::collections::HashMap::new(),
            })
        };
        Ok(Session {
            client,
            others: std::collections::HashMap::new(),
            leaders: std::collections::HashMap::new(),
            answered: std::collections::HashMap::new(),
            broker: &args.broker,
            idempotence,
            retries: args.retries,
            backoff: args.retry_backoff,
        })
    }

    /// The address of the node that answered `partition`'s last batch.
    fn addr_of(&self, partition: u32) -> &str {
        self.answered
            .get(&partition)
            .map_or_else(|| self.client.addr(), String::as_str)
    }

    /// Every node that answered a batch, in address order.
    fn answered_by(&self) -> String {
        let mut addrs: Vec<&str> = self.answered.values().map(String::as_str).collect();
        if addrs.is_empty() {
            addrs.push(self.client.addr());
        }
        addrs.sort_unstable();
        addrs.dedup();
        addrs.join(", ")
    }

    /// Sends `batches`, each to its partition's leader, following NOT_LEADER; one ack
    /// per batch, in their order.
    fn produce(
        &mut self,
        topic: &str,
        batches: Vec<PartitionBatch<'_>>,
    ) -> Result<Vec<Ack>, ClientError> {
        let mut acks: Vec<Option<Ack>> = batches.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..batches.len()).collect();
        let mut follows = 0;
        loop {
            // The batches of this round by destination (`None`: the first connection).
            let mut by_node: std::collections::BTreeMap<Option<String>, Vec<usize>> =
                std::collections::BTreeMap::new();
            for &i in &todo {
                let to = batches
                    .get(i)
                    .and_then(|b| self.leaders.get(&b.partition))
                    .filter(|a| a.as_str() != self.client.addr())
                    .cloned();
                by_node.entry(to).or_default().push(i);
            }
            let mut again = Vec::new();
            for (to, indices) in by_node {
                let part: Vec<PartitionBatch<'_>> = indices
                    .iter()
                    .filter_map(|&i| batches.get(i).cloned())
                    .collect();
                let (addr, got) = match self.produce_on(to.as_deref(), topic, part) {
                    Ok(answer) => answer,
                    // The node named is gone: its partitions go back to the first
                    // connection, whose node names the leader it knows.
                    Err(_) if to.is_some() && follows < LEADER_FOLLOWS_MAX => {
                        for &i in &indices {
                            if let Some(b) = batches.get(i) {
                                self.leaders.remove(&b.partition);
                            }
                        }
                        again.extend(indices);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                for (&i, ack) in indices.iter().zip(got) {
                    self.answered.insert(ack.partition, addr.clone());
                    if let Err((ErrorCode::NOT_LEADER, message)) = &ack.result {
                        // A replicated partition's follower names its leader: resend
                        // there (the sequences make a batch that did commit a
                        // duplicate, written once). A node that names none (its
                        // replica stopped, or an election is under way) sends the
                        // batch to the next `--broker` address, which may know the
                        // leader: asking it again would only hear the same.
                        match parse_not_leader(message) {
                            Some((_, leader)) if leader != addr => {
                                self.leaders.insert(ack.partition, leader);
                            }
                            _ => match self.broker.next_broker(&addr) {
                                Some(next) => {
                                    self.leaders.insert(ack.partition, next);
                                }
                                None => {
                                    self.leaders.remove(&ack.partition);
                                }
                            },
                        }
                        again.push(i);
                    }
                    if let Some(slot) = acks.get_mut(i) {
                        *slot = Some(ack);
                    }
                }
            }
            if again.is_empty() || follows >= LEADER_FOLLOWS_MAX {
                break;
            }
            follows += 1;
            thread::sleep(LEADER_PAUSE);
            again.sort_unstable();
            todo = again;
        }
        // Every batch was answered: a round ends each batch with an ack, or fails.
        let answered = acks.len();
        acks.into_iter()
            .collect::<Option<Vec<Ack>>>()
            .ok_or_else(|| ClientError::Protocol {
                addr: self.client.addr().to_string(),
                detail: format!("no answer for some of {answered} partition batches"),
            })
    }

    /// Sends `batches` to the node at `to` (`None`: the first connection), with the
    /// idempotent producer's retries; the address that answered, and its acks.
    fn produce_on(
        &mut self,
        to: Option<&str>,
        topic: &str,
        batches: Vec<PartitionBatch<'_>>,
    ) -> Result<(String, Vec<Ack>), ClientError> {
        let Some(idem) = &self.idempotence else {
            let client = self.connection(to)?;
            let addr = client.addr().to_string();
            return client.produce(topic, batches).map(|acks| (addr, acks));
        };
        let (producer_id, epoch) = (idem.producer_id, idem.epoch);
        let with_seq: Vec<(i32, PartitionBatch<'_>)> = batches
            .into_iter()
            .map(|b| {
                (
                    idem.next_sequence.get(&b.partition).copied().unwrap_or(0),
                    b,
                )
            })
            .collect();
        let mut attempt = 0;
        let mut pause = self.backoff;
        // Why the last reconnect of the first connection failed: the next attempt's
        // error (the old connection is broken and would only say so).
        let mut reconnect_failed: Option<ClientError> = None;
        loop {
            let (addr, result) = match reconnect_failed.take() {
                Some(e) => (self.client.addr().to_string(), Err(e)),
                None => match self.connection(to) {
                    Ok(client) => (
                        client.addr().to_string(),
                        client.produce_idempotent(topic, producer_id, epoch, with_seq.clone()),
                    ),
                    Err(e) => (to.unwrap_or_default().to_string(), Err(e)),
                },
            };
            let retry = match &result {
                Ok(acks) => acks
                    .iter()
                    .any(|a| matches!(&a.result, Err((c, _)) if *c == ErrorCode::PRODUCER_BUSY)),
                Err(ClientError::Refused { code, .. }) => *code == ErrorCode::SHUTTING_DOWN,
                Err(_) => true,
            };
            if !retry || attempt >= self.retries {
                if let (Ok(acks), Some(idem)) = (&result, self.idempotence.as_mut()) {
                    for ((seq, b), a) in with_seq.iter().zip(acks) {
                        if a.result.is_ok() {
                            let n = b.records.len() as i32;
                            idem.next_sequence
                                .insert(b.partition, seq.saturating_add(n));
                        }
                    }
                }
                return result.map(|acks| (addr, acks));
            }
            attempt += 1;
            thread::sleep(pause);
            pause = pause.saturating_mul(2).min(RETRY_BACKOFF_MAX);
            if result.is_err() {
                // The connection may be gone: a new one (the producer id stays).
                match to {
                    Some(a) if a != self.client.addr() => {
                        self.others.remove(a);
                    }
                    _ => match self.broker.try_connect() {
                        Ok(Ok(c)) => self.client = c,
                        Ok(Err(e)) => reconnect_failed = Some(e),
                        Err(e) => {
                            reconnect_failed = Some(ClientError::Connect {
                                addr: self.client.addr().to_string(),
                                source: io::Error::other(super::one_line(&e)),
                            });
                        }
                    },
                }
            }
        }
    }

    /// The connection to `to` (`None` or the first connection's address: that one),
    /// made on first use.
    fn connection(&mut self, to: Option<&str>) -> Result<&mut Client, ClientError> {
        let Some(addr) = to.filter(|a| *a != self.client.addr()) else {
            return Ok(&mut self.client);
        };
        match self.others.entry(addr.to_string()) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(v) => {
                let c = self
                    .broker
                    .connect_to(addr)
                    .map_err(|e| ClientError::Connect {
                        addr: addr.to_string(),
                        source: io::Error::other(super::one_line(&e)),
                    })?;
                Ok(v.insert(c))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioner_rules() {
        let mut p = Partitioner {
            fixed: None,
            count: 3,
            next: 0,
        };
        let picks: Vec<u32> = (0..5).map(|_| p.pick(None)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1]);
        assert_eq!(
            p.pick(Some(b"123456789")),
            partition_for_key(b"123456789", 3)
        );
        let mut fixed = Partitioner {
            fixed: Some(2),
            count: 3,
            next: 0,
        };
        assert_eq!(fixed.pick(Some(b"x")), 2);
        assert_eq!(fixed.pick(None), 2);
    }

    #[test]
    fn key_separator() {
        assert_eq!(
            split_key(b"k:v:w", b":"),
            Some((b"k".to_vec(), b"v:w".to_vec()))
        );
        assert_eq!(
            split_key(b"key=>value", b"=>"),
            Some((b"key".to_vec(), b"value".to_vec()))
        );
        assert_eq!(split_key(b":v", b":"), Some((b"".to_vec(), b"v".to_vec())));
        assert_eq!(split_key(b"novalue", b":"), None);
    }

    fn records(input: &[u8], delimiter: &[u8]) -> Vec<Vec<u8>> {
        let mut r = io::Cursor::new(input.to_vec());
        std::iter::from_fn(|| read_record(&mut r, delimiter).unwrap()).collect()
    }

    #[test]
    fn delimiters() {
        assert_eq!(records(b"a\nb\n", b"\n"), [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(
            records(b"a\n\nb", b"\n"),
            [b"a".to_vec(), vec![], b"b".to_vec()]
        );
        assert_eq!(records(b"", b"\n"), Vec::<Vec<u8>>::new());
        assert_eq!(
            records(b"a\r\nb\nc\r\n", b"\r\n"),
            [b"a".to_vec(), b"b\nc".to_vec()]
        );
        assert_eq!(
            records(b"x\ny\0\xff\0", b"\0"),
            [b"x\ny".to_vec(), vec![0xff]]
        );
        // A delimiter whose last byte also appears alone inside records.
        assert_eq!(
            records(b"1;2;;3;;", b";;"),
            [b"1;2".to_vec(), b"3".to_vec()]
        );
    }
}
