//! Planning recovery: reads only, from the shared partition check; decides what each
//! problem needs (docs/FORMAT.md, Recovery, steps 1-5).

use super::*;

pub(super) fn damage_lines(
    root: &Path,
    label: &str,
    corrupt: &[Damage],
    not_joined: &[Problem],
) -> Vec<String> {
    let mut out = Vec::new();
    for d in corrupt {
        let bytes = d
            .bytes
            .map(|(f, t)| format!(" bytes {f}..{t} ({} bytes)", t - f))
            .unwrap_or_default();
        let offsets = match d.offsets {
            Some((a, Some(b))) if b >= a => format!(", offsets {a}..={b}"),
            Some((a, _)) => format!(", offsets from {a}"),
            None => String::new(),
        };
        out.push(format!(
            "{label}: left in place, cannot be read back: {}{bytes}{offsets}: {} ({})",
            relative(root, &d.problem.file),
            d.problem.detail,
            d.problem.kind
        ));
    }
    for p in not_joined {
        out.push(format!(
            "{label}: {}: {} ({}); nothing deleted",
            relative(root, &p.file),
            p.detail,
            p.kind
        ));
    }
    out
}

/// Plans recovery of every partition of `target`. Reads only.
pub fn plan(target: &Target) -> Result<RecoveryPlan, RecoveryError> {
    let mut partitions = Vec::with_capacity(target.partitions.len());
    for p in &target.partitions {
        partitions.push(plan_partition(p)?);
    }
    Ok(RecoveryPlan {
        root: target.root.clone(),
        partitions,
        topics: plan_topics(target),
    })
}

/// Plans recovery of one partition from the quick check. Reads only.
pub fn plan_partition(p: &PartitionRef) -> Result<PartitionPlan, RecoveryError> {
    let mut check =
        check_partition(p, CheckMode::Quick).map_err(|source| RecoveryError::Check {
            dir: p.dir.clone(),
            source,
        })?;
    let removed = never_durable_newest(&check);
    let active = check.segments.len().checked_sub(removed + 1);
    if let Some(seg) = active.and_then(|i| check.segments.get_mut(i)) {
        if removed > 0 && !seg.active {
            // Step 2: the segment before the removed ones becomes the active one, and
            // is checked as such (scanned in full), exactly as the next start would.
            let files = seg.files.clone();
            *seg = check_segment(&files, true, CheckMode::Quick, None).map_err(|source| {
                RecoveryError::Check {
                    dir: p.dir.clone(),
                    source,
                }
            })?;
        }
    }
    let mut plan = plan_from_check(&check);
    for a in &mut plan.actions {
        if let Action::CutTail {
            next_offset,
            kind: Some(ProblemKind::TornTail),
            records_cut,
            reason,
            ..
        } = a
        {
            let applied = raft_applied_index(p)
                .and_then(|applied| applied_entries_damaged(*next_offset, applied))
                .or_else(|| {
                    data_applied_next(p)
                        .and_then(|next| applied_records_damaged(*next_offset, next))
                });
            match applied {
                Some(said) => {
                    reason.push_str("; ");
                    reason.push_str(&said);
                }
                None if records_cut.is_none() => reason.push_str("; never acknowledged"),
                None => {}
            }
        }
    }
    Ok(plan)
}

/// How many of the newest segments never became durable: the newest one when its
/// header is shorter than 32 bytes, all zero or a spare's, else none. Only the newest
/// can be so (a roll starts only once the previous roll is durable, FORMAT, Segment
/// states); an earlier segment with such a header is damaged, and kept.
pub(super) fn never_durable_newest(check: &PartitionCheck) -> usize {
    if check.partition.only_segment.is_some() {
        return 0;
    }
    let mut newest_first = check.segments.iter().rev();
    let newest_never_durable = newest_first
        .next()
        .is_some_and(|s| s.active && never_durable_header(s.base_offset(), &s.header));
    // Two headerless segments are damage, not a crash: both are kept (removing the
    // newest would make the other look like an unfinished roll to the next run).
    let before_too = newest_first
        .next()
        .is_some_and(|s| never_durable_header(s.base_offset(), &s.header));
    usize::from(newest_never_durable && !before_too)
}

