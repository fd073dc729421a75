//! How many records a segment holds and whether it reads to its end: the figures
//! `topics describe` shows. The active segment's count is kept by appends (from the
//! scan at open); a sealed segment is counted once, by a scan through a map of its
//! file (the sealed bytes never change), and the answer is kept with the segment.
//! Compacted segments have gaps between their offsets, so a count is never derived
//! from offsets.

use super::*;
use crate::engine::storage::map::SealedMap;
use crate::engine::storage::reader::Next;

/// A segment's record count and the first damage its scan met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SegmentTally {
    /// Records that can be read (before and after damage).
    pub(super) records: u64,
    pub(super) damage: Option<read::SegmentDamage>,
}

impl Segment {
    /// The record count of the active segment, kept by appends.
    pub(super) fn active_tally(&self) -> SegmentTally {
        SegmentTally {
            records: self.records.load(Ordering::Acquire),
            damage: None,
        }
    }

    /// Marks a segment sealed by this process: its count is the appends' count and it
    /// reads to its end.
    pub(super) fn seal_tally(&self) {
        let mut t = self.tally.write().unwrap_or_else(PoisonError::into_inner);
        if t.is_none() {
            *t = Some(None);
        }
    }

    /// The tally of a *sealed* segment: counted by the first call (a scan that
    /// resynchronises after damage, bounded by `next_base`), kept after.
    pub(super) fn sealed_tally(&self, next_base: Option<u64>) -> Result<SegmentTally, EngineError> {
        let kept = self
            .tally
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(damage) = kept {
            return Ok(SegmentTally {
                records: self.records.load(Ordering::Acquire),
                damage,
            });
        }
        let (records, damage) = self
            .count(next_base, &mut |_| true)?
            .unwrap_or((self.records.load(Ordering::Acquire), None));
        let mut t = self.tally.write().unwrap_or_else(PoisonError::into_inner);
        let damage = match &*t {
            // Another caller counted it meanwhile: its answer stands.
            Some(d) => d.clone(),
            None => {
                self.records.store(records, Ordering::Release);
                *t = Some(damage.clone());
                damage
            }
        };
        Ok(SegmentTally {
            records: self.records.load(Ordering::Acquire),
            damage,
        })
    }

    /// Reads a *sealed* segment through once more (the background scrub), bounded by
    /// `next_base`, and keeps what it found as the segment's tally: damage that
    /// appeared on the disk since the segment was first counted shows in `topics
    /// describe`. `pace` is told the bytes read so far every [`PACE_EVERY`] bytes
    /// and may stop the read (false): then `Ok(None)` and the tally is unchanged.
    pub fn rescan(
        &self,
        next_base: Option<u64>,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<Option<Option<FoundDamage>>, EngineError> {
        let Some((records, damage)) = self.count(next_base, pace)? else {
            return Ok(None);
        };
        let found = damage.as_ref().map(|d| FoundDamage {
            first: d.first,
            line: damage_line(&self.path, d),
        });
        let mut t = self.tally.write().unwrap_or_else(PoisonError::into_inner);
        self.records.store(records, Ordering::Release);
        *t = Some(damage);
        Ok(Some(found))
    }

    /// Counts the records of this sealed segment and finds its first damage, reading
    /// through a map of its file; `None` when `pace` stopped the read.
    fn count(
        &self,
        next_base: Option<u64>,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<Option<(u64, Option<read::SegmentDamage>)>, EngineError> {
        let io_err = |e| EngineError::io(format!("reading {}", self.path.display()), e);
        let len = self.bytes();
        let file = self.file().map_err(io_err)?;
        // The map goes through a handle of its own, so the shared lock a map takes
        // (storage/map.rs) ends with this scan; only when the name still is this
        // segment's file (compaction renames new files over old names).
        // A file shorter than the segment (cut under the broker by something else)
        // is read with positional reads, which see the short file as damage, never
        // through a map, whose pages past the end would fault.
        let own = File::open(&self.path)
            .ok()
            .filter(|own| same_file(own, &file))
            .filter(|own| own.metadata().is_ok_and(|m| m.len() >= len));
        let map = own.as_ref().and_then(|f| SealedMap::sealed(f, len));
        let counted = count_records(&file, map.as_ref(), self, len, next_base, pace);
        drop(map);
        match counted {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(io_err(e)),
        }
    }
}

/// How often (in bytes read) a counting scan tells its `pace`.
pub const PACE_EVERY: u64 = 1 << 20;

/// Damage a scan of a sealed segment met: its first unreadable offset, and the line
/// `topics describe` shows for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundDamage {
    pub first: u64,
    pub line: String,
}

/// `<segment>: unreadable from offset F, next readable offset N (detail)`.
fn damage_line(path: &Path, d: &read::SegmentDamage) -> String {
    let next = d.next.map_or_else(|| "none".to_string(), |n| n.to_string());
    format!(
        "{}: unreadable from offset {}, next readable offset {next} ({})",
        path.display(),
        d.first,
        d.detail
    )
}

/// True when both handles are of the same file (device and inode).
fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Counts the records of a sealed segment from its header to `len`. After damage
/// the scan resumes where [`resync`] finds the next record; the first damage is
/// returned with the offsets it makes unreadable. `pace` is told the position every
/// [`PACE_EVERY`] bytes; when it says stop, the count ends with `Interrupted`.
fn count_records(
    file: &File,
    map: Option<&SealedMap>,
    seg: &Segment,
    len: u64,
    next_base: Option<u64>,
    pace: &mut dyn FnMut(u64) -> bool,
) -> io::Result<(u64, Option<read::SegmentDamage>)> {
    let mut start = HEADER_LEN as u64;
    let mut told = start;
    let mut records = 0u64;
    let mut last: Option<u64> = None;
    let mut first_damage = None;
    // Each pass ends at the end of the data or at damage, and the next one starts
    // past that damage: at most one pass per byte of the file.
    loop {
        let mut reader = RecordReader::sealed(file, map, seg.generation, start, len);
        let end = loop {
            match reader.next_record()? {
                Next::Record { position, record } => {
                    let in_order = match last {
                        Some(prev) => record.offset > prev,
                        None => record.offset >= seg.base_offset,
                    };
                    if !in_order {
                        break Some((
                            position,
                            format!(
                                "record at position {position} has offset {} out of order",
                                record.offset
                            ),
                        ));
                    }
                    records += 1;
                    last = Some(record.offset);
                    if position >= told + PACE_EVERY {
                        told = position;
                        if !pace(position) {
                            return Err(io::Error::new(
                                io::ErrorKind::Interrupted,
                                "the scan was stopped",
                            ));
                        }
                    }
                }
                Next::End(None) => break None,
                Next::End(Some(e)) => break Some((e.position(), e.to_string())),
            }
        };
        let Some((position, detail)) = end else {
            // Segments tile the offsets: a sealed segment that reads to its end
            // without reaching the next one's base leaves offsets in no segment.
            let reached = last.map_or(seg.base_offset, |o| o.saturating_add(1));
            if let Some(nb) = next_base.filter(|nb| first_damage.is_none() && reached < *nb) {
                first_damage = Some(read::SegmentDamage {
                    first: reached,
                    next: Some(nb),
                    detail: format!(
                        "the segment ends before offset {reached} and the next one starts at {nb}: no segment holds the offsets between"
                    ),
                });
            }
            return Ok((records, first_damage));
        };
        let first = last.map_or(seg.base_offset, |o| o.saturating_add(1));
        let found = resync(
            file,
            seg.generation,
            position.saturating_add(1),
            len,
            first,
            next_base,
        )?;
        if first_damage.is_none() {
            first_damage = Some(read::SegmentDamage {
                first,
                next: found.map(|r| r.offset).or(next_base),
                detail: format!("position {position}: {detail}"),
            });
        }
        match found {
            Some(r) if r.position > position => start = r.position,
            _ => return Ok((records, first_damage)),
        }
    }
}

/// What `topics describe` shows of a log's data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogHealth {
    /// Durable records that can be read, summed over the segments (records written
    /// but not yet fsynced are not counted: no consumer can read them yet).
    pub records: u64,
    /// One line per damaged range (a sealed segment that does not read to its end,
    /// a lost segment), in offset order.
    pub damage: Vec<String>,
}

