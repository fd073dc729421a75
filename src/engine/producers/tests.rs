//! Producer-table tests: duplicates, gaps, fencing, journal replay and its cuts.

use super::*;
use std::sync::Arc;

use crate::engine::storage::io::RealStorage;

fn open(dir: &Path, end: u64) -> (ProducerTable, Report) {
    ProducerTable::open(
        dir,
        Arc::new(RealStorage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &move |t, p| {
            (t == "t" && p == 0)
                .then_some(end)
                .map_or(PartitionEnd::Gone, PartitionEnd::At)
        },
    )
    .unwrap()
}

fn durable(mut rx: Durable) {
    rx.try_recv().expect("completed").unwrap();
}

/// Writes one batch of `count` records at `base_offset` through the table.
fn write(
    t: &ProducerTable,
    id: u64,
    epoch: u16,
    seq: i32,
    count: u32,
    base_offset: u64,
) -> Decision {
    let d = t.check(id, epoch, "t", 0, seq, count).unwrap();
    if d == Decision::Append {
        durable(t.accepted(
            id,
            epoch,
            "t",
            0,
            seq,
            count,
            base_offset,
            base_offset + u64::from(count) - 1,
        ));
    }
    d
}

#[test]
fn duplicates_gaps_and_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, epoch), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, epoch, 0, 3, 0), Decision::Append);
    assert_eq!(write(&t, id, epoch, 3, 2, 3), Decision::Append);
    // A retry of either batch gets its offsets back.
    assert_eq!(
        write(&t, id, epoch, 0, 3, 99),
        Decision::Duplicate {
            base_offset: 0,
            last_offset: 2
        }
    );
    assert_eq!(
        write(&t, id, epoch, 3, 2, 99),
        Decision::Duplicate {
            base_offset: 3,
            last_offset: 4
        }
    );
    // A gap.
    assert!(matches!(
        t.check(id, epoch, "t", 0, 9, 1),
        Err(ProducerError::OutOfOrder {
            expected: 5,
            got: 9,
            ..
        })
    ));
    // A second batch while one is in flight is told to retry.
    assert_eq!(t.check(id, epoch, "t", 0, 5, 1).unwrap(), Decision::Append);
    assert!(matches!(
        t.check(id, epoch, "t", 0, 5, 1),
        Err(ProducerError::InFlight { .. })
    ));
    t.abandoned(id, epoch, "t", 0);
    // A bumped epoch fences the old one.
    let ((same, e1), rx) = t.init(Some((id, epoch))).unwrap();
    durable(rx);
    assert_eq!((same, e1), (id, 1));
    assert!(matches!(
        t.check(id, 0, "t", 0, 5, 1),
        Err(ProducerError::Fenced {
            epoch: 0,
            current: 1,
            ..
        })
    ));
    assert!(matches!(
        t.check(77, 0, "t", 0, 0, 1),
        Err(ProducerError::UnknownProducer { .. })
    ));
    assert_eq!(write(&t, id, 1, 0, 1, 5), Decision::Append);
}

#[test]
fn replay_drops_entries_past_the_end_and_cuts_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    for i in 0..6 {
        write(&t, id, e, i * 2, 2, u64::from(i as u32) * 2);
    }
    drop(t);
    // A torn tail: half an entry written at the entries' end, over the zero tail.
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let (_, good, problem) = crate::format::producers::scan_journal(&bytes);
    assert_eq!(problem, None);
    assert!(bytes.len() > good, "zeros written ahead of the entries");
    assert!(bytes[good..].iter().all(|&b| b == 0));
    bytes[good..good + 7].copy_from_slice(&[0, 0, 0, 57, 1, 2, 3]);
    std::fs::write(&path, &bytes).unwrap();
    // Every batch recovered: only the torn tail is cut.
    let (t, report) = open(dir.path(), 12);
    assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, good);
    assert!(report.iter().any(|l| l.contains("cut short")), "{report:?}");
    drop(t);
    // The partition recovered to offset 8: batches at 8..=9 and 10..=11 are gone,
    // and their entries leave the journal (a snapshot of what was kept, then the
    // journal cut), so that records written later at those offsets are never taken
    // for them.
    let (t, report) = open(dir.path(), 8);
    assert!(
        report.iter().any(|l| l.contains("dropped 2 entries")),
        "{report:?}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len() as usize,
        JOURNAL_HEADER_LEN
    );
    drop(t);
    let (t, report) = open(dir.path(), 12);
    assert!(!report.iter().any(|l| l.contains("dropped")), "{report:?}");
    assert_eq!(t.check(id, e, "t", 0, 8, 2).unwrap(), Decision::Append);
    t.abandoned(id, e, "t", 0);
    // Batch 3 (sequences 6..=7) is a duplicate; sequence 8 is the next, as new.
    assert_eq!(
        t.check(id, e, "t", 0, 6, 2).unwrap(),
        Decision::Duplicate {
            base_offset: 6,
            last_offset: 7
        }
    );
    assert_eq!(write(&t, id, e, 8, 2, 8), Decision::Append);
    // Snapshot + journal cut, then reopen: the state survives, the journal is empty.
    t.snapshot().unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len() as usize,
        JOURNAL_HEADER_LEN
    );
    drop(t);
    let (t, _) = open(dir.path(), 10);
    assert_eq!(
        t.check(id, e, "t", 0, 8, 2).unwrap(),
        Decision::Duplicate {
            base_offset: 8,
            last_offset: 9
        }
    );
    let ((next, _), _) = t.init(None).unwrap();
    assert!(next > id);
}