/// `DATA/spares` of a partition directory `DATA/topics/T/P`, when that directory
/// exists (the broker creates it when its spare pool is on).
fn spares_dir_of(partition_dir: &Path) -> Option<PathBuf> {
    let topics = partition_dir.parent()?.parent()?;
    if topics.file_name()? != crate::format::names::TOPICS_DIR {
        return None;
    }
    let spares = topics.parent()?.join(crate::format::names::SPARES_DIR);
    spares.is_dir().then_some(spares)
}

/// Builds the plan for one partition from its check (docs/FORMAT.md, Recovery). The
/// segment that becomes active after step 2 must have been checked as active.
pub(super) fn plan_from_check(check: &PartitionCheck) -> PartitionPlan {
    let p = &check.partition;
    let mut plan = PartitionPlan {
        partition: p.clone(),
        label: p.label(),
        dir: p.dir.clone(),
        actions: Vec::new(),
        next_offset: 0,
        corrupt: Vec::new(),
        not_joined: Vec::new(),
        refuses_writes: false,
        recheck_after_marker: false,
        severity_before: check.severity(),
    };

    // Step 1.
    if plan_marker_and_temp_files(check, &mut plan) {
        // What the swap leaves is planned after it is finished.
        plan.recheck_after_marker = true;
        plan.next_offset = check.next_offset().unwrap_or(0);
        return plan;
    }

    // Step 2: newest segments that never became durable are removed, newest first;
    // the one before becomes the active segment.
    let segs = &check.segments;
    let kept = segs.len() - never_durable_newest(check);
    for seg in segs.iter().skip(kept).rev() {
        let why = match &seg.header {
            Err(e) => e.to_string(),
            Ok(h) => format!(
                "the header still marks an unassigned spare (base_offset {}, generation {})",
                h.base_offset, h.generation
            ),
        };
        let reason = format!(
            "{why}: the newest segment never became durable, no record in it was acknowledged"
        );
        // A reused file still marked as a spare goes back to the pool, when the
        // partition is in a data directory that has one (FORMAT, Recovery step 4).
        let reused = matches!(&seg.header, Ok(h) if h.is_spare() && h.generation < u64::MAX);
        plan.actions.push(Action::RemoveNeverDurable {
            log: seg.files.log.clone(),
            index: seg.files.index.exists().then(|| seg.files.index.clone()),
            base_offset: seg.base_offset(),
            bytes: seg.file_len,
            to_spares: reused.then(|| spares_dir_of(&p.dir)).flatten(),
            reason,
        });
    }

    // Steps 3 and 4, per remaining segment; step 6 on the way.
    let kept_segs = segs.get(..kept).unwrap_or(&[]);
    let mut next_offset = 0u64;
    for (i, seg) in kept_segs.iter().enumerate() {
        let is_active = i + 1 == kept_segs.len();
        if is_active {
            next_offset = next_offset.max(seg.base_offset());
        }
        if let Some(last) = seg.last_offset {
            // A record at u64::MAX (only a damaged or crafted file holds one) leaves no
            // offset to append at.
            plan.refuses_writes |= last == u64::MAX;
            next_offset = next_offset.max(last.saturating_add(1));
        }
        // Segments tile: a segment's records end below the next one's base.
        let next_base = kept_segs.get(i + 1).map(SegmentCheck::base_offset);
        plan_segment(seg, is_active, next_base, &mut plan);
    }

    // Step 5: segments that do not join up are reported.
    plan.not_joined = check
        .problems
        .iter()
        .filter(|pr| pr.severity == Severity::Corrupt)
        .cloned()
        .collect();

    // Step 6.
    plan.next_offset = next_offset;
    plan
}