impl PartitionLog {
    /// Counts the log's durable records (what a consumer can read: `end_offset` in
    /// `topics describe` is the durable end) and lists its damage. A sealed segment
    /// is scanned the first time only; a segment that cannot be read is named as
    /// damage.
    pub fn health(&self) -> LogHealth {
        // The segment list, the active segment's count and the offsets not yet
        // durable are taken together under the write lock (appends change all three
        // under it). Records at or past `durable_end` are all in the newest segments
        // (written since the last fsync, never compacted), one per offset.
        let (segs, active_records, unflushed) = {
            let w = lock(&self.write);
            let durable_end = lock(&self.sync).durable_end;
            let segs = self.snapshot();
            let active = segs.last().map_or(0, |s| s.active_tally().records);
            (segs, active, w.next_offset.saturating_sub(durable_end))
        };
        let start = segs.first().map_or(0, |s| s.base_offset);
        let lost = self
            .lost
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut lines: Vec<(u64, String)> = lost
            .iter()
            .filter(|l| l.next > start)
            .map(|l| {
                (
                    l.first,
                    format!(
                        "offsets {}..={} lost: {} has no .log",
                        l.first,
                        l.next.saturating_sub(1),
                        l.index.display()
                    ),
                )
            })
            .collect();
        let mut records = 0u64;
        for (i, seg) in segs.iter().enumerate() {
            let next_base = segs.get(i + 1).map(|s| s.base_offset);
            let tally = if next_base.is_none() {
                Ok(SegmentTally {
                    records: active_records,
                    damage: None,
                })
            } else {
                seg.sealed_tally(next_base)
            };
            match tally {
                Ok(t) => {
                    records = records.saturating_add(t.records);
                    // A lost segment whose index is left is named once, by its index.
                    let named_lost =
                        |d: &read::SegmentDamage| lost.iter().any(|l| l.first == d.first);
                    if let Some(d) = t.damage.filter(|d| !named_lost(d)) {
                        lines.push((d.first, damage_line(&seg.path, &d)));
                    }
                }
                Err(e) => lines.push((seg.base_offset, e.to_string())),
            }
        }
        lines.sort();
        LogHealth {
            records: records.saturating_sub(unflushed),
            damage: lines.into_iter().map(|(_, l)| l).collect(),
        }
    }
}
