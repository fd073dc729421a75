//! Reading segment files: records in large positional windows, the scan that
//! classifies what ends the data (docs/FORMAT.md, Recovery), and the index rule applied
//! while scanning. Reads use `std::fs::File` directly (reads are not mutations); a
//! sealed segment may instead be read in place through a [`SealedMap`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::map::SealedMap;
use super::noatime;
use crate::format::record::{
    decode_record, len_prefix, peek_offset, plausible_start, LenPrefix, RecordError, RecordView,
    LEN_FIELD, MAX_RECORD_LEN,
};
use crate::format::{HeaderError, IndexBuilder, IndexEntry, SegmentHeader, HEADER_LEN};

/// Bytes read per system call while scanning.
pub const SCAN_WINDOW_BYTES: usize = 1024 * 1024;
/// A mapped reader drops the pages it has passed from its resident set in steps of
/// this many bytes.
pub const MAP_RELEASE_BYTES: usize = 1024 * 1024;
/// Largest buffer a reader ever holds: one maximal record.
pub const RECORD_BUFFER_MAX: usize = MAX_RECORD_LEN as usize + LEN_FIELD;

/// Reads and decodes the header of an open log file.
pub fn read_header(file: &File, file_len: u64) -> io::Result<Result<SegmentHeader, HeaderError>> {
    let want = HEADER_LEN.min(usize::try_from(file_len).unwrap_or(HEADER_LEN));
    let mut buf = [0u8; HEADER_LEN];
    let n = read_full_at(file, buf.get_mut(..want).unwrap_or(&mut []), 0)?;
    Ok(SegmentHeader::decode(buf.get(..n).unwrap_or(&[])))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub fn read_full_at(file: &File, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let Some(rest) = buf.get_mut(done..) else {
            break;
        };
        match file.read_at(rest, pos + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// What the reader found at its position.
#[derive(Debug)]
pub enum Next<'a> {
    /// A valid record starting at `position`.
    Record {
        position: u64,
        record: RecordView<'a>,
    },
    /// The data ends here: `None` exactly at the end of the file (or the reader's
    /// limit), else the reason the bytes at that position are not a record.
    End(Option<RecordError>),
}

/// What [`RecordReader::copy_records`] copied.
#[derive(Debug, Default)]
pub struct Copied {
    /// Offset of the first valid record read, copied or read over.
    pub first_seen: Option<u64>,
    /// Offset of the last record copied.
    pub last_offset: Option<u64>,
    /// Offset of the last valid record read, copied or read over.
    pub last_seen: Option<u64>,
    /// Stopped at a record that did not fit the budget; the reader is left at it.
    pub budget_hit: bool,
    /// Why the data ended before the limit, when it did.
    pub end: Option<RecordError>,
}

/// What [`RecordReader::measure_records`] found.
#[derive(Debug, Default)]
pub struct Measured {
    pub copied: Copied,
    /// The records' file range: (first position, bytes); `None` when none was taken.
    pub span: Option<(u64, u64)>,
    /// How many records.
    pub records: u64,
}

/// Sequential reader of the records in one log file, from a start position up to a
/// limit, using large positional reads. Every reader of records goes through it:
/// scan, check, recovery, compaction, dump and the fetch path.
#[derive(Debug)]
pub struct RecordReader<'f> {
    file: &'f File,
    /// Reads the records in place from this map of a sealed file instead of into
    /// `buf`: then `buf_pos` is 0, `filled` the mapped length and `used` the position.
    map: Option<&'f SealedMap>,
    /// Bytes of the map before this position were released from the resident set.
    released: usize,
    generation: u64,
    /// Absolute position of `buf[0]`.
    buf_pos: u64,
    /// Storage, reused between reads (never zeroed again); `buf[..filled]` holds data.
    buf: Vec<u8>,
    /// Bytes of `buf` read from the file.
    filled: usize,
    /// Bytes of `buf` consumed.
    used: usize,
    /// Position where reading stops (normally the file length).
    limit: u64,
    window: usize,
    /// The file must reach `limit` (see [`RecordReader::strict_limit`]).
    strict: bool,
    /// A strict reader found the file ending before its limit.
    file_short: bool,
}

impl<'f> RecordReader<'f> {
    /// A reader starting at `start` and stopping at `limit` (the file's length, or the
    /// durable end of an active segment).
    pub fn new(file: &'f File, generation: u64, start: u64, limit: u64) -> Self {
        Self::with_window(file, generation, start, limit, SCAN_WINDOW_BYTES)
    }

    /// Like [`RecordReader::new`] with a chosen read size.
    pub fn with_window(
        file: &'f File,
        generation: u64,
        start: u64,
        limit: u64,
        window: usize,
    ) -> Self {
        RecordReader {
            file,
            map: None,
            released: 0,
            generation,
            buf_pos: start,
            buf: Vec::new(),
            filled: 0,
            used: 0,
            limit,
            window: window.max(64),
            strict: false,
            file_short: false,
        }
    }

    /// A reader of a sealed segment that reads the records in place from `map` (a map
    /// of `file`, see [`RecordReader::sealed`]), without copying them.
    pub fn mapped(
        file: &'f File,
        map: &'f SealedMap,
        generation: u64,
        start: u64,
        limit: u64,
    ) -> Self {
        let bytes = map.bytes();
        let mut r = Self::new(file, generation, 0, limit);
        r.map = Some(map);
        r.filled = bytes.len();
        r.used = usize::try_from(start)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        r.released = r.used;
        // Like a lenient reader, a map shorter than the limit ends the data there.
        r.limit = limit.min(bytes.len() as u64);
        r
    }

    /// A reader of a sealed segment: through `map` when there is one, else with
    /// positional reads.
    pub fn sealed(
        file: &'f File,
        map: Option<&'f SealedMap>,
        generation: u64,
        start: u64,
        limit: u64,
    ) -> Self {
        match map {
            Some(m) => Self::mapped(file, m, generation, start, limit),
            None => Self::new(file, generation, start, limit),
        }
    }

    /// Makes the limit a promise rather than a bound: the bytes up to it are known to
    /// exist (the durable end of a segment). A read that finds no bytes before the
    /// limit ends the data there and [`RecordReader::file_short`] says so; a lenient
    /// reader instead takes the shorter file's end as its limit.
    pub fn strict_limit(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Reads into `buf`'s storage instead of a fresh one: its bytes are stale and
    /// only overwritten, never zeroed again (a fetch reuses one buffer per thread).
    pub fn with_buffer(mut self, buf: Vec<u8>) -> Self {
        self.buf = buf;
        self.filled = 0;
        self.used = 0;
        self
    }

    /// The read buffer's storage, for the next reader.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// True when a strict reader found the file ending before its limit.
    pub fn file_short(&self) -> bool {
        self.file_short
    }

    /// Position of the next record to be read.
    pub fn position(&self) -> u64 {
        self.buf_pos + self.used as u64
    }

    /// Reads the next record, or says why the data ends.
    pub fn next_record(&mut self) -> io::Result<Next<'_>> {
        if let Some(end) = self.buffer_next()? {
            return Ok(Next::End(end));
        }
        let pos = self.position();
        let avail = avail_of(self.map, &self.buf, self.used, self.filled, self.limit);
        match decode_record(avail, pos, self.generation) {
            Ok(record) => {
                self.used += record.encoded_len;
                Ok(Next::Record {
                    position: pos,
                    record,
                })
            }
            Err(e) => Ok(Next::End(Some(e))),
        }
    }

    /// Appends to `out` the whole encoded records (one copy, from the read buffer)
    /// whose offsets are at least `min_offset`, until the limit, the first position
    /// that is not a valid record, or a record that would take the bytes appended by
    /// this call past `budget_bytes`. With `take_one`, the first record appended may
    /// exceed the budget on its own. Records below `min_offset` are read over and not
    /// counted.
    pub fn copy_records(
        &mut self,
        min_offset: u64,
        budget_bytes: u64,
        take_one: bool,
        out: &mut Vec<u8>,
    ) -> io::Result<Copied> {
        self.take_records(min_offset, budget_bytes, take_one, |_, bytes| {
            out.extend_from_slice(bytes);
        })
    }

    /// [`RecordReader::copy_records`] without the copy: validates the same records
    /// (whole, CRC, offsets), which lie back to back in the file, and returns them as
    /// the file range `(first position, bytes)` (`None`: no record taken) with the
    /// number of records. The reader's window can then stay cache-sized whatever the
    /// budget.
    pub fn measure_records(
        &mut self,
        min_offset: u64,
        budget_bytes: u64,
        take_one: bool,
    ) -> io::Result<Measured> {
        let mut span: Option<(u64, u64)> = None;
        let mut records = 0u64;
        let copied = self.take_records(min_offset, budget_bytes, take_one, |pos, bytes| {
            records += 1;
            let (first, len) = span.get_or_insert((pos, 0));
            debug_assert_eq!(*first + *len, pos, "records taken are back to back");
            *len += bytes.len() as u64;
        })?;
        Ok(Measured {
            copied,
            span,
            records,
        })
    }

    /// The loop of [`RecordReader::copy_records`], handing each record taken (its
    /// position and bytes) to `take`.
    fn take_records(
        &mut self,
        min_offset: u64,
        budget_bytes: u64,
        take_one: bool,
        mut take: impl FnMut(u64, &[u8]),
    ) -> io::Result<Copied> {
        let mut taken = 0u64;
        let mut copied = Copied::default();
        loop {
            if let Some(end) = self.buffer_next()? {
                copied.end = end;
                return Ok(copied);
            }
            let pos = self.position();
            let avail = avail_of(self.map, &self.buf, self.used, self.filled, self.limit);
            let record = match decode_record(avail, pos, self.generation) {
                Ok(r) => r,
                Err(e) => {
                    copied.end = Some(e);
                    return Ok(copied);
                }
            };
            let len = record.encoded_len;
            if record.offset >= min_offset {
                let fits = taken + len as u64 <= budget_bytes;
                if !(fits || take_one && taken == 0) {
                    copied.budget_hit = true;
                    return Ok(copied);
                }
                copied.last_offset = Some(record.offset);
                take(pos, avail.get(..len).unwrap_or(&[]));
                taken += len as u64;
            }
            copied.first_seen.get_or_insert(record.offset);
            copied.last_seen = Some(record.offset);
            self.used += len;
        }
    }

    /// Buffers the whole record claimed at the position. `Some(end)` when the data
    /// ends there instead: `None` at the limit, else why the bytes are not a record
    /// (as far as the length prefix tells).
    fn buffer_next(&mut self) -> io::Result<Option<Option<RecordError>>> {
        self.release_passed();
        loop {
            let pos = self.position();
            if pos >= self.limit {
                return Ok(Some(None));
            }
            let avail = self.avail();
            let short = avail.len() < LEN_FIELD;
            match len_prefix(avail) {
                LenPrefix::Whole { .. } => return Ok(None),
                LenPrefix::Short { needed } if !self.at_limit() => self.refill(needed)?,
                // Fewer than 4 zero bytes buffered: read on before calling it the end.
                LenPrefix::Zero if short && !self.at_limit() => self.refill(LEN_FIELD)?,
                LenPrefix::Short { needed } => {
                    return Ok(Some(Some(RecordError::Truncated {
                        position: pos,
                        needed: needed as u64,
                        available: self.limit - pos,
                    })))
                }
                LenPrefix::Zero => return Ok(Some(Some(RecordError::Zero { position: pos }))),
                LenPrefix::Implausible { record_len } => {
                    return Ok(Some(Some(RecordError::ImplausibleLength {
                        position: pos,
                        record_len,
                    })))
                }
            }
        }
    }

    fn at_limit(&self) -> bool {
        self.buf_pos + self.filled as u64 >= self.limit
    }

    /// The bytes buffered (or mapped, up to the limit) from the position on.
    #[inline]
    fn avail(&self) -> &[u8] {
        avail_of(self.map, &self.buf, self.used, self.filled, self.limit)
    }

    /// A mapped reader drops the pages behind it from the resident set.
    #[inline]
    fn release_passed(&mut self) {
        if let Some(m) = self.map {
            if self.used - self.released.min(self.used) >= MAP_RELEASE_BYTES {
                m.release_before(self.used);
                self.released = self.used;
            }
        }
    }

    /// Drops consumed bytes and reads until at least `needed` bytes are buffered (or
    /// the limit is reached). `needed` is bounded by the record length check. The
    /// storage is only zero-filled when it grows, not on every read.
    fn refill(&mut self, needed: usize) -> io::Result<()> {
        let needed = needed.min(RECORD_BUFFER_MAX);
        let used = self.used.min(self.filled);
        self.buf.copy_within(used..self.filled, 0);
        self.filled -= used;
        self.buf_pos += used as u64;
        self.used = 0;
        let end = self.buf_pos + self.filled as u64;
        let room = self.limit.saturating_sub(end);
        let want = needed.max(self.window).saturating_sub(self.filled);
        let want = usize::try_from((want as u64).min(room)).unwrap_or(0);
        if want == 0 {
            return Ok(());
        }
        let old = self.filled;
        if self.buf.len() < old + want {
            self.buf.resize(old + want, 0);
        }
        let n = read_full_at(
            self.file,
            self.buf.get_mut(old..old + want).unwrap_or(&mut []),
            end,
        )?;
        self.filled = old + n;
        if n == 0 && self.strict {
            // Bytes the limit promised are missing: the data ends here.
            self.file_short = true;
            self.limit = self.buf_pos + self.filled as u64;
        } else if n < want && !self.strict {
            // The file is shorter than the limit said: stop there.
            self.limit = self.buf_pos + self.filled as u64;
        }
        Ok(())
    }
}

/// [`RecordReader::avail`] over the fields, so the caller may move `used` meanwhile.
#[inline]
fn avail_of<'a>(
    map: Option<&'a SealedMap>,
    buf: &'a [u8],
    used: usize,
    filled: usize,
    limit: u64,
) -> &'a [u8] {
    match map {
        Some(m) => {
            let end = usize::try_from(limit).unwrap_or(usize::MAX);
            m.bytes().get(used..end).unwrap_or(&[])
        }
        None => buf.get(used..filled).unwrap_or(&[]),
    }
}

