//! The read path: durable records only, read by the storage's one record reader
//! (large positional windows) through the segment's own file handle. Damage in a
//! segment hides nothing before it: a fetch returns the records before damaged ones,
//! and only a fetch starting inside the damaged range gets an error naming it. A
//! lost segment (found at open) is the same: a fetch stops before it, and one
//! starting at its offsets is told the range missing.

use super::*;

/// What [`PartitionLog::read_as`] read: the chunks or the spans, and the last offset.
type ReadOut = (Vec<FetchChunk>, Vec<FetchSpan>, Option<u64>);

/// Read window of a streamed fetch ([`PartitionLog::fetch_spans`]): its records are
/// validated a cache-sized piece at a time, whatever the fetch's size.
const SPAN_WINDOW_BYTES: usize = 256 << 10;

// ----- the read path -----

/// What one fetch returns from a log.
#[derive(Debug)]
pub struct LogFetch {
    pub chunks: Vec<FetchChunk>,
    pub start_offset: u64,
    pub end_offset: u64,
}

/// What one fetch returns from a log as file ranges ([`PartitionLog::fetch_spans`]).
#[derive(Debug)]
pub struct LogFetchSpans {
    pub spans: Vec<FetchSpan>,
    pub start_offset: u64,
    pub end_offset: u64,
}

/// Whole records of one segment, validated, as a range of its file: what a
/// [`FetchChunk`] would hold, left on disk (page cache) until it is sent. It keeps
/// the segment and its open file, so the bytes stay those that were validated:
/// retention and compaction leave a segment a reader holds alone (it is never made a
/// spare), and a removed file stays readable through the handle.
#[derive(Debug)]
pub struct FetchSpan {
    segment: Arc<Segment>,
    file: Arc<File>,
    /// The segment's generation: decode with `format::decode_record(bytes, _, generation)`.
    pub generation: u64,
    /// Position of the first record in the file.
    pub from: u64,
    /// Bytes of the records, back to back from `from`.
    pub len: u64,
    /// How many records.
    pub records: u64,
}

impl FetchSpan {
    /// Reads the span's bytes from `at` (relative to the span's start) into `buf`,
    /// filling it or up to the span's end; returns the bytes read. A file shorter
    /// than the validated range is an error (`UnexpectedEof`).
    pub fn read_at(&self, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        let want = usize::try_from(self.len.saturating_sub(at))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let dst = buf.get_mut(..want).unwrap_or_default();
        let pos = self.from.saturating_add(at);
        std::os::unix::fs::FileExt::read_exact_at(&*self.file, dst, pos).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("reading {} at {pos}: {e}", self.segment.path.display()),
            )
        })?;
        Ok(want)
    }

    /// Sends up to `max` of the span's bytes from `at` (relative to the span's start)
    /// straight from the file to `socket` (`sendfile`: no copy through user space);
    /// returns the bytes sent. A full non-blocking socket gives `WouldBlock`; a file
    /// shorter than the validated range is an error (`UnexpectedEof`).
    pub fn send_at(
        &self,
        at: u64,
        socket: std::os::fd::BorrowedFd<'_>,
        max: usize,
    ) -> io::Result<usize> {
        let want = usize::try_from(self.len.saturating_sub(at))
            .unwrap_or(usize::MAX)
            .min(max);
        if want == 0 {
            return Ok(0);
        }
        let mut pos = self.from.saturating_add(at);
        match rustix::fs::sendfile(socket, &*self.file, Some(&mut pos), want) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} ends before its records sent at {pos}",
                    self.segment.path.display()
                ),
            )),
            Ok(n) => Ok(n),
            Err(e) => Err(e.into()),
        }
    }
}