#[test]
fn a_corrupt_entry_is_reported_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 100);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    write(&t, id, e, 0, 1, 0);
    drop(t);
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let second = JOURNAL_HEADER_LEN + crate::format::producers::ENTRY_FIXED_LEN;
    bytes[second + 10] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (_, report) = open(dir.path(), 100);
    assert!(
        report
            .iter()
            .any(|l| l.contains(&format!("entry at byte {second}")) && l.contains("checksum")),
        "{report:?}"
    );
}

#[test]
fn snapshot_batches_past_the_recovered_end_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    for i in 0..3 {
        write(&t, id, e, i * 2, 2, u64::from(i as u32) * 2);
    }
    // The snapshot is taken before the last batch's records were durable.
    t.snapshot().unwrap();
    drop(t);
    let (t, report) = open(dir.path(), 4);
    assert!(report.iter().any(|l| l.contains("dropped 1")), "{report:?}");
    // The lost batch is written again, not answered as a duplicate.
    assert_eq!(t.check(id, e, "t", 0, 4, 2).unwrap(), Decision::Append);
    t.abandoned(id, e, "t", 0);
    assert_eq!(
        t.check(id, e, "t", 0, 2, 2).unwrap(),
        Decision::Duplicate {
            base_offset: 2,
            last_offset: 3
        }
    );
}

/// KIP-360: a batch at sequence 0 starts a new state, at a higher epoch (the client
/// bumped it itself) or of an unknown id this broker could have handed out; the
/// journal and the snapshot bring both back after a restart.
#[test]
fn sequence_0_starts_a_new_epoch_or_producer_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, e, 0, 2, 0), Decision::Append);
    // A higher epoch at another sequence than 0 is out of order, as in Kafka.
    assert!(matches!(
        t.check(id, e + 1, "t", 0, 2, 1),
        Err(ProducerError::OutOfOrder {
            expected: 0,
            got: 2,
            ..
        })
    ));
    assert_eq!(write(&t, id, e + 1, 0, 1, 2), Decision::Append);
    assert!(matches!(
        t.check(id, e, "t", 0, 2, 1),
        Err(ProducerError::Fenced { .. })
    ));
    // Ids below the next one to hand out may be unknown here (expired, or given by
    // a node whose range is lower); one at sequence 0 starts a producer.
    t.reserve_ids_from(100);
    assert_eq!(write(&t, 50, 3, 0, 1, 3), Decision::Append);
    for (pid, seq) in [(100, 0), (u64::MAX, 0), (0, 0), (60, 5)] {
        assert!(
            matches!(
                t.check(pid, 0, "t", 0, seq, 1),
                Err(ProducerError::UnknownProducer { .. })
            ),
            "{pid} {seq}"
        );
    }
    assert!(!t.describe().contains_key(&60));
    assert_eq!(write(&t, 50, 3, 1, 1, 4), Decision::Append);
    drop(t);

    // The journal replayed: the bumped epoch and the new producer are known.
    let (t, report) = open(dir.path(), 5);
    assert!(report.is_empty(), "{report:?}");
    let dup = |base: u64| Decision::Duplicate {
        base_offset: base,
        last_offset: base,
    };
    assert_eq!(t.check(id, e + 1, "t", 0, 0, 1).unwrap(), dup(2));
    assert!(matches!(
        t.check(id, e, "t", 0, 2, 1),
        Err(ProducerError::Fenced { .. })
    ));
    assert_eq!(t.check(50, 3, "t", 0, 1, 1).unwrap(), dup(4));
    assert_eq!(write(&t, id, e + 1, 1, 1, 5), Decision::Append);
    assert_eq!(write(&t, 50, 3, 2, 1, 6), Decision::Append);
    // An init never hands out an id in use.
    let ((fresh, _), rx) = t.init(None).unwrap();
    durable(rx);
    assert!(fresh > 50, "{fresh}");
    // The snapshot holds them too.
    t.snapshot().unwrap();
    drop(t);
    let (t, _) = open(dir.path(), 7);
    assert_eq!(t.check(50, 3, "t", 0, 2, 1).unwrap(), dup(6));
    assert_eq!(t.check(id, e + 1, "t", 0, 1, 1).unwrap(), dup(5));
}

