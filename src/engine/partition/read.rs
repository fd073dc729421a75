//! The read path: durable records only, read by the storage's one record reader
//! (large positional windows) through the segment's own file handle.

use super::*;

// ----- the read path -----

/// What one fetch returns from a log.
#[derive(Debug)]
pub struct LogFetch {
    pub chunks: Vec<FetchChunk>,
    pub start_offset: u64,
    pub end_offset: u64,
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
        let (chunks, last) = self.read(offset, max_bytes.min(FETCH_BYTES_MAX))?;
        fetched.chunks = chunks;
        if let Some(last) = last {
            // The readable ends may already show a newer fsync than `end` did.
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
    /// at least one record). Returns the chunks and the last offset read.
    pub(super) fn read(
        &self,
        offset: u64,
        budget: u32,
    ) -> Result<(Vec<FetchChunk>, Option<u64>), EngineError> {
        let segs = self.snapshot();
        let mut i = segs
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        let mut left = u64::from(budget);
        let mut chunks = Vec::new();
        let mut next = offset;
        let mut last = None;
        while let Some(seg) = segs.get(i) {
            let out = read_segment(seg, next, left, chunks.is_empty())?;
            if let Some(l) = out.last_offset {
                left = left.saturating_sub(out.bytes.len() as u64);
                next = l + 1;
                last = Some(l);
                chunks.push(FetchChunk {
                    generation: seg.generation,
                    bytes: out.bytes,
                });
            }
            if out.budget_hit {
                break;
            }
            i += 1;
        }
        Ok((chunks, last))
    }
}

/// Records read from one segment.
pub(super) struct SegmentRead {
    pub(super) bytes: Vec<u8>,
    pub(super) last_offset: Option<u64>,
    /// Stopped because the next record did not fit the budget.
    pub(super) budget_hit: bool,
}

/// Reads whole records with offsets ≥ `offset` from one segment, up to its readable
/// end: index lookup, then the storage's record reader from the entry, through the
/// segment's own file handle, in reads of about the budget.
pub(super) fn read_segment(
    seg: &Segment,
    offset: u64,
    budget: u64,
    take_one: bool,
) -> Result<SegmentRead, EngineError> {
    let limit = seg.readable_end.load(Ordering::Acquire);
    let rel = offset.saturating_sub(seg.base_offset);
    let entry = lookup(
        &seg.index.read().unwrap_or_else(PoisonError::into_inner),
        rel,
    );
    let start = entry
        .map_or(HEADER_LEN as u64, |e| e.position)
        .max(HEADER_LEN as u64);
    let read_bytes = (budget + INDEX_INTERVAL_BYTES).max(FETCH_READ_MIN_BYTES);
    let window = usize::try_from(read_bytes).unwrap_or(usize::MAX);
    let file = seg
        .file()
        .map_err(|e| EngineError::io(format!("opening {}", seg.path.display()), e))?;
    let mut reader =
        RecordReader::with_window(&file, seg.generation, start, limit, window).strict_limit();
    let mut bytes = Vec::new();
    let copied = reader
        .copy_records(offset, budget, take_one, &mut bytes)
        .map_err(|e| EngineError::io(format!("reading {}", seg.path.display()), e))?;
    let corrupt = |detail: String| EngineError::Corrupt {
        path: seg.path.clone(),
        detail,
    };
    if reader.file_short() {
        return Err(corrupt(format!(
            "file ends before its durable data does ({limit} bytes)"
        )));
    }
    if let Some(e) = copied.end {
        return Err(corrupt(e.to_string()));
    }
    Ok(SegmentRead {
        bytes,
        last_offset: copied.last_offset,
        budget_hit: copied.budget_hit,
    })
}