impl PartitionLog {
    /// Durable records from `offset`, at most `max_bytes` of them (at least one whole
    /// record if one exists), waiting up to `max_wait` when `offset` is the durable end.
    pub fn fetch(
        &self,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetch, EngineError> {
        let (start, end) = self.wait_for_data(offset, max_wait)?;
        let mut fetched = LogFetch {
            chunks: Vec::new(),
            start_offset: start,
            end_offset: end,
        };
        if offset >= end {
            return Ok(fetched);
        }
        let (chunks, _, last) = self.read_as(offset, max_bytes.min(FETCH_BYTES_MAX), false)?;
        fetched.chunks = chunks;
        if let Some(last) = last {
            // The readable ends may already show a newer fsync than `end` did.
            fetched.end_offset = fetched.end_offset.max(last.saturating_add(1));
        }
        Ok(fetched)
    }

    /// [`PartitionLog::fetch`] without the bytes: the same records, validated the
    /// same way (whole, CRC, below the durable end) through a cache-sized window, as
    /// file ranges of their segments, for the caller to stream out of the file a
    /// slice at a time (the bytes of a large fetch then never sit in memory at once).
    pub fn fetch_spans(
        &self,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetchSpans, EngineError> {
        let (start, end) = self.wait_for_data(offset, max_wait)?;
        let mut fetched = LogFetchSpans {
            spans: Vec::new(),
            start_offset: start,
            end_offset: end,
        };
        if offset >= end {
            return Ok(fetched);
        }
        let (_, spans, last) = self.read_as(offset, max_bytes.min(FETCH_BYTES_MAX), true)?;
        fetched.spans = spans;
        if let Some(last) = last {
            fetched.end_offset = fetched.end_offset.max(last.saturating_add(1));
        }
        Ok(fetched)
    }

    /// Checks `offset` against the log's range, then waits (no spinning) until a record
    /// at `offset` is durable, `max_wait` passes, or the log closes. Returns (start, end).
    pub(super) fn wait_for_data(
        &self,
        offset: u64,
        max_wait: Duration,
    ) -> Result<(u64, u64), EngineError> {
        let deadline = Instant::now().checked_add(max_wait);
        let mut s = lock(&self.sync);
        loop {
            if s.closed == Some(Closed::Deleted) {
                return Err(self.closed_error(Closed::Deleted));
            }
            let start = self.start_offset();
            if offset < start || offset > s.durable_end {
                return Err(EngineError::OffsetOutOfRange {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    offset,
                    start,
                    end: s.durable_end,
                });
            }
            let now = Instant::now();
            let left = deadline.map_or(max_wait, |d| d.saturating_duration_since(now));
            if offset < s.durable_end || s.closed.is_some() || left.is_zero() {
                return Ok((start, s.durable_end));
            }
            s = self
                .synced
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Reads whole records from `offset` across segments, within `budget` bytes (but
    /// at least one record), as chunks of bytes, or (`spans`) as validated file
    /// ranges: the same records, damage and missing ranges either way. Returns the
    /// chunks or the spans, and the last offset read.
    fn read_as(&self, offset: u64, budget: u32, spans: bool) -> Result<ReadOut, EngineError> {
        let segs = self.snapshot();
        let mut i = segs
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        let mut left = u64::from(budget);
        let mut chunks = Vec::new();
        let mut ranges = Vec::new();
        let mut next = offset;
        let mut last = None;
        while let Some(seg) = segs.get(i) {
            if let Some(l) = self.lost_before(seg, next) {
                if last.is_some() {
                    // The records before the lost segment are this fetch's answer.
                    break;
                }
                return Err(EngineError::RecordsMissing {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    index: Some(l.index.clone()),
                    first: l.first,
                    next: l.next,
                });
            }
            let next_base = segs.get(i + 1).map(|s| s.base_offset);
            let out = read_segment_around(seg, next, left, last.is_none(), next_base, spans)?;
            let damaged = out.damage.is_some();
            if let Some(d) = out.damage.filter(|_| out.last_offset.is_none()) {
                if last.is_some() {
                    // The records before the damage are this fetch's answer.
                    break;
                }
                return Err(EngineError::RecordsDamaged {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    path: seg.path.clone(),
                    first: d.first,
                    next: d.next,
                    detail: d.detail,
                });
            }
            if let Some(l) = out.last_offset {
                left = left.saturating_sub(out.len);
                next = l + 1;
                last = Some(l);
                match (out.span, spans) {
                    (Some((from, len)), true) => ranges.push(FetchSpan {
                        segment: Arc::clone(seg),
                        file: out.file,
                        generation: seg.generation,
                        from,
                        len,
                        records: out.records,
                    }),
                    _ => chunks.push(FetchChunk {
                        generation: seg.generation,
                        bytes: out.bytes,
                    }),
                }
            }
            if out.budget_hit || damaged {
                break;
            }
            // Segments tile the offsets (docs/FORMAT.md): a sealed segment read to its
            // end reaches the next one's base, compacted or not (compaction keeps a
            // segment's last record). Offsets short of it are in no segment left.
            if let (Some(nb), Some(following)) = (next_base, segs.get(i + 1)) {
                let reached = out.last_offset.map_or(next, |l| l + 1).max(next);
                if reached < nb && self.lost_before(following, reached).is_none() {
                    if last.is_some() {
                        break;
                    }
                    return Err(EngineError::RecordsMissing {
                        topic: self.topic.clone(),
                        partition: self.partition,
                        index: None,
                        first: reached,
                        next: nb,
                    });
                }
            }
            i += 1;
        }
        Ok((chunks, ranges, last))
    }
}

impl PartitionLog {
    /// The lost segment just below `seg` that a read at `next` would cross into `seg`
    /// over (gaps inside a compacted segment are not lost segments).
    fn lost_before(&self, seg: &Segment, next: u64) -> Option<LostSegment> {
        self.lost
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|l| l.next == seg.base_offset && next < l.next)
            .cloned()
    }
}

/// Records read from one segment.
pub(super) struct SegmentRead {
    /// The records' bytes (empty when only measured).
    pub(super) bytes: Vec<u8>,
    /// The records' bytes in all, copied or measured.
    pub(super) len: u64,
    /// Measured only: where the records lie in the file, (first position, bytes).
    pub(super) span: Option<(u64, u64)>,
    /// Measured only: how many records.
    pub(super) records: u64,
    /// The handle the records were read through.
    pub(super) file: Arc<File>,
    pub(super) last_offset: Option<u64>,
    /// Stopped because the next record did not fit the budget.
    pub(super) budget_hit: bool,
    /// Stopped at damage: the records before it are in `bytes`.
    pub(super) damage: Option<SegmentDamage>,
}

/// Records of a segment that cannot be read: from `first` up to `next`, the offset
/// where reading resumes (`None`: no record follows in the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SegmentDamage {
    pub(super) first: u64,
    pub(super) next: Option<u64>,
    pub(super) detail: String,
}

/// [`read_segment_around`] with no next segment known.
#[cfg(test)]
pub(super) fn read_segment(
    seg: &Segment,
    offset: u64,
    budget: u64,
    take_one: bool,
) -> Result<SegmentRead, EngineError> {
    read_segment_around(seg, offset, budget, take_one, None, false)
}

/// Reads whole records with offsets ≥ `offset` from one segment, up to its readable
/// end: index lookup, then the storage's record reader from the entry, through the
/// segment's own file handle, in reads of about the budget.
///
/// Damage does not hide the records before it: they are returned with the damage
/// noted. When no record at or after `offset` precedes the damage, the reader
/// resynchronises after it ([`resync`], bounded by `next_base`, the next segment's
/// base): if `offset` lies beyond the resync point the read goes on from there,
/// otherwise `offset` is in the damaged range and the damage is all it returns.
///
/// With `measure`, the records are validated the same way through a cache-sized
/// window and not copied: the result names their file range instead.
pub(super) fn read_segment_around(
    seg: &Segment,
    offset: u64,
    budget: u64,
    take_one: bool,
    next_base: Option<u64>,
    measure: bool,
) -> Result<SegmentRead, EngineError> {
    let limit = seg.readable_end.load(Ordering::Acquire);
    let rel = offset.saturating_sub(seg.base_offset);
    let entry = lookup(
        &seg.index.read().unwrap_or_else(PoisonError::into_inner),
        rel,
    );
    let mut start = entry
        .map_or(HEADER_LEN as u64, |e| e.position)
        .max(HEADER_LEN as u64);
    // Where the index sent the reader, until the record found there confirms it.
    let mut from_index = (start > HEADER_LEN as u64).then_some(start);
    // The first offset the reader may meet: the entry's, else the base.
    let mut first_possible = entry.map_or(seg.base_offset, |e| {
        seg.base_offset.saturating_add(e.relative_offset)
    });
    let read_bytes = (budget + INDEX_INTERVAL_BYTES).max(FETCH_READ_MIN_BYTES);
    let window = if measure {
        SPAN_WINDOW_BYTES
    } else {
        usize::try_from(read_bytes).unwrap_or(usize::MAX)
    };
    let file = seg
        .file()
        .map_err(|e| EngineError::io(format!("opening {}", seg.path.display()), e))?;
    let io_err = |e| EngineError::io(format!("reading {}", seg.path.display()), e);
    loop {
        let mut reader = RecordReader::with_window(&file, seg.generation, start, limit, window)
            .strict_limit()
            .with_buffer(buffers::take());
        let mut bytes = Vec::new();
        let mut span = None;
        let mut records = 0;
        let copied = if measure {
            reader.measure_records(offset, budget, take_one).map(|m| {
                (span, records) = (m.span, m.records);
                m.copied
            })
        } else {
            bytes = buffers::take();
            bytes.clear();
            reader.copy_records(offset, budget, take_one, &mut bytes)
        };
        let file_short = reader.file_short();
        buffers::give(reader.into_buffer());
        let copied = copied.map_err(io_err)?;
        if let Some(at) = from_index.take() {
            // The startup check trusts an index by its first and last entries; an
            // entry in between that does not point at the record it names (damage
            // to the index file) would skip records silently or fake damage. The
            // first record read tells: else the segment is read from its start.
            if copied.first_seen != Some(first_possible) {
                tracing::warn!(
                    segment = %seg.path.display(),
                    position = at,
                    "an index entry does not point at the record it names ({first_possible}); \
                     reading the segment from its start (`seglog reindex` rebuilds the index)"
                );
                start = HEADER_LEN as u64;
                first_possible = seg.base_offset;
                continue;
            }
        }
        let len = span.map_or(bytes.len() as u64, |(_, l)| l);
        if file_short {
            return Err(EngineError::Corrupt {
                path: seg.path.clone(),
                detail: format!("file ends before its durable data does ({limit} bytes)"),
            });
        }
        let Some(end) = copied.end else {
            return Ok(SegmentRead {
                bytes,
                len,
                span,
                records,
                file,
                last_offset: copied.last_offset,
                budget_hit: copied.budget_hit,
                damage: None,
            });
        };
        let first = copied
            .last_seen
            .map_or(first_possible, |o| o.saturating_add(1));
        if copied.last_offset.is_some() {
            return Ok(SegmentRead {
                bytes,
                len,
                span,
                records,
                file,
                last_offset: copied.last_offset,
                budget_hit: copied.budget_hit,
                damage: Some(SegmentDamage {
                    first,
                    next: None,
                    detail: end.to_string(),
                }),
            });
        }
        let found = resync(
            &file,
            seg.generation,
            end.position().saturating_add(1),
            limit,
            first,
            next_base,
        )
        .map_err(io_err)?;
        if let Some(r) = found.filter(|r| r.offset <= offset) {
            // `offset` lies after the damage: read on from where records resume.
            start = r.position;
            first_possible = r.offset;
            continue;
        }
        let next = found.map(|r| r.offset).or(next_base);
        return Ok(SegmentRead {
            bytes,
            len,
            span,
            records,
            file,
            last_offset: copied.last_offset,
            budget_hit: copied.budget_hit,
            damage: Some(SegmentDamage {
                first,
                next,
                detail: end.to_string(),
            }),
        });
    }
}