/// A batch of the old epoch in flight while a batch bumps the epoch is written but
/// not recorded, in memory or at replay: the new epoch's sequences go on.
#[test]
fn a_batch_of_the_old_epoch_in_flight_at_a_bump_is_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, e, 0, 4, 0), Decision::Append);
    assert_eq!(t.check(id, e, "t", 0, 4, 2).unwrap(), Decision::Append);
    assert_eq!(t.check(id, e + 1, "t", 0, 0, 1).unwrap(), Decision::Append);
    durable(t.accepted(id, e + 1, "t", 0, 0, 1, 4, 4));
    durable(t.accepted(id, e, "t", 0, 4, 2, 5, 6));
    let next = |t: &ProducerTable| t.check(id, e + 1, "t", 0, 1, 1);
    assert_eq!(next(&t).unwrap(), Decision::Append);
    t.abandoned(id, e + 1, "t", 0);
    drop(t);
    let (t, _) = open(dir.path(), 7);
    assert_eq!(next(&t).unwrap(), Decision::Append);
}

/// A batch only partly in its partition (the end falls inside it) is cut off
/// through `cut` at its first offset, from the journal and from a snapshot alike;
/// a batch wholly past the end is only dropped; a failed cut is reported.
#[test]
fn a_batch_only_partly_in_its_partition_is_cut_off() {
    use std::sync::Mutex;
    for through_snapshot in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (t, _) = open(dir.path(), 0);
        let ((id, epoch), rx) = t.init(None).unwrap();
        durable(rx);
        assert_eq!(write(&t, id, epoch, 0, 2, 0), Decision::Append);
        assert_eq!(write(&t, id, epoch, 2, 3, 2), Decision::Append);
        if through_snapshot {
            t.snapshot().unwrap();
        }
        drop(t);
        let cuts = Mutex::new(Vec::new());
        let (t, report) = ProducerTable::open_cutting(
            dir.path(),
            Arc::new(RealStorage),
            PRODUCER_ID_EXPIRATION_DEFAULT,
            // The second batch (offsets 2..=4) ends past the end, 4.
            &|topic, p| {
                (topic == "t" && p == 0)
                    .then_some(4)
                    .map_or(PartitionEnd::Gone, PartitionEnd::At)
            },
            &|topic, p, base| {
                cuts.lock().unwrap().push((topic.to_string(), p, base));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(*cuts.lock().unwrap(), [("t".to_string(), 0, 2)]);
        assert!(
            report.iter().any(|l| l.contains(
                "producer 1's batch at offsets 2..=4 is only partly in t/0 (its end is 4): cut the partition back to offset 2"
            )),
            "{report:?}"
        );
        // Its retry is written again; the first batch stays a duplicate.
        assert_eq!(t.check(id, epoch, "t", 0, 2, 3).unwrap(), Decision::Append);
        t.abandoned(id, epoch, "t", 0);
        assert_eq!(
            t.check(id, epoch, "t", 0, 0, 2).unwrap(),
            Decision::Duplicate {
                base_offset: 0,
                last_offset: 1
            }
        );
    }
    // Wholly past the end: dropped, nothing cut. A failed cut: reported.
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, epoch), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, epoch, 0, 2, 0), Decision::Append);
    assert_eq!(write(&t, id, epoch, 2, 3, 2), Decision::Append);
    drop(t);
    let (_, report) = ProducerTable::open_cutting(
        dir.path(),
        Arc::new(RealStorage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &|_, _| PartitionEnd::At(2),
        &|_, _, _| panic!("nothing to cut"),
    )
    .unwrap();
    assert!(
        report.iter().all(|l| !l.contains("only partly")),
        "{report:?}"
    );
    let (_, report) = open(dir.path(), 1);
    assert!(
        report.iter().any(|l| l.contains(
            "producer 1's batch at offsets 0..=1 is only partly in t/0 (its end is 1), and cutting it back to offset 0 failed (nothing may be cut here): a retry of the batch writes its first 1 record again"
        )),
        "{report:?}"
    );
}

