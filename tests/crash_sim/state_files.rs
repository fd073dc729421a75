//! Workloads for the broker's own state files: a consumer group's committed offsets
//! (`groups/<group>.json`, replaced atomically) and the idempotent producers' journal
//! (`producers.journal` + `producers.json`), and their checks after recovery.

use super::*;

use seglog::engine::broker::DurableWait;
use seglog::engine::groups::offsets::{read_group_file, scan_dir, GroupEntry};
use seglog::engine::groups::{OffsetCommit, Waker};
use seglog::engine::producers::{read_state, Decision, Durable, ProducerError, ProducerTable};
use seglog::format::group::{group_file_name, GROUPS_DIR};
use seglog::format::producers::{BATCHES_KEPT, KIND_BATCH};

pub(super) const GROUP: &str = "g";

/// An idempotent batch as the workload wrote it.
#[derive(Clone, Debug)]
pub(super) struct IdemBatch {
    pub pid: u64,
    pub epoch: u16,
    pub p: u32,
    pub seq: i32,
    pub count: u32,
    pub base: u64,
    pub last: u64,
    pub values: Vec<Vec<u8>>,
}

/// What the state files must show.
#[derive(Clone, Debug, Default)]
pub(super) struct StateOracle {
    /// Whether the workload commits offsets of [`GROUP`].
    pub group_used: bool,
    /// The last acknowledged commit.
    pub group_acked: Option<u64>,
    /// Commits begun after it (any may be the one on disk).
    pub group_pending: Vec<u64>,
    /// Idempotent batches written, and whether each was acknowledged.
    pub idem: Vec<(bool, IdemBatch)>,
    /// Idempotent batches about to be written (offsets unknown).
    pub idem_intents: Vec<IdemBatch>,
    /// Producer ids handed out.
    pub inits_acked: Vec<u64>,
}

impl StateOracle {
    pub(super) fn group_intent(&mut self, offset: u64) {
        self.group_used = true;
        self.group_pending.push(offset);
    }
    pub(super) fn group_ack(&mut self, offset: u64) {
        self.group_acked = Some(offset);
        // Offsets only grow: what was begun before is superseded on disk.
        self.group_pending.retain(|o| *o > offset);
    }
    pub(super) fn idem(&mut self, acked: bool, b: &IdemBatch) {
        match self
            .idem
            .iter_mut()
            .find(|(_, x)| x.pid == b.pid && x.p == b.p && x.seq == b.seq)
        {
            Some(e) => e.0 |= acked,
            None => self.idem.push((acked, b.clone())),
        }
    }
}