/// Where the records of a segment resume after damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resync {
    /// Position of the first record found.
    pub position: u64,
    pub offset: u64,
}

/// Bytes of a candidate record needed to read its claimed offset.
const RESYNC_PEEK_BYTES: usize = 12;

/// The one resynchronisation after damage, used by fetch, dump, the check and
/// salvage alike (docs/FORMAT.md, Recovery): the first position in `from..limit`
/// where a whole record decodes, passes its CRC with `generation`, and has an offset
/// in `min_offset..max_offset` (`max_offset`: the next segment's base, exclusive;
/// `None`: no bound). `None` when no such position exists before `limit`.
///
/// Every position is tried, so a record is found whatever the damage did to the
/// lengths before it; the offset bound is checked first, which skips nearly every
/// position of random bytes without decoding it.
pub fn resync(
    file: &File,
    generation: u64,
    from: u64,
    limit: u64,
    min_offset: u64,
    max_offset: Option<u64>,
) -> io::Result<Option<Resync>> {
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_pos = from;
    let mut pos = from;
    let mut big: Vec<u8> = Vec::new();
    while pos < limit {
        let at = usize::try_from(pos - buf_pos).unwrap_or(usize::MAX);
        let buf_end = buf_pos + buf.len() as u64;
        if buf.len().saturating_sub(at) < RESYNC_PEEK_BYTES && buf_end < limit {
            let want = usize::try_from((limit - pos).min(SCAN_WINDOW_BYTES as u64))
                .unwrap_or(SCAN_WINDOW_BYTES);
            buf.resize(want, 0);
            let n = read_full_at(file, &mut buf, pos)?;
            buf.truncate(n);
            buf_pos = pos;
            if n == 0 {
                break;
            }
            continue;
        }
        let avail = buf.get(at..).unwrap_or(&[]);
        let in_range =
            peek_offset(avail).is_some_and(|o| o >= min_offset && max_offset.is_none_or(|m| o < m));
        if in_range {
            match decode_record(avail, pos, generation) {
                Ok(r) => {
                    return Ok(Some(Resync {
                        position: pos,
                        offset: r.offset,
                    }))
                }
                Err(RecordError::Truncated { needed, .. }) if buf_end < limit => {
                    // The claimed record runs past the buffer: read it whole, unless
                    // its lengths already disagree (random bytes nearly always do).
                    let room = limit - pos;
                    if needed <= room
                        && needed <= RECORD_BUFFER_MAX as u64
                        && plausible_start(avail)
                    {
                        big.resize(usize::try_from(needed).unwrap_or(0), 0);
                        let n = read_full_at(file, &mut big, pos)?;
                        if let Ok(r) = decode_record(big.get(..n).unwrap_or(&[]), pos, generation) {
                            return Ok(Some(Resync {
                                position: pos,
                                offset: r.offset,
                            }));
                        }
                    }
                }
                Err(_) => {}
            }
        }
        pos += 1;
    }
    Ok(None)
}