/// A table with no flusher (a pass runs only when the test asks for one), a new
/// producer's init entry (position 1) and one batch of it, 2 records at offset 0
/// (position 2), neither durable yet. Returns the table, the producer's id and
/// epoch, and both entries' waiters.
fn init_and_batch(dir: &Path) -> (ProducerTable, (u64, u16), Durable, Durable) {
    let (t, _) = open(dir, 100);
    t.share_commits(Waker(Box::new(|| {})));
    let ((id, epoch), init) = t.init(None).unwrap();
    assert_eq!(t.positions(), (1, 0));
    assert_eq!(t.check(id, epoch, "t", 0, 0, 2).unwrap(), Decision::Append);
    let (batch, entry) = t.journal_batch(id, epoch, "t", 0, 0, 2, 0, 1).unwrap();
    t.recorded(&batch);
    assert_eq!(t.positions(), (2, 0));
    (t, (id, epoch), init, entry)
}

/// The journal barrier's positions: an entry counts as written once its write
/// returned; one fdatasync makes every entry written before it durable, and a
/// barrier or pass whose entries are durable already makes no system call.
#[test]
fn one_fdatasync_makes_every_entry_written_before_it_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, init, entry) = init_and_batch(dir.path());
    let fsyncs = || t.fsyncs.load(Ordering::Relaxed);
    let before = fsyncs();
    // A partition's barrier for the first entry: one fdatasync covers both.
    t.sync_to(1).unwrap();
    assert_eq!((t.positions(), fsyncs()), ((2, 2), before + 1));
    t.sync_to(2).unwrap();
    // The pass finds its waiters' entries durable.
    t.sync_pending();
    assert_eq!(fsyncs(), before + 1);
    durable(init);
    durable(entry);
}

/// A flusher pass answers the waiters of the entries written before it and of those
/// already durable: an entry written during the pass (after it took its position)
/// and not yet durable waits for the next one, and a pass whose entries a
/// partition's barrier made durable makes no system call of its own.
#[test]
fn a_pass_completes_the_entries_written_before_it_only() {
    let dir = tempfile::tempdir().unwrap();
    let (t, (id, epoch), init, mut entry) = init_and_batch(dir.path());
    // The pass took its position after the init's entry, before the batch's.
    let pass = 1;
    let fsyncs = || t.fsyncs.load(Ordering::Relaxed);
    let before = fsyncs();
    // The pass's own fdatasync (no barrier ran) covers both entries, but answers
    // only the one written before the pass.
    t.sync_pending_through(pass);
    assert_eq!((t.positions(), fsyncs()), ((2, 2), before + 1));
    durable(init);
    assert!(
        entry.try_recv().is_err(),
        "the later entry waits for its pass"
    );
    // The next pass finds it durable: no system call.
    t.sync_pending_through(t.positions().0);
    assert_eq!(fsyncs(), before + 1);
    durable(entry);
    // An entry written during a pass that a partition's barrier made durable before
    // the pass looked is answered by that pass, with no system call of its own.
    let pass = t.positions().0;
    assert_eq!(t.check(id, epoch, "t", 0, 2, 1).unwrap(), Decision::Append);
    let (batch, entry) = t.journal_batch(id, epoch, "t", 0, 2, 1, 2, 2).unwrap();
    t.recorded(&batch);
    t.sync_to(3).unwrap();
    assert_eq!(fsyncs(), before + 2);
    t.sync_pending_through(pass);
    assert_eq!(fsyncs(), before + 2);
    durable(entry);
}