/// Checks done with the recovered broker open: the group's committed offset, and
/// every idempotent batch's producer state (a retry is a duplicate with the original
/// offsets; nothing points past a partition's recovered end). Returns the batches
/// begun whose retry would be written again (for [`check_not_written_again`]).
pub(super) fn check_open(
    dir: &Path,
    broker: &Broker,
    o: &StateOracle,
    v: &mut Vec<String>,
) -> Vec<IdemBatch> {
    if o.group_used {
        check_group(dir, broker, o, v);
    }
    if o.idem.is_empty() && o.idem_intents.is_empty() && o.inits_acked.is_empty() {
        return Vec::new();
    }
    let table = broker.producers();
    let known = table.describe();
    for pid in o.inits_acked.iter().filter(|p| !known.contains_key(p)) {
        v.push(format!(
            "producer {pid}: its id was handed out, yet it is unknown after recovery (and may be handed out again)"
        ));
    }
    let mut written_again = Vec::new();
    for b in &o.idem_intents {
        if let Ok(Decision::Append) = table.check(b.pid, b.epoch, TOPIC, b.p, b.seq, b.count) {
            table.abandoned(b.pid, b.epoch, TOPIC, b.p);
            written_again.push(b.clone());
        }
    }
    let end = |p: u32| broker.offsets(TOPIC, p).map_or(0, |(_, e)| e);
    // The journal as recovery left it: no entry past its partition's end.
    match read_state(dir) {
        Ok((_, entries, _, problem, _)) => {
            if let Some(pr) = problem {
                v.push(format!(
                    "producers.journal has a problem after recovery: {pr}"
                ));
            }
            for e in entries.iter().filter(|e| e.kind == KIND_BATCH) {
                let end = end(e.partition);
                if e.last_offset >= end {
                    v.push(format!(
                        "producers.journal: entry of producer {} seq {} points at offset {} past partition {}'s recovered end {end}",
                        e.producer_id, e.base_sequence, e.last_offset, e.partition
                    ));
                }
            }
        }
        Err(e) => v.push(format!("producer state unreadable after recovery: {e}")),
    }
    for (acked, b) in &o.idem {
        let end = end(b.p);
        match table.check(b.pid, b.epoch, TOPIC, b.p, b.seq, b.count) {
            Ok(Decision::Duplicate {
                base_offset,
                last_offset,
            }) => {
                if (base_offset, last_offset) != (b.base, b.last) {
                    v.push(format!(
                        "producer {} seq {}: a retry is answered with offsets {base_offset}..={last_offset}, not {}..={}",
                        b.pid, b.seq, b.base, b.last
                    ));
                }
                if last_offset >= end {
                    v.push(format!(
                        "producer {} seq {}: a retry is answered as a duplicate at {last_offset}, past partition {}'s recovered end {end}",
                        b.pid, b.seq, b.p
                    ));
                }
            }
            Ok(Decision::Append) => {
                table.abandoned(b.pid, b.epoch, TOPIC, b.p);
                if *acked {
                    v.push(format!(
                        "producer {} seq {}: acknowledged, yet after recovery a retry would be written again",
                        b.pid, b.seq
                    ));
                }
            }
            Err(e) => {
                // The table keeps the last BATCHES_KEPT batches per producer and
                // partition (Kafka's window): a batch with that many recorded after it
                // (below the sequence the table expects next) is forgotten, and its
                // retry is then refused as out of order. The batch being written at
                // the crash point may be recorded without being in the oracle yet
                // (batches are written one at a time): it counts when the expected
                // sequence lies past every batch the oracle knows.
                let evicted = match e {
                    ProducerError::OutOfOrder { expected, .. } => {
                        let expected = i64::from(expected);
                        let end = |x: &IdemBatch| i64::from(x.seq) + i64::from(x.count);
                        let same = |x: &IdemBatch| (x.pid, x.epoch, x.p) == (b.pid, b.epoch, b.p);
                        let known = o.idem.iter().map(|(_, x)| x).filter(|x| same(x));
                        let recorded_after = known
                            .clone()
                            .filter(|x| x.seq > b.seq && end(x) <= expected)
                            .count();
                        let known_end = known.map(end).max().unwrap_or(0);
                        recorded_after + usize::from(expected > known_end) >= BATCHES_KEPT
                    }
                    _ => false,
                };
                if *acked && !evicted {
                    let written: Vec<(i32, u32, bool)> = o
                        .idem
                        .iter()
                        .filter(|(_, x)| (x.pid, x.p) == (b.pid, b.p))
                        .map(|(a, x)| (x.seq, x.count, *a))
                        .collect();
                    v.push(format!(
                        "producer {} seq {}: acknowledged, yet after recovery a retry is refused: {e} (written on the partition, as (seq, count, acknowledged): {written:?})",
                        b.pid, b.seq
                    ));
                }
            }
        }
    }
    written_again
}

/// After a crash of the process alone (every write before the crash point kept), or
/// a power loss that kept only what syncs made durable: a batch whose retry would be
/// written again has none of its records in the partition, or the retry would
/// duplicate them. (The entry is written before the records, and made durable before
/// any sync of their partition. A power loss that also keeps writes no sync covered,
/// as the kernel's writeback may, can keep the records and lose the entry: that case
/// is not checked here.)
pub(super) fn check_not_written_again(
    p: u32,
    recs: &[Rec],
    written_again: &[IdemBatch],
    v: &mut Vec<String>,
) {
    for b in written_again.iter().filter(|b| b.p == p) {
        let there = b
            .values
            .iter()
            .filter(|val| recs.iter().any(|r| &&r.2 == val))
            .count();
        if there > 0 {
            v.push(format!(
                "partition {p}: {there} of the {} records of producer {} seq {} are there after a crash that kept every write or only the synced ones, yet a retry of the batch would be written again",
                b.values.len(),
                b.pid,
                b.seq
            ));
        }
    }
}

fn check_group(dir: &Path, broker: &Broker, o: &StateOracle, v: &mut Vec<String>) {
    let gdir = dir.join(GROUPS_DIR);
    for e in scan_dir(&gdir) {
        if let GroupEntry::Problem(p) = e {
            v.push(format!("group file unusable after recovery: {p}"));
        }
    }
    let path = gdir.join(group_file_name(GROUP));
    let on_disk = if path.exists() {
        match read_group_file(&path) {
            Ok((_, l)) => l
                .offsets
                .iter()
                .find(|c| c.topic == TOPIC && c.partition == 0)
                .map(|c| c.offset),
            Err(e) => {
                v.push(format!("group file torn after recovery: {e}"));
                return;
            }
        }
    } else {
        None
    };
    let served = broker
        .groups()
        .fetch_offsets(GROUP, Some(TOPIC), None)
        .unwrap_or_default()
        .iter()
        .find(|c| c.partition == 0)
        .map(|c| c.offset);
    if served != on_disk {
        v.push(format!(
            "the broker serves committed offset {served:?}, the group file holds {on_disk:?}"
        ));
    }
    let ok = on_disk == o.group_acked || on_disk.is_some_and(|x| o.group_pending.contains(&x));
    if !ok {
        v.push(format!(
            "group {GROUP}: committed offset {on_disk:?} after recovery; acknowledged {:?}, in flight {:?}",
            o.group_acked, o.group_pending
        ));
    }
}