/// Why a scan stopped before the end of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The data ends exactly at the end of the file.
    Eof,
    /// The bytes at the record's position are not a valid record.
    Record(RecordError),
    /// A valid record whose offset does not increase (or is below the base offset).
    OffsetOrder {
        position: u64,
        offset: u64,
        previous: Option<u64>,
        base_offset: u64,
    },
}

impl ScanEnd {
    /// Position where the valid data ends, if not at EOF.
    pub fn position(&self) -> Option<u64> {
        match self {
            ScanEnd::Eof => None,
            ScanEnd::Record(e) => Some(e.position()),
            ScanEnd::OffsetOrder { position, .. } => Some(*position),
        }
    }

    /// Stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            ScanEnd::Eof => "eof",
            ScanEnd::Record(e) => e.kind(),
            ScanEnd::OffsetOrder { .. } => "offset_out_of_order",
        }
    }

    /// One-line description.
    pub fn detail(&self) -> String {
        match self {
            ScanEnd::Eof => "data ends at the end of the file".into(),
            ScanEnd::Record(e) => e.to_string(),
            ScanEnd::OffsetOrder {
                position,
                offset,
                previous: Some(p),
                ..
            } => {
                format!("record at position {position} has offset {offset}, not above the previous offset {p}")
            }
            ScanEnd::OffsetOrder {
                position,
                offset,
                previous: None,
                base_offset,
            } => {
                format!("record at position {position} has offset {offset}, below the segment's base offset {base_offset}")
            }
        }
    }

    /// True for a tail a writer may legally leave after its data: zeros (unwritten
    /// or preallocated space) or records of an older generation of a reused file.
    pub fn is_benign_tail(&self) -> bool {
        matches!(
            self,
            ScanEnd::Record(RecordError::Zero { .. } | RecordError::StaleGeneration { .. })
        )
    }
}

