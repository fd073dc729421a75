//! The properties every decoder must hold on arbitrary input, as functions that panic
//! (through `assert!`) when one fails. The fuzz targets call the byte-driven entry
//! points (`record`, `segment_header`, …); the randomized tests call the same
//! functions and the `check_*` cores with mutated valid encodings.
//!
//! For every decoder: it returns (never panics, never allocates more than
//! [`super::ALLOCATION_BYTES_MAX`] at once when run under [`super::CappedAlloc`]),
//! and what it accepts re-encodes to the same bytes:
//! - record: re-encoding the view under the same generation gives the consumed prefix;
//! - segment header: `encode()` gives the first 32 bytes;
//! - index: the entries re-encode to the file; `lookup` and `lookup_bytes` agree with
//!   each other and with a linear search;
//! - compaction marker, topic.json: `decode(encode(x)) == x` (JSON is not canonical:
//!   whitespace, key order and escapes vary);
//! - protocol request and response frames: re-encoding gives the frame, byte for byte
//!   (the wire format is canonical);
//! - segment scan: the windowed file reader and `scan_segment` agree with a plain
//!   in-memory decoding loop written here, and the partition check neither fails nor
//!   reports positions outside the files; recovery of the partition succeeds, puts the
//!   next offset after every valid record, and leaves nothing for a second run to do.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::maintenance::check::{
    check_partition, quick_check, CheckMode, ProblemKind, Severity,
};
use crate::engine::storage::layout::PartitionRef;
use crate::engine::storage::reader::{read_header, scan_segment, Next, RecordReader, ScanEnd};
use crate::format::index::{decode_index, lookup, lookup_bytes, IndexEntry, INDEX_ENTRY_LEN};
use crate::format::marker::CompactionMarker;
use crate::format::names::{index_file_name, log_file_name};
use crate::format::record::{decode_record, encode_record, encoded_len, RecordError};
use crate::format::topic::{TopicConfig, TopicMeta};
use crate::format::wire::{
    check_frame_len, decode_request, decode_response, decode_response_version, encode_request,
    encode_response, frame_head, ApiKey, Chunk, CleanupInfo, ErrorCode, PartitionAck,
    PartitionBatch, PartitionDescription, PartitionOffsets, Request, ResponseBody, StatsBody,
    WireRecord, CLEANUP_INFO_VERSION, FRAME_BYTES_MAX, LEN_FIELD, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
};
use crate::format::wire::{HealthState, PartitionHealth, WriteStats, PARTITION_HEALTH_VERSION};
use crate::format::{
    HeaderError, SegmentHeader, HEADER_LEN, INDEX_INTERVAL_BYTES, RECORD_OVERHEAD,
};

// ---------------------------------------------------------------------------------
// Reading structured choices out of fuzz bytes.

/// Takes values from the front of fuzz input; yields zeros once it runs out.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) << 8 | u16::from(self.u8())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }

    /// A u64 that is often at an edge: 0, 1, small, near `u64::MAX`, or anything.
    pub fn edgy_u64(&mut self) -> u64 {
        match self.u8() % 6 {
            0 => 0,
            1 => 1,
            2 => u64::from(self.u8()),
            3 => u64::MAX - u64::from(self.u8() % 4),
            4 => u64::from(self.u32()),
            _ => self.u64(),
        }
    }
}

// ---------------------------------------------------------------------------------
// Records.

/// Fuzz entry: flags, optional generation, then the record bytes. With flag bit 0 the
/// CRC is fixed up first, so the decoder's acceptance path is reached.
pub fn record(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let generation = match (flags >> 1) & 3 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        _ => input.u64(),
    };
    let mut buf = input.rest().to_vec();
    if flags & 1 == 1 {
        fix_record_crc(&mut buf, generation);
    }
    check_record(&buf, HEADER_LEN as u64, generation);
}

/// Rewrites the CRC of the record at the start of `buf` (if its length fits) so that
/// it is valid under `generation`.
pub fn fix_record_crc(buf: &mut [u8], generation: u64) {
    let Some(len) = buf
        .get(..4)
        .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    else {
        return;
    };
    let total = len as usize + 4;
    if len < RECORD_OVERHEAD || total > buf.len() {
        return;
    }
    let crc = crate::format::crc32(&buf[4..total - 4]) ^ generation as u32;
    buf[total - 4..total].copy_from_slice(&crc.to_be_bytes());
}