/// Step 1 without a marker to finish: temporary files (and an unparseable marker)
/// and the orphan indexes below the first segment (retention's leftovers, step 5) or
/// after the newest (a roll that never became durable) are removed; an index without
/// its log between them marks a lost segment and is kept. Returns true when a marker parses: its swap is
/// finished first and the rest planned after it.
pub(super) fn plan_marker_and_temp_files(check: &PartitionCheck, plan: &mut PartitionPlan) -> bool {
    let temp_reason = match &check.marker {
        Some((path, Ok(marker))) => {
            plan.actions.push(Action::FinishCompaction {
                marker_path: path.clone(),
                marker: marker.clone(),
            });
            return true;
        }
        Some(_) => "temporary file of a compaction swap that never started",
        None => "leftover temporary file with no compaction marker",
    };
    for tmp in &check.temp_files {
        plan.actions.push(Action::RemoveTempFile {
            path: tmp.clone(),
            bytes: file_len(tmp),
            reason: temp_reason.into(),
        });
    }
    // The marker after its temporary files: a crash in between leaves a marker that
    // still does not parse, so the next run ends the same way.
    if let Some((path, Err(e))) = &check.marker {
        plan.actions.push(Action::RemoveMarker {
            path: path.clone(),
            bytes: file_len(path),
            reason: format!("{e}: the swap never started"),
        });
    }
    for idx in &check.orphan_indexes {
        plan.actions.push(Action::RemoveOrphanIndex {
            path: idx.clone(),
            bytes: file_len(idx),
        });
    }
    false
}

/// Steps 3 and 4 for one segment that stays. `next_base` is the base offset of the
/// segment after it, if any.
pub(super) fn plan_segment(
    seg: &SegmentCheck,
    is_active: bool,
    next_base: Option<u64>,
    plan: &mut PartitionPlan,
) {
    let lost_to = next_base.map(|n| n.saturating_sub(1));
    let header_ok = matches!(&seg.header, Ok(h) if h.base_offset == seg.base_offset());
    if !header_ok {
        // An invalid header (other than never durable on the newest): left in place.
        for pr in seg
            .problems
            .iter()
            .filter(|pr| pr.severity == Severity::Corrupt)
        {
            plan.corrupt.push(Damage {
                problem: pr.clone(),
                bytes: Some((0, seg.file_len)),
                offsets: Some((seg.base_offset(), lost_to)),
            });
        }
        plan.refuses_writes |= is_active;
        return;
    }
    let Some(scan) = &seg.scan else {
        // Trusted by its index: nothing to do.
        return;
    };
    if let Some(end) = scan.end.position() {
        let tail_problem = seg
            .problems
            .iter()
            .find(|pr| pr.file == seg.files.log && pr.position == Some(end));
        let kind = tail_problem.map(|pr| pr.kind);
        // The records before the damage (the check counts those after a resync too).
        let next_offset = scan
            .last_offset
            .map_or(seg.base_offset(), |o| o.saturating_add(1));
        let step = tail_step(seg.active, kind, &scan.end);
        if let TailStep::Cut { reason } = step {
            plan.actions.push(Action::CutTail {
                log: seg.files.log.clone(),
                from: end,
                to: seg.file_len,
                next_offset,
                kind,
                records_cut: tail_problem.and_then(|pr| pr.behind.as_deref().copied()),
                reason,
            });
        } else if step == TailStep::KeepZeros {
            // Zeros end the data for every reader; appends overwrite them.
        } else if step == TailStep::TrimSeal {
            plan.actions.push(Action::TrimSeal {
                log: seg.files.log.clone(),
                from: end,
                to: seg.file_len,
                reason: tail_problem.map_or_else(String::new, |pr| pr.detail.clone()),
            });
        } else {
            // Each damaged range hides only the records it touches: reading resumes
            // where the check's resync found the next record (FORMAT, Reading around
            // damage).
            for pr in seg
                .problems
                .iter()
                .filter(|pr| pr.severity == Severity::Corrupt)
            {
                let (bytes, offsets) = match &pr.unreadable {
                    Some(r) => ((r.first_position, r.end_position), r.lost_offsets()),
                    None => ((end, seg.file_len), Some((next_offset, lost_to))),
                };
                plan.corrupt.push(Damage {
                    problem: pr.clone(),
                    bytes: Some(bytes),
                    offsets,
                });
            }
            // Records appended after unreadable bytes could never be read back.
            plan.refuses_writes |= is_active;
        }
    }
    let reason = match &seg.index {
        IndexState::Missing => Some("the index is missing".to_string()),
        IndexState::Invalid(e) => Some(e.to_string()),
        IndexState::Valid | IndexState::NotChecked => None,
    };
    if let Some(reason) = reason {
        plan.actions.push(Action::RebuildIndex {
            log: seg.files.log.clone(),
            index: seg.files.index.clone(),
            base_offset: seg.base_offset(),
            entries: scan.index.clone(),
            reason,
        });
    }
}