/// Each acknowledged idempotent batch's values are in the partition exactly once.
pub(super) fn check_exactly_once(p: u32, recs: &[Rec], o: &StateOracle, v: &mut Vec<String>) {
    for (_, b) in o.idem.iter().filter(|(a, b)| *a && b.p == p) {
        for val in &b.values {
            let n = recs.iter().filter(|r| &r.2 == val).count();
            if n != 1 {
                v.push(format!(
                    "partition {p}: acknowledged idempotent value {:?} is there {n} times",
                    String::from_utf8_lossy(val)
                ));
            }
        }
    }
}

/// Offsets of one group committed again and again (admin commits: the group has no
/// members), with produces between, over a topic made before the trace.
pub(super) fn workload_group_commits(root: &Path, rng: &mut Rng) -> Run {
    let evs = setup_topic(root, small_config(), 1, 2, false, rng);
    let mut run = Run::new(root);
    run.topic_preexisting = true;
    replay(&mut run, evs);
    let storage: StorageRef = Arc::new(run.sim.clone());
    let b = Broker::open(root, storage, broker_opts()).unwrap();
    let mut offset = 0;
    for i in 0..6u64 {
        offset += 1 + rng.below(3);
        run.mark(Ev::GroupIntent(offset));
        let entries = [OffsetCommit {
            partition: 0,
            offset,
            metadata: format!("m{i}"),
        }];
        let done = b
            .groups()
            .commit(&*b, GROUP, -1, "", None, TOPIC, &entries)
            .unwrap();
        match done.blocking_recv() {
            Ok(Ok(())) => run.mark(Ev::GroupAck(offset)),
            other => run
                .live_violations
                .push(format!("commit of {offset} failed: {other:?}")),
        }
        if rng.below(2) == 0 {
            let v = value(0, 700 + i, rng);
            produce(&mut run, &b, 0, vec![v]);
        }
    }
    drop(b);
    run
}

/// Checks and writes one idempotent batch on `p` the way the servers do: its journal
/// entry, then its records (under the partition's write lock). Marks the intent and
/// the write; `None` (and a live violation) when it was refused or failed.
fn write_idempotent(
    run: &mut Run,
    b: &Broker,
    table: &ProducerTable,
    (pid, epoch): (u64, u16),
    (p, seq): (u32, i32),
    values: Vec<Vec<u8>>,
) -> Option<(IdemBatch, Option<DurableWait>, Durable)> {
    let count = values.len() as u32;
    match table.check(pid, epoch, TOPIC, p, seq, count) {
        Ok(Decision::Append) => {}
        other => {
            run.live_violations
                .push(format!("batch seq {seq}: check said {other:?}"));
            return None;
        }
    }
    run.mark(Ev::Intent {
        p,
        values: values.clone(),
    });
    run.mark(Ev::IdemIntent(IdemBatch {
        pid,
        epoch,
        p,
        seq,
        count,
        base: 0,
        last: 0,
        values: values.clone(),
    }));
    let recs = new_records(&values);
    let written = b.append_then(TOPIC, p, &recs, |r| {
        table.journal_batch(
            pid,
            epoch,
            TOPIC,
            p,
            seq,
            count,
            r.base_offset,
            r.last_offset,
        )
    });
    let (r, wait, (batch, journal)) = match written {
        Ok(w) => w,
        Err(e) => {
            table.abandoned(pid, epoch, TOPIC, p);
            run.live_violations.push(format!("append failed: {e:?}"));
            return None;
        }
    };
    table.recorded(&batch);
    let batch = IdemBatch {
        pid,
        epoch,
        p,
        seq,
        count,
        base: r.base_offset,
        last: r.last_offset,
        values,
    };
    run.mark(Ev::Idem {
        acked: false,
        b: batch.clone(),
    });
    Some((batch, wait, journal))
}

/// Marks a written idempotent batch acknowledged (its records and entry durable).
fn mark_acknowledged(run: &mut Run, batch: &IdemBatch) {
    run.mark(Ev::Ack {
        p: batch.p,
        base: batch.base,
        values: batch.values.clone(),
    });
    run.mark(Ev::Idem {
        acked: true,
        b: batch.clone(),
    });
}