/// What a full scan of a segment found.
#[derive(Clone, Debug)]
pub struct ScanSummary {
    pub records: u64,
    pub first_offset: Option<u64>,
    pub last_offset: Option<u64>,
    /// Newest record timestamp seen.
    pub max_timestamp_ms: Option<i64>,
    /// Position just past the last valid record.
    pub data_end: u64,
    pub file_len: u64,
    /// True when offsets inside the segment skip (compaction happened).
    pub has_gaps: bool,
    pub end: ScanEnd,
    /// The index the rule gives for the valid records.
    pub index: Vec<IndexEntry>,
}

/// Scans a segment from its first record to the end of its valid data, calling
/// `visit` for each record, and building the index the rule gives. Stops at the first
/// position that does not hold a valid record with an increasing offset.
pub fn scan_segment(
    file: &File,
    header: &SegmentHeader,
    file_len: u64,
    visit: impl FnMut(u64, &RecordView<'_>),
) -> io::Result<ScanSummary> {
    let reader = RecordReader::new(file, header.generation, HEADER_LEN as u64, file_len);
    scan_records(reader, header, file_len, visit)
}

/// [`scan_segment`] of a sealed segment (never the active one, whose length changes):
/// reads it in place through a map of the file, or with positional reads when the
/// file cannot be mapped.
pub fn scan_sealed_segment(
    file: &File,
    header: &SegmentHeader,
    file_len: u64,
    visit: impl FnMut(u64, &RecordView<'_>),
) -> io::Result<ScanSummary> {
    let map = SealedMap::sealed(file, file_len);
    let reader = RecordReader::sealed(
        file,
        map.as_ref(),
        header.generation,
        HEADER_LEN as u64,
        file_len,
    );
    scan_records(reader, header, file_len, visit)
}

fn scan_records(
    mut reader: RecordReader<'_>,
    header: &SegmentHeader,
    file_len: u64,
    mut visit: impl FnMut(u64, &RecordView<'_>),
) -> io::Result<ScanSummary> {
    let mut builder = IndexBuilder::new();
    let mut s = ScanSummary {
        records: 0,
        first_offset: None,
        last_offset: None,
        max_timestamp_ms: None,
        data_end: (HEADER_LEN as u64).min(file_len),
        file_len,
        has_gaps: false,
        end: ScanEnd::Eof,
        index: Vec::new(),
    };
    loop {
        match reader.next_record()? {
            Next::Record { position, record } => {
                let in_order = match s.last_offset {
                    Some(prev) => record.offset > prev,
                    None => record.offset >= header.base_offset,
                };
                if !in_order {
                    s.end = ScanEnd::OffsetOrder {
                        position,
                        offset: record.offset,
                        previous: s.last_offset,
                        base_offset: header.base_offset,
                    };
                    break;
                }
                if let Some(prev) = s.last_offset {
                    s.has_gaps |= record.offset != prev + 1;
                }
                if let Some(e) = builder.observe(header.base_offset, record.offset, position) {
                    s.index.push(e);
                }
                visit(position, &record);
                s.records += 1;
                s.first_offset.get_or_insert(record.offset);
                s.last_offset = Some(record.offset);
                s.max_timestamp_ms = Some(
                    s.max_timestamp_ms
                        .map_or(record.timestamp_ms, |t| t.max(record.timestamp_ms)),
                );
                s.data_end = position + record.encoded_len as u64;
            }
            Next::End(None) => break,
            Next::End(Some(e)) => {
                s.end = ScanEnd::Record(e);
                break;
            }
        }
    }
    Ok(s)
}

/// True when every byte of the file in `from..to` is zero.
pub fn range_is_zero(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; SCAN_WINDOW_BYTES];
    let mut pos = from;
    while pos < to {
        let want = usize::try_from((to - pos).min(buf.len() as u64)).unwrap_or(buf.len());
        let chunk = buf.get_mut(..want).unwrap_or(&mut []);
        let n = read_full_at(file, chunk, pos)?;
        if n == 0 {
            break;
        }
        if chunk.get(..n).unwrap_or(&[]).iter().any(|&b| b != 0) {
            return Ok(false);
        }
        pos += n as u64;
    }
    Ok(true)
}

/// A path named like a segment that is no regular file.
#[derive(Debug, thiserror::Error)]
#[error("{}: not a regular file but a {what}", path.display())]
pub struct NotRegularFile {
    pub path: PathBuf,
    /// "FIFO", "directory", …
    pub what: &'static str,
}

/// The [`NotRegularFile`] an [`open_log`] error carries, if it is one.
pub fn not_regular_file(e: &io::Error) -> Option<&NotRegularFile> {
    e.get_ref()?.downcast_ref()
}

/// Opens a log file read-only and returns it with its length. Anything but a regular
/// file is refused with a [`NotRegularFile`] error: it is opened without blocking (a
/// FIFO without a writer would block the open, and a read, forever) and checked
/// before a byte is read. Reading it leaves its access time alone where the process
/// may ask for that ([`noatime::open_read_with`]).
pub fn open_log(path: &Path) -> io::Result<(File, u64)> {
    use std::os::unix::fs::FileTypeExt;
    let file = noatime::open_read_with(path, libc::O_NONBLOCK)?;
    let meta = file.metadata()?;
    let t = meta.file_type();
    if !t.is_file() {
        let what = if t.is_dir() {
            "directory"
        } else if t.is_fifo() {
            "FIFO"
        } else if t.is_socket() {
            "socket"
        } else if t.is_char_device() || t.is_block_device() {
            "device"
        } else {
            "special file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            NotRegularFile {
                path: path.to_path_buf(),
                what,
            },
        ));
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::encode_record;
    use std::io::Write;

    fn segment(generation: u64, n: u64, value_len: usize) -> Vec<u8> {
        let mut v = SegmentHeader {
            base_offset: 10,
            generation,
            flags: 0,
        }
        .encode()
        .to_vec();
        for i in 0..n {
            encode_record(
                &mut v,
                10 + i,
                i as i64,
                Some(b"k"),
                &vec![b'x'; value_len],
                generation,
            )
            .unwrap();
        }
        v
    }

    fn scan(bytes: &[u8], window: usize) -> (Vec<u64>, ScanEnd) {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        let h = SegmentHeader::decode(bytes).unwrap();
        let mut r = RecordReader::with_window(&f, h.generation, 32, bytes.len() as u64, window);
        let mut offs = Vec::new();
        loop {
            match r.next_record().unwrap() {
                Next::Record { record, .. } => offs.push(record.offset),
                Next::End(None) => return (offs, ScanEnd::Eof),
                Next::End(Some(e)) => return (offs, ScanEnd::Record(e)),
            }
        }
    }

    #[test]
    fn reads_across_windows() {
        let bytes = segment(0, 50, 300);
        for window in [64, 100, 333, 4096, 1 << 20] {
            let (offs, end) = scan(&bytes, window);
            assert_eq!(offs, (10..60).collect::<Vec<_>>(), "window {window}");
            assert_eq!(end, ScanEnd::Eof);
        }
    }

    #[test]
    fn classifies_tails() {
        let good = segment(2, 5, 10);
        let mut zeros = good.clone();
        zeros.extend_from_slice(&[0; 100]);
        assert!(matches!(
            scan(&zeros, 64).1,
            ScanEnd::Record(RecordError::Zero { .. })
        ));
        let mut torn = good.clone();
        torn.extend_from_slice(&segment(2, 1, 10)[32..40]);
        assert!(matches!(
            scan(&torn, 64).1,
            ScanEnd::Record(RecordError::Truncated { .. })
        ));
        let mut stale = good.clone();
        encode_record(&mut stale, 99, 0, None, b"old", 1).unwrap();
        assert!(matches!(
            scan(&stale, 64).1,
            ScanEnd::Record(RecordError::StaleGeneration {
                writer_generation: 1,
                ..
            })
        ));
        let mut short_zero = good.clone();
        short_zero.extend_from_slice(&[0, 0]);
        assert!(matches!(
            scan(&short_zero, 64).1,
            ScanEnd::Record(RecordError::Zero { .. })
        ));
    }

    /// The mapped reader and `scan_sealed_segment` agree with the positional reader on
    /// every tail and on a record cut at every length.
    #[test]
    fn mapped_reads_agree_with_positional_reads() {
        let good = segment(2, 40, 100);
        let mut cases = vec![good.clone()];
        let mut zeros = good.clone();
        zeros.extend_from_slice(&[0; 100]);
        cases.push(zeros);
        let mut stale = good.clone();
        encode_record(&mut stale, 99, 0, None, b"old", 1).unwrap();
        cases.push(stale);
        let mut flipped = good.clone();
        flipped[500] ^= 1;
        cases.push(flipped);
        let one = segment(2, 1, 10);
        for cut in 1..one.len() - 32 {
            let mut torn = good.clone();
            torn.extend_from_slice(&one[32..32 + cut]);
            cases.push(torn);
        }
        for bytes in cases {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&bytes).unwrap();
            let h = SegmentHeader::decode(&bytes).unwrap();
            let len = bytes.len() as u64;
            let map = SealedMap::sealed(&f, len).expect("a temporary file maps");
            let mut plain = RecordReader::with_window(&f, h.generation, 32, len, 64);
            let mut mapped = RecordReader::mapped(&f, &map, h.generation, 32, len);
            loop {
                let (a, b) = (plain.next_record().unwrap(), mapped.next_record().unwrap());
                let end = matches!(a, Next::End(_));
                assert_eq!(format!("{a:?}"), format!("{b:?}"));
                if end {
                    break;
                }
            }
            let a = scan_segment(&f, &h, len, |_, _| {}).unwrap();
            let b = scan_sealed_segment(&f, &h, len, |_, _| {}).unwrap();
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
    }

    #[test]
    fn scan_segment_builds_the_index_and_checks_order() {
        let bytes = segment(0, 100, 200);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let h = SegmentHeader::decode(&bytes).unwrap();
        let s = scan_segment(&f, &h, bytes.len() as u64, |_, _| {}).unwrap();
        assert_eq!(
            (s.records, s.first_offset, s.last_offset, s.end.clone()),
            (100, Some(10), Some(109), ScanEnd::Eof)
        );
        assert_eq!(s.data_end, bytes.len() as u64);
        assert!(s.index.len() > 3);
        let mut bad = segment(0, 3, 5);
        encode_record(&mut bad, 11, 0, None, b"dup", 0).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bad).unwrap();
        let s = scan_segment(&f, &h, bad.len() as u64, |_, _| {}).unwrap();
        assert!(matches!(
            s.end,
            ScanEnd::OffsetOrder {
                offset: 11,
                previous: Some(12),
                ..
            }
        ));
        assert_eq!(s.records, 3);
    }

    #[test]
    fn copy_records_keeps_the_budget_and_a_strict_limit() {
        let bytes = segment(0, 20, 50);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let rec_len = (bytes.len() - 32) / 20;
        let limit = bytes.len() as u64;
        let mut r = RecordReader::with_window(&f, 0, 32, limit, 64).strict_limit();
        let mut out = Vec::new();
        let c = r
            .copy_records(13, 3 * rec_len as u64, false, &mut out)
            .unwrap();
        assert_eq!((c.last_offset, c.budget_hit), (Some(15), true));
        assert_eq!(out, bytes[32 + 3 * rec_len..32 + 6 * rec_len]);
        let mut out = Vec::new();
        let c = r.copy_records(0, 1, true, &mut out).unwrap();
        assert_eq!(
            (c.last_offset, c.budget_hit, out.len()),
            (Some(16), true, rec_len)
        );
        let c = r.copy_records(0, u64::MAX, false, &mut out).unwrap();
        assert_eq!(
            (c.last_offset, c.budget_hit, c.end),
            (Some(29), false, None)
        );
        assert!(!r.file_short());
        // A limit past the file's end: lenient readers stop at the end, strict ones say so.
        let mut r = RecordReader::new(&f, 0, 32, limit + 100).strict_limit();
        let c = r.copy_records(0, u64::MAX, false, &mut Vec::new()).unwrap();
        assert_eq!(c.last_offset, Some(29));
        assert!(r.file_short());
        let mut r = RecordReader::new(&f, 0, 32, limit + 100);
        let c = r.copy_records(0, u64::MAX, false, &mut Vec::new()).unwrap();
        assert_eq!((c.last_offset, c.end), (Some(29), None));
        assert!(!r.file_short());
    }
}
