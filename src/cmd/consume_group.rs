//! `seglog consume --group G`: read a topic as one member of a consumer group, on
//! Kafka's classic model.
//!
//! The member joins (the broker assigns its id), and the leader computes the
//! assignment with `--assignor` (range or roundrobin) over the members' subscriptions
//! and hands it in through sync. Each member reads only its partitions, from the
//! group's committed offset, or from `--from` where the group has none (Kafka's
//! `auto.offset.reset`). It heartbeats every 3 s (Kafka's default), or every third
//! of its session timeout when that is shorter; when the broker answers that a rebalance is in progress it commits what it read and
//! rejoins. Offsets are committed every `--commit-interval` and on a clean exit
//! (Ctrl-C, SIGTERM, `--count` reached), after which it leaves the group. A commit
//! stores the next offset to read. The member follows the log (like `--follow`)
//! until it stops.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::connect::client_error;
use super::consume::Readers;
use super::consume::{write_record, Args, StartAt};
use super::{exit, ExitError, Global};
use crate::engine::net::client::{Client, ClientError};
use crate::engine::net::cluster_client::ClusterClient;
use crate::format::wire::groups::{decode_topic_partitions, encode_topic_partitions};
use crate::format::wire::ErrorCode;
use crate::format::wire::PartitionOffsets;

/// The protocol type of seglog's consumers (Kafka's).
pub const PROTOCOL_TYPE: &str = "consumer";
/// How long one fetch waits for records while the member has nothing to read.
const FETCH_WAIT: Duration = Duration::from_millis(200);

/// How the leader splits partitions between members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Assignor {
    /// Consecutive runs of partitions; the first members get one more.
    Range,
    /// Partitions dealt to members in turn.
    Roundrobin,
}

impl Assignor {
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Range => "range",
            Assignor::Roundrobin => "roundrobin",
        }
    }
}