/// Idempotent batches on two partitions the way the server writes them: check
/// against the table, journal entry then records (under the partition's write
/// lock), both durable, then acknowledged;
/// some acknowledged batches are retried and must come back as duplicates.
pub(super) fn workload_idempotent(root: &Path, rng: &mut Rng) -> Run {
    let evs = setup_topic(root, small_config(), 2, 2, false, rng);
    let mut run = Run::new(root);
    run.topic_preexisting = true;
    replay(&mut run, evs);
    let storage: StorageRef = Arc::new(run.sim.clone());
    let b = Broker::open(root, storage, broker_opts()).unwrap();
    let table = b.producers().clone();
    let ((pid, epoch), init) = table.init(None).unwrap();
    if !matches!(init.blocking_recv(), Ok(Ok(()))) {
        run.live_violations.push("producer init failed".into());
        return run;
    }
    run.mark(Ev::InitAcked(pid));
    let mut seqs = [0i32; 2];
    for i in 0..8u64 {
        let p = (rng.below(2)) as u32;
        let count = 1 + rng.below(3) as u32;
        let values: Vec<Vec<u8>> = (0..u64::from(count))
            .map(|j| value(p, 900 + i * 10 + j, rng))
            .collect();
        let seq = seqs[p as usize];
        let Some((batch, wait, journal)) =
            write_idempotent(&mut run, &b, &table, (pid, epoch), (p, seq), values)
        else {
            continue;
        };
        seqs[p as usize] += count as i32;
        let data_ok = wait.is_none_or(|w| b.wait_durable_here(w).is_ok());
        let journal_ok = matches!(journal.blocking_recv(), Ok(Ok(())));
        if !(data_ok && journal_ok) {
            continue;
        }
        mark_acknowledged(&mut run, &batch);
        if rng.below(3) == 0 {
            // A retry of what was just acknowledged: a duplicate, nothing written.
            match table.check(pid, epoch, TOPIC, p, seq, count) {
                Ok(Decision::Duplicate {
                    base_offset,
                    last_offset,
                }) if (base_offset, last_offset) == (batch.base, batch.last) => {}
                other => run
                    .live_violations
                    .push(format!("retry of seq {seq} answered {other:?}")),
            }
        }
    }
    drop(b);
    run
}

/// Idempotent batches whose journal fdatasync comes late: the broker's flusher is
/// never asked for a pass (as when it is busy), and the workload runs the journal's
/// group commit itself only after each batch's partition was fsynced, by the
/// batch's own group commit or by that of a plain produce to the same partition
/// written after it. Each of those fsyncs must make the journal durable first: a
/// power loss keeping only what was synced then keeps no batch's records without
/// its entry (whose retry would write them again).
pub(super) fn workload_idempotent_late_journal(root: &Path, rng: &mut Rng) -> Run {
    let evs = setup_topic(root, small_config(), 2, 2, false, rng);
    let mut run = Run::new(root);
    run.topic_preexisting = true;
    replay(&mut run, evs);
    let storage: StorageRef = Arc::new(run.sim.clone());
    let b = Broker::open(root, storage, broker_opts()).unwrap();
    let table = b.producers().clone();
    table.share_commits(Waker(Box::new(|| {})));
    let ((pid, epoch), mut init) = table.init(None).unwrap();
    // The id may be answered only once the pass below made it durable.
    let early = init.try_recv();
    if matches!(early, Ok(Ok(()))) {
        run.mark(Ev::InitAcked(pid));
    }
    table.sync_pending();
    let answered = match &early {
        Ok(r) => r.is_ok(),
        Err(_) => matches!(init.blocking_recv(), Ok(Ok(()))),
    };
    if !answered {
        run.live_violations.push("producer init failed".into());
        return run;
    }
    if early.is_err() {
        run.mark(Ev::InitAcked(pid));
    }
    let mut seqs = [0i32; 2];
    for i in 0..6u64 {
        let p = (rng.below(2)) as u32;
        let count = 1 + rng.below(3) as u32;
        let values: Vec<Vec<u8>> = (0..u64::from(count))
            .map(|j| value(p, 950 + i * 10 + j, rng))
            .collect();
        let seq = seqs[p as usize];
        let Some((batch, wait, journal)) =
            write_idempotent(&mut run, &b, &table, (pid, epoch), (p, seq), values)
        else {
            continue;
        };
        seqs[p as usize] += count as i32;
        if rng.below(2) == 0 {
            // Its group commit fsyncs the partition, the batch's records with it.
            let v = value(p, 990 + i, rng);
            produce(&mut run, &b, p, vec![v]);
        }
        let data_ok = wait.is_none_or(|w| b.wait_durable_here(w).is_ok());
        // The flusher's pass, late.
        table.sync_pending();
        let journal_ok = matches!(journal.blocking_recv(), Ok(Ok(())));
        if data_ok && journal_ok {
            mark_acknowledged(&mut run, &batch);
        }
    }
    drop(b);
    run
}