/// What step 4 does with the bytes after a segment's valid data.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TailStep {
    /// The active segment's tail: never acknowledged, cut.
    Cut { reason: String },
    /// A sealed segment's unfinished seal: cut.
    TrimSeal,
    /// The active segment's zeroed (preallocated) tail: kept.
    KeepZeros,
    /// Damage in a sealed segment: left in place for an operator.
    LeaveDamaged,
}

/// Step 4, decided by the problem the check reported where the valid data ends
/// (`None`: it reported none there). A new kind of problem must be placed here.
pub(super) fn tail_step(active: bool, kind: Option<ProblemKind>, end: &ScanEnd) -> TailStep {
    use ProblemKind as K;
    let other = || {
        if active {
            TailStep::Cut {
                reason: end.detail(),
            }
        } else {
            TailStep::LeaveDamaged
        }
    };
    let Some(kind) = kind else {
        return other();
    };
    match kind {
        // "Never acknowledged" is added once the plan knows no valid record follows.
        K::TornTail if active => TailStep::Cut {
            reason: end.detail(),
        },
        // All zeros to the end of the file (a zero run followed by anything else is a
        // torn tail): preallocated space, never a record, kept.
        K::ZeroTail if active => TailStep::KeepZeros,
        K::StaleTail if active => TailStep::Cut {
            reason: "records of an older generation after the data".to_string(),
        },
        K::UnfinishedSeal if !active => TailStep::TrimSeal,
        // Damage after a sealed segment's data.
        K::SealedZeroRun
        | K::TornRecord
        | K::ImplausibleLength
        | K::BadKeyLen
        | K::BadValueLen
        | K::CrcMismatch
        | K::StaleGeneration
        | K::TooLarge
        | K::OffsetOutOfOrder
        // The tail kinds of the other segment state.
        | K::TornTail
        | K::ZeroTail
        | K::StaleTail
        | K::UnfinishedSeal
        // Not reported where a segment's data ends.
        | K::TopicJsonMissing
        | K::TopicJsonUnreadable
        | K::PartitionOutsideCount
        | K::PartitionDirMissing
        | K::SchemasJsonUnreadable
        | K::KeysJsonUnreadable
        | K::ClusterJsonUnreadable
        | K::RaftStateUnreadable
        | K::AppliedRecordsMissing
        | K::AppliedCheckpointMissing
        | K::UnfinishedCompaction
        | K::LeftoverTempFile
        | K::OrphanIndex
        | K::LostSegment
        | K::UnknownFile
        | K::SegmentsOverlap
        | K::SegmentsDoNotJoin
        | K::BaseOffsetMismatch
        | K::NeverDurableSegment
        | K::ShortHeader
        | K::ZeroHeader
        | K::BadHeader
        | K::MissingIndex
        | K::PartialIndexEntry
        | K::IndexNotIncreasing
        | K::IndexPastData
        | K::WrongIndexEntry
        | K::WrongIndexLength
        | K::GroupFileUnreadable
        | K::GroupMembershipRefused
        | K::JournalTornTail
        | K::JournalCorrupt
        | K::BadSpareHeader => other(),
    }
}