/// Splits partitions `0..partitions` between `members` (sorted by id, as Kafka's
/// assignors do).
pub fn assign(
    assignor: Assignor,
    members: &[String],
    partitions: u32,
) -> BTreeMap<String, Vec<u32>> {
    let mut sorted: Vec<&String> = members.iter().collect();
    sorted.sort();
    let mut out: BTreeMap<String, Vec<u32>> =
        sorted.iter().map(|m| ((*m).clone(), Vec::new())).collect();
    let n = sorted.len() as u32;
    if n == 0 {
        return out;
    }
    match assignor {
        Assignor::Range => {
            let (each, extra) = (partitions / n, partitions % n);
            let mut next = 0;
            for (i, m) in sorted.iter().enumerate() {
                let take = each + u32::from((i as u32) < extra);
                if let Some(v) = out.get_mut(*m) {
                    v.extend(next..next + take);
                }
                next += take;
            }
        }
        Assignor::Roundrobin => {
            for p in 0..partitions {
                if let Some(v) = out.get_mut(sorted[(p % n) as usize]) {
                    v.push(p);
                }
            }
        }
    }
    out
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

#[expect(unsafe_code, reason = "installing a signal handler through libc")]
fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only stores to a static atomic, which is
        // async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

/// This member's place in the group.
struct Membership {
    member_id: String,
    generation: i32,
    /// Assigned partition → next offset to read.
    positions: BTreeMap<u32, u64>,
    /// Partition → offset last committed.
    committed: BTreeMap<u32, u64>,
}

/// What ended a read round.
enum Next {
    Continue,
    Rejoin,
    /// The member is no longer known: join afresh.
    Reset,
}

fn is_code(e: &ClientError, codes: &[ErrorCode]) -> bool {
    e.code().is_some_and(|c| codes.contains(&c))
}

pub fn run(args: &Args, group: &str, global: Global) -> anyhow::Result<u8> {
    install_signal_handlers();
    // Group requests go to the group coordinator (in a cluster, the node leading the
    // offsets topic, followed when it changes); each partition is read from its
    // leader.
    let mut client = Coordinator(args.broker.cluster()?);
    let mut readers = Readers::new(&args.broker, &args.topic, args.broker.connect()?);
    let limit = args.count.unwrap_or(u64::MAX);
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    let mut m = Membership {
        member_id: String::new(),
        generation: -1,
        positions: BTreeMap::new(),
        committed: BTreeMap::new(),
    };
    let heartbeat_every = heartbeat_interval(args.session_timeout);
    'member: while !STOP.load(Ordering::SeqCst) && printed < limit {
        join(&mut client, &mut readers, args, group, &mut m, global.quiet)?;
        let mut last_heartbeat = Instant::now();
        let mut last_commit = Instant::now();
        loop {
            if STOP.load(Ordering::SeqCst) || printed >= limit {
                break 'member;
            }
            let mut got_any = false;
            let parts: Vec<(u32, u64)> = m.positions.iter().map(|(p, o)| (*p, *o)).collect();
            let wait = if parts.len() > 1 {
                Duration::ZERO
            } else {
                FETCH_WAIT
            };
            for (p, pos) in parts {
                let f = match readers.fetch(p, pos, args.max_bytes, wait) {
                    Ok(f) => {
                        readers.served(p);
                        f
                    }
                    // A NOT_LEADER or a lost leader: read it again next round.
                    Err(e) if readers.follow(p, &e) => continue,
                    Err(e) if is_code(&e, &[ErrorCode::OFFSET_OUT_OF_RANGE]) => {
                        // The committed position left the log (retention): restart
                        // from --from, as Kafka's auto.offset.reset does.
                        let offsets = client.list_offsets(&args.topic).map_err(client_error)?;
                        if let Some(o) = offsets.iter().find(|o| o.partition == p) {
                            let o = readers.offsets(*o)?;
                            m.positions
                                .insert(p, args.from.start_at(o.start_offset, o.end_offset));
                        }
                        continue;
                    }
                    Err(e) => return Err(client_error(e)),
                };
                for r in &f.records {
                    if printed >= limit {
                        break;
                    }
                    write_record(&mut out, args, p, r)?;
                    printed += 1;
                    m.positions.insert(p, r.offset + 1);
                    got_any = true;
                }
                if printed >= limit {
                    break;
                }
            }
            out.flush()?;
            if !got_any && m.positions.len() != 1 {
                std::thread::sleep(if m.positions.is_empty() {
                    heartbeat_every.min(FETCH_WAIT)
                } else {
                    Duration::from_millis(50)
                });
            }
            if last_commit.elapsed() >= args.commit_interval {
                match commit(&mut client, &args.topic, group, &mut m) {
                    Ok(()) => {}
                    Err(e) => match classify(&e) {
                        Some(next) => {
                            if matches!(next, Next::Reset) {
                                m.member_id.clear();
                            }
                            continue 'member;
                        }
                        None => return Err(client_error(e)),
                    },
                }
                last_commit = Instant::now();
            }
            if last_heartbeat.elapsed() >= heartbeat_every {
                last_heartbeat = Instant::now();
                let next = match client.on(|c| c.heartbeat(group, m.generation, &m.member_id)) {
                    Ok(()) => Next::Continue,
                    Err(e) => classify(&e).ok_or_else(|| client_error(e))?,
                };
                match next {
                    Next::Continue => {}
                    Next::Rejoin => {
                        // Give the partitions up with what was read committed.
                        let _ = commit(&mut client, &args.topic, group, &mut m);
                        continue 'member;
                    }
                    Next::Reset => {
                        m.member_id.clear();
                        continue 'member;
                    }
                }
            }
        }
    }
    out.flush()?;
    if !m.member_id.is_empty() {
        commit(&mut client, &args.topic, group, &mut m).map_err(client_error)?;
        let _ = client.on(|c| c.leave_group(group, &m.member_id));
    }
    Ok(exit::OK)
}

/// Kafka's default `heartbeat.interval.ms`.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);