/// A failed fdatasync poisons the journal: a barrier past what is durable fails
/// (its partition must not be synced), one within it still passes.
#[test]
fn a_barrier_past_a_failed_fdatasync_fails() {
    use crate::testkit::storage::{FailOn, FailingStorage};
    let dir = tempfile::tempdir().unwrap();
    // Syncs: the new journal's sync_all and the directory's at open, the init's
    // fdatasync, then the barrier's, which fails.
    let storage = FailingStorage::new(Arc::new(RealStorage), 4, FailOn::Sync, false);
    let (t, _) = ProducerTable::open(
        dir.path(),
        Arc::new(storage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &|_, _| PartitionEnd::At(100),
    )
    .unwrap();
    let ((id, epoch), init) = t.init(None).unwrap();
    durable(init);
    t.share_commits(Waker(Box::new(|| {})));
    assert_eq!(t.check(id, epoch, "t", 0, 0, 1).unwrap(), Decision::Append);
    let (batch, mut entry) = t.journal_batch(id, epoch, "t", 0, 0, 1, 0, 0).unwrap();
    t.recorded(&batch);
    assert_eq!(t.positions(), (2, 1));
    let err = t.sync_to(2).unwrap_err();
    assert!(err.contains("syncing producers.journal"), "{err}");
    assert_eq!(t.positions(), (2, 1));
    t.sync_to(1).unwrap();
    // The pass fails the entry's waiter too, and later barriers fail at once.
    t.sync_pending();
    assert!(entry.try_recv().unwrap().is_err());
    assert!(t.sync_to(2).is_err());
}

/// Opens a table on storage whose journal entry writes fail while `armed`: the failed
/// write first writes the whole entry, as a write that fails late may. Without
/// `zeros_fail`, one entry write fails (the failure disarms); with it, the zeros
/// written meanwhile fail too, until the test disarms. Returns the table, a producer
/// initialised (its entry durable) and the switch.
fn failing_entry_writes(
    dir: &Path,
    zeros_fail: bool,
) -> (ProducerTable, (u64, u16), Arc<AtomicBool>) {
    use crate::testkit::storage::{Call, HookStorage};
    let armed = Arc::new(AtomicBool::new(false));
    let switch = Arc::clone(&armed);
    let storage = HookStorage::from_fn(Arc::new(RealStorage), move |op| {
        let Call::WriteAt { buf, pos } = op.call else {
            return None;
        };
        if !op.path.ends_with(JOURNAL_FILE) || !armed.load(Ordering::SeqCst) {
            return None;
        }
        if buf.iter().all(|b| *b == 0) {
            return zeros_fail.then(|| Err(std::io::Error::other("injected: zeros")));
        }
        if !zeros_fail {
            armed.store(false, Ordering::SeqCst);
        }
        op.file?.write_at(buf, pos).unwrap();
        Some(Err(std::io::Error::other("injected: no space left")))
    });
    let (t, _) = ProducerTable::open(
        dir,
        Arc::new(storage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &|_, _| PartitionEnd::At(100),
    )
    .unwrap();
    let (producer, init) = t.init(None).unwrap();
    durable(init);
    (t, producer, switch)
}

/// A journal entry whose write failed after writing it whole is zeroed: the journal
/// goes on (later entries are written and synced), and a restart does not replay
/// the refused batch, whose retry is then written, not answered as a duplicate.
#[test]
fn a_failed_entry_write_is_zeroed_and_the_journal_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (t, (id, epoch), armed) = failing_entry_writes(dir.path(), false);
    armed.store(true, Ordering::SeqCst);
    let err = t.journal_batch(id, epoch, "t", 0, 0, 2, 0, 1).unwrap_err();
    assert!(
        err.to_string()
            .contains("writing producers.journal at byte"),
        "{err}"
    );
    assert_eq!(t.positions(), (1, 1));
    // The journal goes on: another producer's batch is journalled and made durable.
    let ((other, other_epoch), init) = t.init(None).unwrap();
    durable(init);
    assert_eq!(write(&t, other, other_epoch, 0, 1, 2), Decision::Append);
    assert_eq!(t.positions(), (3, 3));
    drop(t);
    let (t, _) = open(dir.path(), 100);
    assert_eq!(
        t.check(id, epoch, "t", 0, 0, 2).unwrap(),
        Decision::Append,
        "the refused batch must not be replayed"
    );
    assert_eq!(
        t.check(other, other_epoch, "t", 0, 0, 1).unwrap(),
        Decision::Duplicate {
            base_offset: 2,
            last_offset: 2
        }
    );
}

/// When the zeros over a failed entry cannot be written either, the journal fails:
/// no later entry is written and no fdatasync runs (it would make the refused entry
/// durable); entries made durable before stay durable.
#[test]
fn a_failed_entry_write_that_cannot_be_zeroed_fails_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (t, (id, epoch), armed) = failing_entry_writes(dir.path(), true);
    t.share_commits(Waker(Box::new(|| {})));
    // Written, not yet durable.
    assert_eq!(t.check(id, epoch, "t", 0, 0, 1).unwrap(), Decision::Append);
    let (batch, mut entry) = t.journal_batch(id, epoch, "t", 0, 0, 1, 0, 0).unwrap();
    t.recorded(&batch);
    armed.store(true, Ordering::SeqCst);
    let err = t.journal_batch(id, epoch, "t", 0, 1, 1, 1, 1).unwrap_err();
    assert!(
        err.to_string().contains("zeroing its bytes failed too"),
        "{err}"
    );
    armed.store(false, Ordering::SeqCst);
    assert!(t.journal_batch(id, epoch, "t", 0, 1, 1, 1, 1).is_err());
    let fsyncs = t.fsyncs.load(Ordering::Relaxed);
    assert!(t.sync_to(2).is_err());
    t.sync_to(1).unwrap();
    t.sync_pending();
    assert!(entry.try_recv().unwrap().is_err());
    assert_eq!(t.fsyncs.load(Ordering::Relaxed), fsyncs);
}

