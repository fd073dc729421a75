//! The read path: durable records only, in large positional windows through the
//! segment's own file handle.

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

/// A read buffer over `[pos, pos + buf.len())` of a file, refilled by large reads.
pub(super) struct Window<'f> {
    file: &'f File,
    pos: u64,
    buf: Vec<u8>,
    limit: u64,
    read_bytes: u64,
}

impl Window<'_> {
    /// Bytes available from `at` (which must lie in the window).
    pub(super) fn from(&self, at: u64) -> &[u8] {
        let i = usize::try_from(at.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        self.buf.get(i..).unwrap_or(&[])
    }

    /// Drops what lies before `at` and reads on until `needed` bytes from `at` are
    /// buffered (or the limit is reached). Returns false if nothing more could be read.
    pub(super) fn fill(&mut self, at: u64, needed: u64) -> io::Result<bool> {
        let drop_n = usize::try_from(at.saturating_sub(self.pos))
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        self.buf.drain(..drop_n);
        self.pos += drop_n as u64;
        let end = self.pos + self.buf.len() as u64;
        let want = needed
            .max(self.read_bytes)
            .saturating_sub(self.buf.len() as u64)
            .min(self.limit.saturating_sub(end));
        let Ok(want) = usize::try_from(want) else {
            return Ok(false);
        };
        if want == 0 {
            return Ok(false);
        }
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        let n = read_full_at(self.file, self.buf.get_mut(old..).unwrap_or(&mut []), end)?;
        self.buf.truncate(old + n);
        Ok(n > 0)
    }
}

/// Reads whole records with offsets ≥ `offset` from one segment, up to its readable
/// end: index lookup, one large read from the entry, scan forward.
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
    let mut win = Window {
        file: &seg.file,
        pos: start,
        buf: Vec::new(),
        limit,
        read_bytes,
    };
    let mut out = SegmentRead {
        bytes: Vec::new(),
        last_offset: None,
        budget_hit: false,
    };
    let mut pos = start;
    let corrupt = |detail: String| EngineError::Corrupt {
        path: seg.path.clone(),
        detail,
    };
    let io_err = |e: io::Error| EngineError::io(format!("reading {}", seg.path.display()), e);
    while pos < limit {
        let avail = win.from(pos);
        let need = needed_len(avail);
        let more_on_disk = pos + (avail.len() as u64) < limit;
        if (avail.len() as u64) < need && more_on_disk {
            if !win.fill(pos, need).map_err(io_err)? {
                return Err(corrupt(format!(
                    "file ends before its durable data does ({limit} bytes)"
                )));
            }
            continue;
        }
        let record =
            decode_record(avail, pos, seg.generation).map_err(|e| corrupt(e.to_string()))?;
        let len = record.encoded_len as u64;
        if record.offset >= offset {
            let fits = out.bytes.len() as u64 + len <= budget;
            if !(fits || take_one && out.bytes.is_empty()) {
                out.budget_hit = true;
                break;
            }
            out.bytes
                .extend_from_slice(avail.get(..record.encoded_len).unwrap_or(&[]));
            out.last_offset = Some(record.offset);
        }
        pos += len;
    }
    Ok(out)
}

/// Bytes the record at the start of `avail` needs: its length field, then its whole
/// length (bounded by the largest record, so an implausible length is never read for;
/// the decoder reports it).
pub(super) fn needed_len(avail: &[u8]) -> u64 {
    match avail
        .get(..LEN_FIELD)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
    {
        Some(b) => u64::from(u32::from_be_bytes(b).min(MAX_RECORD_LEN)) + LEN_FIELD as u64,
        None => LEN_FIELD as u64,
    }
}