/// How often a member heartbeats with session timeout `session`: every
/// [`HEARTBEAT_INTERVAL`], as Kafka's consumer does by default, and at least three
/// times per session. A member hears of a rebalance at its next heartbeat, so this
/// bounds how long a joining member waits for the others.
pub fn heartbeat_interval(session: Duration) -> Duration {
    HEARTBEAT_INTERVAL.min(session / 3)
}

/// How a refused group request moves the member on; `None`: not a group refusal.
fn classify(e: &ClientError) -> Option<Next> {
    match e.code() {
        Some(ErrorCode::REBALANCE_IN_PROGRESS | ErrorCode::ILLEGAL_GENERATION) => {
            Some(Next::Rejoin)
        }
        Some(ErrorCode::UNKNOWN_MEMBER) => Some(Next::Reset),
        _ => None,
    }
}

/// Joins (or rejoins) and syncs until the member holds an assignment of the current
/// generation; then reads the group's committed offsets for it. A partition the
/// group has no offset for starts at `--from` of its offsets as its leader gives
/// them (the group's node may only follow it, a little behind).
fn join(
    client: &mut Coordinator,
    readers: &mut Readers<'_>,
    args: &Args,
    group: &str,
    m: &mut Membership,
    quiet: bool,
) -> anyhow::Result<()> {
    let subscription = encode_topic_partitions(&[(args.topic.as_str(), Vec::new())])
        .map_err(|e| ExitError::new(exit::USAGE, format!("cannot encode the subscription: {e}")))?;
    let rebalance_timeout = args.session_timeout.max(Duration::from_secs(10));
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        let joined = client.on(|c| {
            c.join_group(
                group,
                &m.member_id,
                "seglog-consume",
                args.session_timeout,
                rebalance_timeout,
                PROTOCOL_TYPE,
                &[(args.assignor.name(), &subscription)],
            )
        });
        let joined = match joined {
            Ok(j) => j,
            Err(e) if is_code(&e, &[ErrorCode::UNKNOWN_MEMBER]) => {
                m.member_id.clear();
                continue;
            }
            Err(e) if is_code(&e, &[ErrorCode::REBALANCE_IN_PROGRESS]) => continue,
            Err(e) => return Err(client_error(e)),
        };
        m.member_id = joined.member_id.clone();
        m.generation = joined.generation;
        let assignments: Vec<(String, Vec<u8>)> = if joined.leader == joined.member_id {
            let partitions = client
                .list_offsets(&args.topic)
                .map_err(client_error)?
                .len() as u32;
            let members: Vec<String> = joined.members.iter().map(|(id, _)| id.clone()).collect();
            assign(args.assignor, &members, partitions)
                .into_iter()
                .map(|(id, ps)| {
                    let bytes =
                        encode_topic_partitions(&[(args.topic.as_str(), ps)]).unwrap_or_default();
                    (id, bytes)
                })
                .collect()
        } else {
            Vec::new()
        };
        let refs: Vec<(&str, &[u8])> = assignments
            .iter()
            .map(|(id, a)| (id.as_str(), a.as_slice()))
            .collect();
        let mine = match client
            .on(|c| c.sync_group(group, m.generation, &m.member_id, &refs, rebalance_timeout))
        {
            Ok(a) => a,
            Err(e) if is_code(&e, &[ErrorCode::UNKNOWN_MEMBER]) => {
                m.member_id.clear();
                continue;
            }
            Err(e) if classify(&e).is_some() => continue,
            Err(e) => return Err(client_error(e)),
        };
        let parts: Vec<u32> = decode_topic_partitions(&mine)
            .map_err(|e| {
                ExitError::new(
                    exit::UNAVAILABLE,
                    format!("the group's assignment is invalid: {e}"),
                )
            })?
            .into_iter()
            .filter(|(t, _)| *t == args.topic)
            .flat_map(|(_, ps)| ps)
            .collect();
        let committed =
            match client.on(|c| c.fetch_offsets(group, m.generation, &m.member_id, &args.topic)) {
                Ok(c) => c,
                Err(e) if classify(&e).is_some() => continue,
                Err(e) => return Err(client_error(e)),
            };
        let offsets = client.list_offsets(&args.topic).map_err(client_error)?;
        m.positions.clear();
        m.committed.clear();
        for p in parts {
            let at = match committed.iter().find(|c| c.partition == p) {
                Some(c) => {
                    m.committed.insert(p, c.offset);
                    c.offset
                }
                None => match offsets.iter().find(|o| o.partition == p) {
                    Some(o) => {
                        let o = readers.offsets(*o)?;
                        args.from.start_at(o.start_offset, o.end_offset)
                    }
                    None => 0,
                },
            };
            m.positions.insert(p, at);
        }
        if !quiet {
            let list: Vec<String> = m.positions.keys().map(u32::to_string).collect();
            eprintln!(
                "seglog: group {group} generation {}: member {} reads partitions [{}]",
                m.generation,
                m.member_id,
                list.join(",")
            );
        }
        return Ok(());
    }
}