/// Decodes the record at the start of `buf` and checks the outcome.
pub fn check_record(buf: &[u8], position: u64, generation: u64) {
    match decode_record(buf, position, generation) {
        Ok(view) => {
            assert!(view.encoded_len <= buf.len());
            assert_eq!(
                encoded_len(view.key.map(<[u8]>::len), view.value.len()),
                Some(view.encoded_len)
            );
            let mut again = Vec::new();
            let n = encode_record(
                &mut again,
                view.offset,
                view.timestamp_ms,
                view.key,
                view.value,
                generation,
            )
            .expect("a decoded record re-encodes");
            assert_eq!(n, view.encoded_len);
            assert_eq!(again.as_slice(), &buf[..view.encoded_len]);
            // A decoded record decodes the same from its own bytes alone.
            assert_eq!(decode_record(&again, position, generation), Ok(view));
        }
        Err(e) => {
            assert_eq!(e.position(), position, "{e}");
            assert!(!e.kind().is_empty());
            let _ = e.to_string();
            match e {
                RecordError::Truncated {
                    needed, available, ..
                } => {
                    assert!(needed > available, "{e}");
                    assert_eq!(available, buf.len() as u64);
                }
                RecordError::Zero { .. } => {
                    assert!(buf.iter().take(4).all(|&b| b == 0), "{e}");
                }
                RecordError::TooLarge { .. } => panic!("decoder returned {e}"),
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Segment header.

/// Fuzz entry: the bytes are the start of a segment file.
pub fn segment_header(data: &[u8]) {
    match SegmentHeader::decode(data) {
        Ok(h) => {
            assert_eq!(&h.encode()[..], &data[..HEADER_LEN]);
            assert_eq!(h.flags, 0);
        }
        Err(e) => {
            assert!(e.position() < HEADER_LEN as u64);
            let _ = e.to_string();
            assert_eq!(
                matches!(e, HeaderError::Short { .. }),
                data.len() < HEADER_LEN,
                "{e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Index files.

/// Fuzz entry: flags, `data_end`, the lookup key, then the index bytes.
pub fn index(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let data_end = (flags & 1 == 1).then(|| input.edgy_u64());
    let query = input.edgy_u64();
    let bytes = input.rest();
    check_index(bytes, data_end, query);
}

/// Decodes an index file and looks `query` up in it both ways.
pub fn check_index(bytes: &[u8], data_end: Option<u64>, query: u64) {
    // lookup_bytes never panics and only returns an entry of the file.
    let raw = lookup_bytes(bytes, query);
    if let Some(e) = raw {
        assert!(e.relative_offset <= query);
        let whole = bytes.len() / INDEX_ENTRY_LEN * INDEX_ENTRY_LEN;
        assert!(bytes[..whole]
            .chunks_exact(INDEX_ENTRY_LEN)
            .any(|c| c == e.encode()));
    }
    match decode_index(bytes, data_end) {
        Ok(entries) => {
            assert_eq!(entries.len() * INDEX_ENTRY_LEN, bytes.len());
            let mut again = Vec::with_capacity(bytes.len());
            for e in &entries {
                assert_eq!(IndexEntry::decode(&e.encode()), Some(*e));
                e.encode_into(&mut again);
                assert!(e.position >= HEADER_LEN as u64);
                assert!(data_end.is_none_or(|end| e.position < end));
            }
            assert_eq!(again, bytes);
            for w in entries.windows(2) {
                assert!(w[0].relative_offset < w[1].relative_offset);
                assert!(w[0].position < w[1].position);
            }
            let linear = entries
                .iter()
                .rev()
                .find(|e| e.relative_offset <= query)
                .copied();
            assert_eq!(lookup(&entries, query), linear);
            assert_eq!(raw, linear);
            // Every entry's own key finds it.
            for e in &entries {
                assert_eq!(lookup(&entries, e.relative_offset), Some(*e));
                assert_eq!(lookup_bytes(bytes, e.relative_offset), Some(*e));
            }
        }
        Err(e) => {
            assert!(e.position() <= bytes.len() as u64, "{e}");
            assert!(!e.kind().is_empty());
            let _ = e.to_string();
        }
    }
}

// ---------------------------------------------------------------------------------
// JSON metadata.

/// Fuzz entry: the bytes of a `compaction.marker`.
pub fn compaction_marker(data: &[u8]) {
    match CompactionMarker::decode(data) {
        Ok(m) => {
            let bytes = m.encode();
            assert_eq!(CompactionMarker::decode(&bytes), Ok(m.clone()));
            // The encoding is a fixed point.
            assert_eq!(CompactionMarker::decode(&bytes).unwrap().encode(), bytes);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Fuzz entry: the bytes of a `topic.json`.
pub fn topic_json(data: &[u8]) {
    match TopicMeta::decode(data) {
        Ok(m) => {
            assert!(m.partitions >= 1);
            let bytes = m.encode();
            assert_eq!(TopicMeta::decode(&bytes), Ok(m.clone()));
            assert_eq!(TopicMeta::decode(&bytes).unwrap().encode(), bytes);
            // The config alone round-trips through its JSON object too.
            assert_eq!(TopicConfig::from_json(&m.config.to_json()), Ok(m.config));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Fuzz entry: a file name found in a partition directory, or a topic name.
pub fn names(data: &[u8]) {
    use crate::format::names::{
        classify_partition_file, parse_stem, segment_stem, validate_name, PartitionFile,
        NAME_LEN_MAX,
    };
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    // Whatever a name is classified as, it is exactly the name that kind would have.
    match classify_partition_file(name) {
        PartitionFile::Log(b) => assert_eq!(log_file_name(b), name),
        PartitionFile::Index(b) => assert_eq!(index_file_name(b), name),
        PartitionFile::LogTmp(b) => assert_eq!(format!("{}.tmp", log_file_name(b)), name),
        PartitionFile::IndexTmp(b) => assert_eq!(format!("{}.tmp", index_file_name(b)), name),
        PartitionFile::Marker => assert_eq!(name, "compaction.marker"),
        PartitionFile::OtherTmp => assert!(name.ends_with(".tmp") || name.contains(".tmp-")),
        PartitionFile::Unknown => {}
    }
    if let Some(b) = parse_stem(name) {
        assert_eq!(segment_stem(b), name);
    }
    match validate_name(name) {
        Ok(()) => {
            assert!((1..=NAME_LEN_MAX).contains(&name.len()));
            assert!(name != "." && name != "..");
            assert!(name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-')));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

// ---------------------------------------------------------------------------------
// Protocol frames.

/// Fuzz entry: the bytes of a request frame after `frame_len`.
pub fn protocol_request(frame: &[u8]) {
    let _ = check_frame_len(frame.len().try_into().unwrap_or(u32::MAX));
    match decode_request(frame) {
        Ok((id, req)) => {
            assert_eq!(frame_head(frame), Some((id, req.api_key() as u16)));
            let mut out = Vec::new();
            encode_request(&mut out, id, &req).expect("a decoded request re-encodes");
            assert_eq!(&out[..LEN_FIELD], &(frame.len() as u32).to_be_bytes());
            assert_eq!(&out[LEN_FIELD..], frame);
            assert!(check_frame_len(frame.len() as u32).is_ok());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Fuzz entry: the bytes of a response frame after `frame_len`, decoded as every
/// protocol version lays it out.
pub fn protocol_response(frame: &[u8]) {
    let newest = decode_response(frame);
    assert_eq!(newest, decode_response_version(frame, PROTOCOL_VERSION));
    for version in PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION {
        check_response_version(frame, version);
    }
}

fn check_response_version(frame: &[u8], version: u16) {
    match decode_response_version(frame, version) {
        Ok(r) => {
            assert_eq!(frame_head(frame), Some((r.request_id, r.api_key)));
            assert_eq!(r.body.is_some(), r.code.is_ok());
            if let Some(b) = &r.body {
                // An idempotent produce is answered with a produce's body.
                let body_api = if r.api_key == ApiKey::IdempotentProduce as u16 {
                    ApiKey::Produce as u16
                } else {
                    r.api_key
                };
                assert_eq!(b.api_key() as u16, body_api);
                if let ResponseBody::DescribeTopic {
                    cleanup, health, ..
                } = b
                {
                    assert_eq!(cleanup.is_some(), version >= CLEANUP_INFO_VERSION);
                    assert_eq!(health.is_some(), version >= PARTITION_HEALTH_VERSION);
                }
            }
            let mut out = Vec::new();
            encode_response(
                &mut out,
                r.request_id,
                r.api_key,
                r.code,
                r.message,
                r.body.as_ref(),
            )
            .expect("a decoded response re-encodes");
            assert_eq!(&out[..LEN_FIELD], &(frame.len() as u32).to_be_bytes());
            assert_eq!(&out[LEN_FIELD..], frame);
            assert!(check_frame_len(frame.len() as u32).is_ok());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

// ---------------------------------------------------------------------------------
// Segment files and partition directories.

/// A partition directory to write: one segment under test, optionally followed by an
/// empty newer segment (so the first one is sealed).
#[derive(Clone, Debug)]
pub struct SegmentCase {
    pub base_offset: u64,
    pub log: Vec<u8>,
    pub index: Option<Vec<u8>>,
    /// Base offset of an empty newer segment written after it, if any.
    pub next_base: Option<u64>,
}

/// Fuzz entry: builds a segment from the bytes (literally, or as a recipe of valid
/// records, tails, flipped bytes and index choices) and checks it.
pub fn segment_scan(data: &[u8]) {
    let case = segment_case(data);
    check_segment_case(&case);
    check_recovery(&case);
}

/// Turns fuzz bytes into a [`SegmentCase`]. Flag bit 0 clear: the rest is a raw
/// `.log` (after an optional raw `.index`); set: a recipe.
pub fn segment_case(data: &[u8]) -> SegmentCase {
    let mut input = Input::new(data);
    let flags = input.u8();
    let sealed = flags & 2 != 0;
    if flags & 1 == 0 {
        let base_offset = u64::from(input.u8());
        let index = (flags & 4 != 0).then(|| {
            let n = usize::from(input.u8() % 32) * INDEX_ENTRY_LEN + usize::from(flags >> 7);
            input.bytes(n).to_vec()
        });
        let log = input.rest().to_vec();
        return SegmentCase {
            base_offset,
            index,
            next_base: sealed.then(|| next_base(&log, base_offset)).flatten(),
            log,
        };
    }
    let base_offset = match input.u8() % 4 {
        0 => 0,
        1 => u64::from(input.u16()),
        2 => u64::MAX - 1 - u64::from(input.u8() % 64),
        _ => input.u64(),
    };
    let generation = match input.u8() % 4 {
        0 => 0,
        1 => 1 + u64::from(input.u8() % 4),
        2 => u64::from(u32::MAX) + u64::from(input.u8() % 4),
        _ => input.u64(),
    };
    let mut log = SegmentHeader {
        base_offset,
        generation,
        flags: 0,
    }
    .encode()
    .to_vec();
    let records = input.u8() % 64;
    let mut offset = base_offset;
    for i in 0..records {
        let op = input.u8();
        offset = match op & 3 {
            0 if i == 0 => base_offset,
            0 => offset.wrapping_add(1),
            1 => offset,
            2 => offset.wrapping_add(2 + u64::from(input.u8())),
            _ => input.edgy_u64(),
        };
        let writer = if op & 4 != 0 {
            generation.wrapping_sub(1 + u64::from(input.u8() % 3))
        } else {
            generation
        };
        let key_len = usize::from(input.u8() % 16);
        let key = (op & 8 == 0).then(|| input.bytes(key_len));
        let value: Vec<u8> = if op & 16 != 0 {
            vec![op; usize::from(input.u16())]
        } else {
            let n = usize::from(input.u8() % 64);
            input.bytes(n).to_vec()
        };
        let timestamp = if op & 32 != 0 {
            input.u64() as i64
        } else {
            i64::from(i)
        };
        encode_record(&mut log, offset, timestamp, key, &value, writer).unwrap();
    }
    match input.u8() % 6 {
        0 => {}
        1 => log.resize(log.len() + usize::from(input.u16() % 9000), 0),
        2 => {
            let mut r = Vec::new();
            encode_record(&mut r, offset.wrapping_add(1), 0, None, b"torn", generation).unwrap();
            let cut = usize::from(input.u8()) % r.len();
            log.extend_from_slice(&r[..cut]);
        }
        3 => {
            let n = usize::from(input.u8());
            log.extend_from_slice(input.bytes(n));
        }
        4 => {
            log.extend_from_slice(&input.u32().to_be_bytes());
            let n = usize::from(input.u8());
            log.extend_from_slice(input.bytes(n));
        }
        _ => log.extend_from_slice(&[0, 0, 0][..usize::from(input.u8() % 4)]),
    }
    for _ in 0..input.u8() % 4 {
        let at = input.u32() as usize % log.len();
        log[at] ^= input.u8() | 1;
    }
    let cut = input.u8();
    if cut >= 250 {
        log.truncate(log.len().saturating_sub(usize::from(input.u16())));
    }
    let index = match input.u8() % 5 {
        0 => None,
        1 | 2 => Some(rule_index_bytes(&log)),
        3 => {
            let mut ix = rule_index_bytes(&log);
            match input.u8() % 3 {
                0 => ix.truncate(ix.len().saturating_sub(16)),
                1 if !ix.is_empty() => {
                    let at = input.u16() as usize % ix.len();
                    ix[at] ^= input.u8() | 1;
                }
                _ => ix.extend_from_slice(&[0xab; 16]),
            }
            Some(ix)
        }
        _ => {
            let n = usize::from(input.u8());
            Some(input.bytes(n).to_vec())
        }
    };
    SegmentCase {
        base_offset,
        next_base: sealed.then(|| next_base(&log, base_offset)).flatten(),
        log,
        index,
    }
}

/// Base offset for an empty segment after `log`: one past its last valid record.
fn next_base(log: &[u8], base_offset: u64) -> Option<u64> {
    oracle_scan(log)
        .and_then(|o| o.records.last().map(|r| r.1))
        .unwrap_or(base_offset)
        .checked_add(1)
        .filter(|&n| n > base_offset)
}

/// One record as the oracle saw it: position, offset, timestamp, key, value, length.
type SeenRecord = (u64, u64, i64, Option<Vec<u8>>, Vec<u8>, usize);

/// What a plain in-memory decoding loop finds in a segment.
#[derive(Debug)]
pub struct OracleScan {
    pub header: SegmentHeader,
    pub records: Vec<SeenRecord>,
    pub end: ScanEnd,
    pub data_end: u64,
    pub index: Vec<IndexEntry>,
}

/// Decodes a whole segment held in memory, record after record from byte 32, applying
/// the offset-order rule and the 4 KiB index rule. `None` when the header is bad.
pub fn oracle_scan(log: &[u8]) -> Option<OracleScan> {
    let header = SegmentHeader::decode(log).ok()?;
    let mut pos = HEADER_LEN;
    let mut records: Vec<SeenRecord> = Vec::new();
    let mut index: Vec<IndexEntry> = Vec::new();
    let end = loop {
        if pos >= log.len() {
            break ScanEnd::Eof;
        }
        match decode_record(&log[pos..], pos as u64, header.generation) {
            Ok(r) => {
                let prev = records.last().map(|s| s.1);
                let in_order = match prev {
                    Some(p) => r.offset > p,
                    None => r.offset >= header.base_offset,
                };
                if !in_order {
                    break ScanEnd::OffsetOrder {
                        position: pos as u64,
                        offset: r.offset,
                        previous: prev,
                        base_offset: header.base_offset,
                    };
                }
                let due = index
                    .last()
                    .is_none_or(|e| pos as u64 >= e.position + INDEX_INTERVAL_BYTES);
                if due {
                    index.push(IndexEntry {
                        relative_offset: r.offset - header.base_offset,
                        position: pos as u64,
                    });
                }
                records.push((
                    pos as u64,
                    r.offset,
                    r.timestamp_ms,
                    r.key.map(<[u8]>::to_vec),
                    r.value.to_vec(),
                    r.encoded_len,
                ));
                pos += r.encoded_len;
            }
            Err(e) => break ScanEnd::Record(e),
        }
    };
    Some(OracleScan {
        header,
        records,
        end,
        data_end: pos as u64,
        index,
    })
}

/// The records of a sealed segment that can be read, counted the slow way by the rule
/// of docs/FORMAT.md (Reading around damage): after a bad record, every later position
/// is tried until one holds a whole record that decodes, passes its CRC with the
/// segment's generation and has an offset above the last valid one and below
/// `next_base`; reading goes on from there.
pub fn oracle_readable_records(log: &[u8], next_base: Option<u64>) -> u64 {
    let Ok(header) = SegmentHeader::decode(log) else {
        return 0;
    };
    let generation = header.generation;
    let at = |q: usize| decode_record(log.get(q..).unwrap_or(&[]), q as u64, generation);
    let mut pos = HEADER_LEN;
    let mut last: Option<u64> = None;
    let mut count = 0u64;
    loop {
        let damage = loop {
            if pos >= log.len() {
                return count;
            }
            match at(pos) {
                Ok(r) if last.map_or(r.offset >= header.base_offset, |p| r.offset > p) => {
                    count += 1;
                    last = Some(r.offset);
                    pos += r.encoded_len;
                }
                _ => break pos,
            }
        };
        let min = match last {
            Some(p) => match p.checked_add(1) {
                Some(m) => m,
                None => return count,
            },
            None => header.base_offset,
        };
        let found = (damage + 1..log.len()).find(|&q| {
            matches!(at(q), Ok(r) if r.offset >= min && next_base.is_none_or(|nb| r.offset < nb))
        });
        match found {
            Some(q) => pos = q,
            None => return count,
        }
    }
}

/// The index file the rule gives for a segment (empty when its header is bad).
pub fn rule_index_bytes(log: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(o) = oracle_scan(log) {
        for e in &o.index {
            e.encode_into(&mut out);
        }
    }
    out
}

/// A directory removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base =
            std::env::var_os("SEGLOG_FUZZ_TMP").map_or_else(std::env::temp_dir, PathBuf::from);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("seglog-fuzz-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch dir");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(path: &Path, bytes: &[u8]) {
    let mut f = File::create(path).expect("create scratch file");
    f.write_all(bytes).expect("write scratch file");
}

/// Writes the case's files into `dir`.
fn write_case(dir: &Path, case: &SegmentCase) {
    write(&dir.join(log_file_name(case.base_offset)), &case.log);
    if let Some(ix) = &case.index {
        write(&dir.join(index_file_name(case.base_offset)), ix);
    }
    if let Some(next) = case.next_base {
        write(
            &dir.join(log_file_name(next)),
            &SegmentHeader::new(next).encode(),
        );
        write(&dir.join(index_file_name(next)), &[]);
    }
}

/// Writes the case as a partition directory and checks the reader, the scan and the
/// partition check against the in-memory oracle.
pub fn check_segment_case(case: &SegmentCase) {
    let dir = ScratchDir::new();
    write_case(&dir.0, case);
    let log_path = dir.0.join(log_file_name(case.base_offset));
    let file = File::open(&log_path).unwrap();
    let file_len = case.log.len() as u64;

    let header = read_header(&file, file_len).unwrap();
    assert_eq!(header, SegmentHeader::decode(&case.log));
    let oracle = oracle_scan(&case.log);
    if let (Ok(header), Some(oracle)) = (header, &oracle) {
        // The windowed reader, with a tiny and with the default window.
        for window in [64, 1 << 20] {
            let mut reader = RecordReader::with_window(
                &file,
                header.generation,
                HEADER_LEN as u64,
                file_len,
                window,
            );
            let mut seen = 0;
            loop {
                match reader.next_record().unwrap() {
                    Next::Record { position, record } => {
                        let want = oracle_record_at(&case.log, position, header.generation);
                        assert_eq!(Ok(record), want, "window {window}");
                        seen += 1;
                    }
                    Next::End(None) => {
                        assert_eq!(reader.position(), file_len);
                        break;
                    }
                    Next::End(Some(e)) => {
                        assert_eq!(e.position(), reader.position());
                        let want = oracle_record_at(&case.log, e.position(), header.generation);
                        assert_eq!(Err(e), want, "window {window}");
                        break;
                    }
                }
                assert!(seen <= case.log.len());
            }
        }
        let mut visited: Vec<SeenRecord> = Vec::new();
        let scan = scan_segment(&file, &header, file_len, |pos, r| {
            visited.push((
                pos,
                r.offset,
                r.timestamp_ms,
                r.key.map(<[u8]>::to_vec),
                r.value.to_vec(),
                r.encoded_len,
            ));
        })
        .unwrap();
        assert_eq!(visited, oracle.records);
        assert_eq!(scan.end, oracle.end);
        assert_eq!(scan.index, oracle.index);
        assert_eq!(scan.data_end, oracle.data_end);
        assert_eq!(scan.records, oracle.records.len() as u64);
        assert_eq!(scan.first_offset, oracle.records.first().map(|r| r.1));
        assert_eq!(scan.last_offset, oracle.records.last().map(|r| r.1));
        assert_eq!(
            scan.max_timestamp_ms,
            oracle.records.iter().map(|r| r.2).max()
        );
        assert_eq!(
            scan.has_gaps,
            oracle.records.windows(2).any(|w| w[1].1 != w[0].1 + 1)
        );
        match &scan.end {
            ScanEnd::Eof => assert_eq!(scan.data_end, file_len),
            end => assert_eq!(end.position(), Some(scan.data_end)),
        }
        let _ = scan.end.detail();

        // The quick check accepts the rule's own index of a clean segment, and never
        // disagrees with the full scan about the first record.
        let rule = rule_index_bytes(&case.log);
        let quick = quick_check(&file, &header, file_len, &rule).unwrap();
        if scan.end == ScanEnd::Eof && scan.records > 0 {
            assert_eq!(quick, scan.first_offset.zip(scan.last_offset));
        }
        if let Some(ix) = &case.index {
            check_index(ix, Some(file_len), oracle.records.last().map_or(0, |r| r.1));
            if let Some((first, last)) = quick_check(&file, &header, file_len, ix).unwrap() {
                assert_eq!(Some(first), scan.first_offset);
                assert!(last >= first);
            }
        }
    }

    let p = PartitionRef {
        dir: dir.0.clone(),
        topic: None,
        partition: None,
        config: TopicConfig::default(),
        only_segment: None,
    };
    for mode in [CheckMode::Full, CheckMode::Quick] {
        let check = check_partition(&p, mode).expect("check_partition");
        let expected_segments = 1 + usize::from(case.next_base.is_some());
        assert_eq!(check.segments.len(), expected_segments);
        let seg = &check.segments[0];
        assert_eq!(seg.active, case.next_base.is_none());
        let index_len = case.index.as_ref().map_or(0, Vec::len) as u64;
        for problem in check.all_problems() {
            let _ = problem.severity.as_str();
            let limit = if problem.file == log_path {
                file_len
            } else if problem.file.extension().is_some_and(|e| e == "index") {
                index_len
            } else {
                u64::MAX
            };
            assert!(
                problem.position.is_none_or(|p| p <= limit),
                "{problem:?} past {limit}"
            );
        }
        let Some(oracle) = &oracle else {
            assert!(seg.is_corrupt() || check.severity() == Some(Severity::Repairable));
            continue;
        };
        if oracle.header.base_offset != case.base_offset {
            assert!(seg.is_corrupt());
            continue;
        }
        if seg.trusted_by_index {
            assert_eq!(mode, CheckMode::Quick);
            assert_eq!(seg.first_offset, oracle.records.first().map(|r| r.1));
            continue;
        }
        // A sealed segment's records resume after damage; the active segment's data
        // ends at its first bad record.
        let readable = if seg.active {
            oracle.records.len() as u64
        } else {
            oracle_readable_records(&case.log, case.next_base)
        };
        assert_eq!(seg.records, Some(readable), "{:?}", seg.problems);
        assert_eq!(seg.data_end, oracle.data_end);
        let clean_index = case.index.as_deref() == Some(&rule_index_bytes(&case.log)[..]);
        if oracle.end == ScanEnd::Eof && clean_index {
            if oracle.records.is_empty() && case.next_base.is_some() {
                // A sealed segment without a record cannot tile: the next one starts
                // past its base, so the base offset is in no segment.
                assert_eq!(check.severity(), Some(Severity::Corrupt));
                assert!(
                    check
                        .all_problems()
                        .any(|p| p.kind == ProblemKind::SegmentsDoNotJoin),
                    "{:?}",
                    check.problems
                );
            } else {
                assert_eq!(check.severity(), None, "{:?}", check.problems);
            }
        }
        let damaged = !matches!(
            &oracle.end,
            ScanEnd::Eof
                | ScanEnd::Record(RecordError::Zero { .. } | RecordError::StaleGeneration { .. })
        );
        if damaged && !seg.active {
            assert!(seg.is_corrupt(), "{:?}", seg.problems);
        }
    }
}

/// Recovery of the case's partition: plans from the check, executes through the I/O
/// seam, and leaves nothing for a second run to do.
pub fn check_recovery(case: &SegmentCase) {
    use crate::engine::maintenance::recovery::{execute, plan_partition, RecoveryPlan};
    use crate::engine::storage::io::RealStorage;
    let dir = ScratchDir::new();
    write_case(&dir.0, case);
    let p = PartitionRef {
        dir: dir.0.clone(),
        topic: None,
        partition: None,
        config: TopicConfig::default(),
        only_segment: None,
    };
    let first = plan_partition(&p).expect("plan recovery");
    if let Some(o) = oracle_scan(&case.log) {
        if o.header.base_offset == case.base_offset {
            if let Some(last) = o.records.last().map(|r| r.1) {
                assert!(
                    first.next_offset > last || last == u64::MAX,
                    "next offset {} after a valid record at {last}",
                    first.next_offset
                );
            }
        }
    }
    let plan = RecoveryPlan {
        root: dir.0.clone(),
        partitions: vec![first],
        topics: Vec::new(),
    };
    execute(&RealStorage, &plan, None).expect("execute recovery");
    let again = plan_partition(&p).expect("plan recovery again");
    assert!(
        again.actions.is_empty(),
        "second recovery still acts: {:?}",
        again.actions
    );
}

fn oracle_record_at(
    log: &[u8],
    position: u64,
    generation: u64,
) -> Result<crate::format::RecordView<'_>, RecordError> {
    decode_record(
        log.get(position as usize..).unwrap_or(&[]),
        position,
        generation,
    )
}

// ---------------------------------------------------------------------------------
// Seeds: valid encodings the fuzzers and the mutation tests start from.

/// Valid records (with their generations) of assorted shapes.
pub fn seed_records() -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    for (i, (key, value, generation)) in [
        (None, &b"hello"[..], 0u64),
        (Some(&b""[..]), &b"v"[..], 0),
        (Some(&b"user-42"[..]), &b"{\"n\":1}"[..], 3),
        (Some(&b"user-42"[..]), &b""[..], u64::MAX),
        (None, &[0u8; 300][..], 1 << 32),
    ]
    .into_iter()
    .enumerate()
    {
        let mut bytes = Vec::new();
        encode_record(
            &mut bytes,
            i as u64,
            1_700_000_000_000,
            key,
            value,
            generation,
        )
        .unwrap();
        out.push((bytes, generation));
    }
    out
}

/// Valid request frames (after `frame_len`), one per API.
pub fn seed_request_frames() -> Vec<Vec<u8>> {
    let requests = [
        Request::Handshake {
            min_version: 1,
            max_version: 1,
            token: None,
        },
        Request::Produce {
            topic: "orders",
            partitions: vec![
                PartitionBatch {
                    partition: 0,
                    records: vec![
                        WireRecord {
                            timestamp_ms: 1_700_000_000_000,
                            key: Some(b"k1"),
                            value: b"v1",
                        },
                        WireRecord {
                            timestamp_ms: -5,
                            key: None,
                            value: b"",
                        },
                    ],
                },
                PartitionBatch {
                    partition: 7,
                    records: vec![],
                },
            ],
        },
        Request::Fetch {
            topic: "t",
            partition: 3,
            offset: 12,
            max_bytes: 1 << 20,
            max_wait_ms: 500,
        },
        Request::ListOffsets { topic: "t" },
        Request::CreateTopic {
            topic: "new",
            partitions: 4,
            settings: vec![("retention_ms", "-1")],
        },
        Request::DeleteTopic { topic: "old" },
        Request::ListTopics,
        Request::DescribeTopic { topic: "d" },
        Request::AlterTopic {
            topic: "a",
            settings: vec![("cleanup_policy", "compact")],
        },
        Request::Stats,
    ];
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut out = Vec::new();
            encode_request(&mut out, i as u32, r).unwrap();
            out.split_off(LEN_FIELD)
        })
        .collect()
}

/// Valid response frames (after `frame_len`), one per API plus an error response.
pub fn seed_response_frames() -> Vec<Vec<u8>> {
    let chunk = seed_records().swap_remove(2).0;
    let bodies = [
        ResponseBody::Handshake {
            version: 1,
            frame_bytes_max: FRAME_BYTES_MAX,
        },
        ResponseBody::Produce {
            partitions: vec![PartitionAck {
                partition: 0,
                code: ErrorCode::NONE,
                message: "",
                base_offset: 10,
                last_offset: 12,
            }],
        },
        ResponseBody::Fetch {
            start_offset: 0,
            end_offset: 100,
            chunks: vec![Chunk {
                generation: 3,
                bytes: &chunk,
            }],
        },
        ResponseBody::ListOffsets {
            partitions: vec![PartitionOffsets {
                partition: 0,
                start_offset: 1,
                end_offset: 2,
            }],
        },
        ResponseBody::CreateTopic,
        ResponseBody::DeleteTopic,
        ResponseBody::ListTopics {
            topics: vec!["a", "b"],
        },
        ResponseBody::DescribeTopic {
            partitions: vec![PartitionDescription {
                partition: 1,
                start_offset: 2,
                end_offset: 3,
                segments: 4,
                bytes: 5,
            }],
            settings: vec![("segment_bytes", "1024")],
            cleanup: None,
            health: None,
        },
        ResponseBody::DescribeTopic {
            partitions: vec![],
            settings: vec![],
            cleanup: Some(vec![CleanupInfo {
                partition: 0,
                last_retention_ms: -1,
                segments_deleted: 2,
                bytes_deleted: 4096,
                segments_archived: 0,
                last_compaction_ms: 1_700_000_000_000,
                compactions: 1,
                records_dropped: 9,
                bytes_compacted: 100,
                last_error: "disk full".to_string(),
            }]),
            health: None,
        },
        ResponseBody::DescribeTopic {
            partitions: vec![],
            settings: vec![],
            cleanup: Some(vec![]),
            health: Some(vec![PartitionHealth {
                partition: 0,
                records: 26,
                state: HealthState::Damaged,
                detail: "offsets 100..=199 lost".to_string(),
                spares: 0,
                preallocated_bytes: 0,
            }]),
        },
        ResponseBody::AlterTopic { settings: vec![] },
        ResponseBody::Stats(StatsBody {
            fsyncs: 1,
            produce_requests: 2,
            records_appended: 3,
            write: Some(WriteStats {
                fsync_latency_us: vec![0, 4, 9],
                rolls: 5,
                roll_stall_max_us: 6,
                zeroed_bytes: 7,
                spares_taken: 8,
                spares_returned: 9,
            }),
        }),
    ];
    let mut frames: Vec<Vec<u8>> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut out = Vec::new();
            encode_response(
                &mut out,
                i as u32,
                b.api_key() as u16,
                ErrorCode::NONE,
                "",
                Some(b),
            )
            .unwrap();
            out.split_off(LEN_FIELD)
        })
        .collect();
    let mut out = Vec::new();
    encode_response(
        &mut out,
        99,
        ApiKey::Fetch as u16,
        ErrorCode::UNKNOWN_TOPIC,
        "no topic \"x\"",
        None,
    )
    .unwrap();
    frames.push(out.split_off(LEN_FIELD));
    frames
}

/// Valid segment headers.
pub fn seed_headers() -> Vec<Vec<u8>> {
    [(0, 0), (147, 2), (u64::MAX, 3)]
        .into_iter()
        .map(|(base_offset, generation)| {
            SegmentHeader {
                base_offset,
                generation,
                flags: 0,
            }
            .encode()
            .to_vec()
        })
        .collect()
}

/// Valid `compaction.marker` and `topic.json` files.
pub fn seed_json() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let markers = vec![
        CompactionMarker {
            new: vec![0],
            replaced: vec![0, 147],
        }
        .encode(),
        br#"{"version": 1, "new": [], "replaced": ["00000000000000000600"]}"#.to_vec(),
    ];
    let mut config = TopicConfig::default();
    config.set_pair("cleanup_policy=compact,delete").unwrap();
    let topics = vec![
        TopicMeta {
            partitions: 3,
            config,
        }
        .encode(),
        br#"{"partitions": 1, "config": {"segment_bytes": "1024", "retention_ms": -1}}"#.to_vec(),
    ];
    (markers, topics)
}

/// Seed inputs for each fuzz target, in that target's input format.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "record" => seed_records()
            .into_iter()
            .map(|(bytes, generation)| {
                let mut v = vec![6u8];
                v.extend_from_slice(&generation.to_be_bytes());
                v.extend_from_slice(&bytes);
                v
            })
            .collect(),
        "segment_header" => seed_headers(),
        "index" => {
            let mut v = vec![1u8, 2, 0x10, 0, 3, 7];
            for (rel, pos) in [(0u64, 32u64), (40, 4200), (77, 8400)] {
                IndexEntry {
                    relative_offset: rel,
                    position: pos,
                }
                .encode_into(&mut v);
            }
            vec![v]
        }
        "compaction_marker" => seed_json().0,
        "topic_json" => seed_json().1,
        "protocol_request" => seed_request_frames(),
        "protocol_response" => seed_response_frames(),
        "names" => [
            "00000000000000000147.log",
            "00000000000000000147.index.tmp",
            "compaction.marker",
            "orders.v2",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        "segment_scan" => {
            // Recipes: a clean sealed segment with an index, and one with a torn tail.
            // Layout: flags, base, generation, count, records (op, key, value), tail,
            // flips, cut, index choice. See `segment_case`.
            let mut clean = vec![3, 1, 0x20, 0x00, 1, 2, 8];
            for _ in 0..8 {
                clean.extend_from_slice(&[0x10, 2, b'k', b'1', 0x08, 0x00]);
            }
            clean.extend_from_slice(&[0, 0, 0, 1]);
            let mut torn = vec![1, 0, 0, 3];
            for _ in 0..3 {
                torn.extend_from_slice(&[0, 1, b'a', 2, b'x', b'y']);
            }
            torn.extend_from_slice(&[2, 9, 0, 0, 0]);
            vec![clean, torn]
        }
        _ => Vec::new(),
    }
}

/// Names of the fuzz targets, matching `fuzz/fuzz_targets/<name>.rs`.
pub const TARGETS: [&str; 9] = [
    "record",
    "segment_header",
    "segment_scan",
    "index",
    "compaction_marker",
    "topic_json",
    "protocol_request",
    "protocol_response",
    "names",
];

/// Runs the property of the named fuzz target on one input.
pub fn run_target(target: &str, data: &[u8]) {
    match target {
        "record" => record(data),
        "segment_header" => segment_header(data),
        "segment_scan" => segment_scan(data),
        "index" => index(data),
        "compaction_marker" => compaction_marker(data),
        "topic_json" => topic_json(data),
        "protocol_request" => protocol_request(data),
        "protocol_response" => protocol_response(data),
        "names" => names(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

// ---------------------------------------------------------------------------------
// Handshake and authentication frames.

/// The one key of [`auth_frames`]'s store: id and secret.
pub const AUTH_KEY_ID: &str = "0123456789abcdef";
pub const AUTH_SECRET: [u8; 32] = [7; 32];

/// Fuzz entry for the handshake and API-key frames. First byte even: the rest is a
/// request frame (after `frame_len`); it must re-encode byte for byte, what it needs
/// must be computable for every role without a panic, an admin must be allowed it, and
/// a handshake's token must log in exactly when it is the store's one token. First
/// byte odd: the rest is a token; a token that parses must format back to itself.
pub fn auth_frames(data: &[u8]) {
    use crate::engine::keys::AuthError;
    use crate::format::keys::{format_token, parse_token};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 1 {
        let text = String::from_utf8_lossy(rest);
        if let Ok((id, secret)) = parse_token(&text) {
            assert_eq!(format_token(id, &secret), text.trim());
        }
        return;
    }
    protocol_request(rest);
    let Ok((_, req)) = decode_request(rest) else {
        return;
    };
    let store = auth_store();
    let good = format_token(AUTH_KEY_ID, &AUTH_SECRET);
    let peer = std::net::IpAddr::from([127, 0, 0, 1]);
    let admin = store
        .authenticate(&good, peer)
        .expect("the store's own token logs in");
    for (action, resource) in crate::engine::net::auth::needs(&req).into_iter().flatten() {
        assert!(admin.allows(action, resource));
    }
    if let Request::Handshake {
        token: Some(token), ..
    } = req
    {
        match store.authenticate(token, peer) {
            Ok(p) => {
                assert_eq!(token.trim(), good);
                assert_eq!(p.key_id(), AUTH_KEY_ID);
            }
            Err(AuthError::Failed) => assert_ne!(token.trim(), good),
            Err(e) => panic!("one failure cannot rate-limit: {e}"),
        }
    }
}

/// A store with one admin key ([`AUTH_KEY_ID`], [`AUTH_SECRET`]), in memory.
fn auth_store() -> crate::engine::keys::KeyStore {
    use crate::format::keys::{encode_hash, hash_secret, KeyEntry, KeysDoc, Role, KEYS_FORMAT};
    let doc = KeysDoc {
        format: KEYS_FORMAT,
        keys: vec![KeyEntry {
            id: AUTH_KEY_ID.to_string(),
            name: "fuzz".to_string(),
            role: Role::Admin,
            topics: vec![],
            groups: vec![],
            created_ms: 0,
            last_used_ms: -1,
            secret_sha256: encode_hash(&hash_secret(&AUTH_SECRET)),
        }],
    };
    crate::engine::keys::KeyStore::from_doc(
        std::sync::Arc::new(crate::engine::storage::io::RealStorage),
        Path::new("/nonexistent-seglog-fuzz"),
        doc,
    )
    .expect("a valid document")
}

/// Valid handshake and key frames to mutate (mode byte 0 first).
pub fn seed_auth_frames() -> Vec<Vec<u8>> {
    use crate::format::wire::keys::KeyRequest;
    let good = crate::format::keys::format_token(AUTH_KEY_ID, &AUTH_SECRET);
    let reqs = [
        Request::Handshake {
            min_version: 1,
            max_version: 3,
            token: Some(&good),
        },
        Request::Handshake {
            min_version: 3,
            max_version: 3,
            token: Some("sgk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        },
        Request::Key(KeyRequest::Create {
            name: "app",
            role: "producer",
            topics: vec!["orders.*"],
            groups: vec!["g?"],
        }),
        Request::Key(KeyRequest::Revoke { id: AUTH_KEY_ID }),
    ];
    reqs.iter()
        .map(|r| {
            let mut out = Vec::new();
            encode_request(&mut out, 1, r).expect("a seed encodes");
            let mut framed = vec![0u8];
            framed.extend_from_slice(&out[LEN_FIELD..]);
            framed
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// Kafka request frames.

/// Fuzz entry: the bytes of a Kafka request frame after its 4-byte size, through the
/// Kafka listener's decode path. A frame that decodes is a served API and version,
/// and re-encodes (header and body, by the crate) to a frame that decodes to the same
/// request; a produce's record batches go through the Produce path's batch decoding.
pub fn kafka_request(frame: &[u8]) {
    use crate::engine::net::kafka::{decode_produce_records, decode_request, served};
    use kafka_protocol::messages::RequestKind;
    use kafka_protocol::protocol::Encodable;

    let Ok(d) = decode_request(bytes::Bytes::copy_from_slice(frame)) else {
        return;
    };
    let (min, max) = served(d.api).expect("only served APIs decode");
    assert!((min..=max).contains(&d.version));
    let mut again = bytes::BytesMut::new();
    d.header
        .encode(&mut again, d.api.request_header_version(d.version))
        .expect("a decoded header re-encodes");
    d.request
        .encode(&mut again, d.version)
        .expect("a decoded request re-encodes");
    let twice = decode_request(again.freeze()).expect("a re-encoded request decodes");
    assert_eq!(twice.header, d.header);
    assert_eq!(twice.request, d.request);
    if let RequestKind::Produce(p) = d.request {
        for t in p.topic_data {
            for part in t.partition_data {
                if let Ok(counts) = decode_produce_records(part.records) {
                    assert!(counts.iter().all(|n| *n > 0));
                }
            }
        }
    }
}

/// Valid Kafka request frames (after the size) of every served API family, for the
/// randomized tests to cut and change.
pub fn seed_kafka_frames() -> Vec<Vec<u8>> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        ApiKey, ApiVersionsRequest, FetchRequest, JoinGroupRequest, MetadataRequest,
        ProduceRequest, RequestHeader, TopicName,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn frame(api: ApiKey, version: i16, body: &impl Encodable) -> Vec<u8> {
        let mut b = bytes::BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("fuzz")))
            .encode(&mut b, api.request_header_version(version))
            .expect("seed header");
        body.encode(&mut b, version).expect("seed body");
        b.to_vec()
    }
    let records: Vec<Record> = (0..3)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 1000 + i,
            key: Some(bytes::Bytes::from_static(b"k")),
            value: Some(bytes::Bytes::from_static(b"value")),
            headers: Default::default(),
        })
        .collect();
    let mut produces = Vec::new();
    for compression in [Compression::None, Compression::Gzip] {
        let mut batch = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut batch,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("seed batch");
        let mut p = ProduceRequest::default();
        p.acks = -1;
        let mut t = TopicProduceData::default();
        t.name = TopicName(StrBytes::from_static_str("t"));
        let mut part = PartitionProduceData::default();
        part.records = Some(batch.freeze());
        t.partition_data = vec![part];
        p.topic_data = vec![t];
        produces.push(frame(ApiKey::Produce, 7, &p));
        produces.push(frame(ApiKey::Produce, 9, &p));
    }
    let mut join = JoinGroupRequest::default();
    join.protocol_type = StrBytes::from_static_str("consumer");
    let mut v = vec![
        frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()),
        frame(ApiKey::Metadata, 9, &MetadataRequest::default()),
        frame(ApiKey::Fetch, 11, &FetchRequest::default()),
        frame(ApiKey::JoinGroup, 5, &join),
    ];
    v.extend(produces);
    v
}