/// A snapshot taken while a batch's entry is written and its records are being
/// written (between `journal_batch` and `recorded`) cuts that entry from the
/// journal: the snapshot keeps the batch, so if its records survive, a restart
/// answers its retry as a duplicate instead of writing it again.
#[test]
fn a_snapshot_keeps_a_batch_journalled_and_not_yet_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, e), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, e, 0, 2, 0), Decision::Append);
    assert_eq!(t.check(id, e, "t", 0, 2, 3).unwrap(), Decision::Append);
    let (batch, rx) = t.journal_batch(id, e, "t", 0, 2, 3, 2, 4).unwrap();
    durable(rx);
    // Another thread's snapshot, while the records are being written.
    t.snapshot().unwrap();
    t.recorded(&batch);
    // The process dies with the records written (they survive), before the next
    // journal entry.
    drop(t);
    let (t, _) = open(dir.path(), 5);
    assert_eq!(
        t.check(id, e, "t", 0, 2, 3).unwrap(),
        Decision::Duplicate {
            base_offset: 2,
            last_offset: 4
        }
    );
    // Its records did not survive: the batch is dropped, and its retry written.
    drop(t);
    let (t, report) = open(dir.path(), 2);
    assert!(report.iter().any(|l| l.contains("dropped 1")), "{report:?}");
    assert_eq!(t.check(id, e, "t", 0, 2, 3).unwrap(), Decision::Append);
}

/// The batches of a partition that was not opened (an offline topic) are kept as
/// they are, through the snapshot a dropped entry causes, for the start that opens
/// it; those of a partition that is gone are dropped.
#[test]
fn batches_of_a_partition_not_opened_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = open(dir.path(), 0);
    let ((id, epoch), rx) = t.init(None).unwrap();
    durable(rx);
    assert_eq!(write(&t, id, epoch, 0, 2, 0), Decision::Append);
    // A batch of another topic, gone at the next start.
    assert_eq!(t.check(id, epoch, "u", 0, 0, 1).unwrap(), Decision::Append);
    durable(t.accepted(id, epoch, "u", 0, 0, 1, 0, 0));
    drop(t);
    let reopen = || {
        ProducerTable::open(
            dir.path(),
            Arc::new(RealStorage),
            PRODUCER_ID_EXPIRATION_DEFAULT,
            &|topic, _| match topic {
                "t" => PartitionEnd::Unknown,
                _ => PartitionEnd::Gone,
            },
        )
        .unwrap()
    };
    let (t, report) = reopen();
    assert!(
        report.iter().any(|l| l.contains("dropped 1 entries")),
        "only u's batch is dropped: {report:?}"
    );
    drop(t);
    // Twice: the snapshot the dropped entry caused kept t's batch.
    let (t, _) = reopen();
    let (t, _) = {
        drop(t);
        open(dir.path(), 2)
    };
    assert_eq!(
        t.check(id, epoch, "t", 0, 0, 2).unwrap(),
        Decision::Duplicate {
            base_offset: 0,
            last_offset: 1
        }
    );
}