/// The group coordinator, as a member's requests reach it: each request goes to
/// the node that coordinates the group, following a change of coordinator, and
/// offsets are asked of any node that answers.
struct Coordinator(ClusterClient);

impl Coordinator {
    /// Runs a group request on the coordinator.
    fn on<T>(
        &mut self,
        op: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        self.0.on_coordinator(op)
    }

    /// The topic's offsets from any node that answers; a node holding no replica of
    /// the topic names one that does, asked next.
    fn list_offsets(&mut self, topic: &str) -> Result<Vec<PartitionOffsets>, ClientError> {
        let mut result = self.0.on_any(|c| c.list_offsets(topic));
        let mut here = String::new();
        for _ in 0..super::connect::HOLDER_HOPS_MAX {
            if let Err(ClientError::Refused { addr, .. }) = &result {
                here.clone_from(addr);
            }
            let Some(holder) = super::connect::holder_named(&result, &here) else {
                break;
            };
            result = self.0.conn(&holder).and_then(|c| c.list_offsets(topic));
        }
        result
    }
}

/// Commits the positions that moved since the last commit.
fn commit(
    client: &mut Coordinator,
    topic: &str,
    group: &str,
    m: &mut Membership,
) -> Result<(), ClientError> {
    let changed: Vec<(u32, u64, &str)> = m
        .positions
        .iter()
        .filter(|(p, o)| m.committed.get(p) != Some(o))
        .map(|(p, o)| (*p, *o, ""))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    client.on(|c| c.commit_offsets(group, m.generation, &m.member_id, topic, &changed))?;
    for (p, o, _) in changed {
        m.committed.insert(p, o);
    }
    Ok(())
}

impl StartAt {
    /// Where a partition without a committed offset starts.
    pub fn start_at(self, start_offset: u64, end_offset: u64) -> u64 {
        match self {
            StartAt::Earliest => start_offset,
            StartAt::Latest => end_offset,
            StartAt::Offset(o) => o.clamp(start_offset, end_offset),
            StartAt::Last(n) => end_offset.saturating_sub(n).max(start_offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignors_split_like_kafka() {
        let members: Vec<String> = ["b", "a", "c"].iter().map(|s| (*s).to_string()).collect();
        let r = assign(Assignor::Range, &members, 4);
        assert_eq!(r["a"], vec![0, 1]);
        assert_eq!(r["b"], vec![2]);
        assert_eq!(r["c"], vec![3]);
        let rr = assign(Assignor::Roundrobin, &members, 4);
        assert_eq!(rr["a"], vec![0, 3]);
        assert_eq!(rr["b"], vec![1]);
        assert_eq!(rr["c"], vec![2]);
        let two = assign(Assignor::Range, &members[..2], 4);
        assert_eq!(two["a"], vec![0, 1]);
        assert_eq!(two["b"], vec![2, 3]);
    }
}
