//! Opening a partition's log as recovery left it: sealed segments trusted with their
//! index, the active segment scanned in full and fsynced before it is served.

use super::*;

// ----- opening -----

/// The base offsets of the `.log` files in `dir`, sorted, and the segments lost
/// between them. Refuses a directory with an unfinished compaction swap (recovery
/// finishes it).
pub(super) fn list_segments(dir: &Path) -> Result<(Vec<u64>, Vec<LostSegment>), EngineError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(format!("listing {}", dir.display()), e))?;
    let mut bases = Vec::new();
    let mut indexes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        match classify_partition_file(&name.to_string_lossy()) {
            PartitionFile::Log(b) => bases.push(b),
            PartitionFile::Index(b) => indexes.push(b),
            PartitionFile::Marker => {
                return Err(EngineError::Corrupt {
                    path: dir.to_path_buf(),
                    detail: "an unfinished compaction swap (compaction.marker) is present; run `seglog recover`".into(),
                })
            }
            _ => {}
        }
    }
    bases.sort_unstable();
    let lost = lost_segments(dir, &bases, indexes);
    Ok((bases, lost))
}

/// The offsets of a segment whose `.log` is gone while its `.index` is kept, between
/// the first and the newest segment (recovery's `lost_segment`, docs/FORMAT.md,
/// Recovery): its records, `first ..` the next segment's base, cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostSegment {
    /// The `.index` file left.
    pub index: PathBuf,
    pub first: u64,
    /// Base of the next segment present: the first offset readable again.
    pub next: u64,
}

fn lost_segments(dir: &Path, bases: &[u64], mut indexes: Vec<u64>) -> Vec<LostSegment> {
    indexes.sort_unstable();
    let (Some(&first), Some(&newest)) = (bases.first(), bases.last()) else {
        return Vec::new();
    };
    indexes
        .into_iter()
        .filter(|b| *b > first && *b < newest && bases.binary_search(b).is_err())
        .filter_map(|b| {
            let next = bases.get(bases.partition_point(|x| *x < b)).copied()?;
            Some(LostSegment {
                index: dir.join(index_file_name(b)),
                first: b,
                next,
            })
        })
        .collect()
}

/// Creates segment 0 in an empty partition directory and makes it durable:
/// 1. create the log (header) and index, 2. fsync the log, 3. fsync the directory.
pub(crate) fn create_first_segment(
    storage: &dyn Storage,
    dir: &Path,
    stats: &LogStats,
) -> Result<(), EngineError> {
    let ctx = || format!("creating the first segment in {}", dir.display());
    // 1.
    let (log, _index) = create_segment_files(storage, dir, 0, &SegmentHeader::new(0).encode())
        .map_err(|e| EngineError::io(ctx(), e))?;
    // 2.
    stats.fsyncs.fetch_add(2, Ordering::Relaxed);
    log.sync_all().map_err(|e| EngineError::io(ctx(), e))?;
    // 3.
    storage.sync_dir(dir).map_err(|e| EngineError::io(ctx(), e))
}

/// What is on disk at open may be only in the page cache (a process that was killed
/// wrote it and never fsynced), yet it is about to be served as durable:
/// 1. fsync every sealed log, 2. fsync the active log, 3. fsync the directory.
///
/// On a clean shutdown these find nothing dirty and are cheap.
pub(super) fn sync_on_open(
    storage: &dyn Storage,
    dir: &Path,
    segments: &[Arc<Segment>],
    active: &dyn StorageFile,
    stats: &LogStats,
) -> Result<(), EngineError> {
    let ctx = |p: &Path| format!("syncing {} at open", p.display());
    // 1.
    for seg in segments.iter().rev().skip(1) {
        let f = storage
            .open(&seg.path)
            .map_err(|e| EngineError::io(ctx(&seg.path), e))?;
        stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        f.sync_all()
            .map_err(|e| EngineError::io(ctx(&seg.path), e))?;
    }
    // 2.
    stats.fsyncs.fetch_add(2, Ordering::Relaxed);
    active
        .sync_all()
        .map_err(|e| EngineError::io(ctx(dir), e))?;
    // 3.
    storage
        .sync_dir(dir)
        .map_err(|e| EngineError::io(ctx(dir), e))
}

/// Reads and checks a segment's header; its base must match the file name.
pub(super) fn checked_header(
    file: &File,
    len: u64,
    path: &Path,
    base: u64,
) -> Result<SegmentHeader, EngineError> {
    let header = read_header(file, len)
        .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?
        .map_err(|e| EngineError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "{e}; run `seglog recover --salvage --backup-dir DIR DATA` to rebuild it from its records"
            ),
        })?;
    if header.base_offset != base {
        return Err(EngineError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "header base offset {} does not match the file name",
                header.base_offset
            ),
        });
    }
    Ok(header)
}

/// Reads an index file into memory, bounded by what the log's size allows.
pub(super) fn read_index_file(path: &Path, data_end: u64) -> Option<Vec<IndexEntry>> {
    let max_len = (data_end / INDEX_INTERVAL_BYTES + 1) * INDEX_ENTRY_LEN as u64;
    let meta = std::fs::metadata(path).ok()?;
    let len = meta.len();
    // Not a regular file (a FIFO would block the read): rebuilt from the log.
    if !meta.is_file() || len > max_len {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    decode_index(&bytes, Some(data_end)).ok()
}

/// Opens a sealed segment: its data ends at the end of the file; its index is read
/// from disk, or rebuilt in memory by a scan if unreadable.
pub(super) fn open_sealed(
    dir: &Path,
    base: u64,
    cache: &Arc<FileCache>,
    notes: &mut Vec<String>,
) -> Result<Segment, EngineError> {
    let path = dir.join(log_file_name(base));
    let io_err = |e| EngineError::io(format!("opening {}", path.display()), e);
    // Refuses anything but a regular file without blocking on it (a FIFO).
    let (file, len) = crate::engine::storage::reader::open_log(&path).map_err(io_err)?;
    let header = checked_header(&file, len, &path, base)?;
    let index = match read_index_file(&dir.join(index_file_name(base)), len) {
        Some(index) => index,
        None => {
            let scan = scan_segment(&file, &header, len, |_, _| {}).map_err(io_err)?;
            notes.push(format!(
                "{}: index missing or invalid, rebuilt in memory",
                path.display()
            ));
            scan.index
        }
    };
    Ok(Segment {
        base_offset: base,
        generation: header.generation,
        file: SegmentFile::cached(path.clone(), file, cache.clone()),
        path,
        index: RwLock::new(index),
        written_end: AtomicU64::new(len),
        readable_end: AtomicU64::new(len),
        max_timestamp: OnceLock::new(),
        records: AtomicU64::new(0),
        tally: RwLock::new(None),
    })
}

/// Opens the active segment: scans it in full, refuses a torn or corrupt tail,
/// brings its index file in line with the scan; reserves space ahead of its data up
/// to `segment_bytes` at most. Returns it and the next offset.
#[expect(
    clippy::too_many_arguments,
    reason = "the log's shared parts, passed in"
)]
pub(super) fn open_active(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    cache: &Arc<FileCache>,
    wp: &WritePath,
    journal: &Arc<JournalNeed>,
    segment_bytes: u64,
    notes: &mut Vec<String>,
) -> Result<(Active, u64), EngineError> {
    let path = dir.join(log_file_name(base));
    let io_err = |e| EngineError::io(format!("opening {}", path.display()), e);
    // Checked to be a regular file first: the read-write open below does not block
    // on a FIFO, but its reads would.
    let (file, len) = crate::engine::storage::reader::open_log(&path).map_err(io_err)?;
    let log: Arc<dyn StorageFile> = Arc::from(storage.open(&path).map_err(io_err)?);
    let header = checked_header(&file, len, &path, base)?;
    let mut first_ts = None;
    let scan = scan_segment(&file, &header, len, |_, r| {
        first_ts.get_or_insert(r.timestamp_ms);
    })
    .map_err(io_err)?;
    if !matches!(
        scan.end,
        ScanEnd::Eof | ScanEnd::Record(RecordError::Zero { .. })
    ) {
        return Err(EngineError::Corrupt {
            path,
            detail: format!(
                "active segment ends in a bad tail ({}); run `seglog recover`",
                scan.end.detail()
            ),
        });
    }
    let mut scan = scan;
    if planted!(ZEROS_AS_RECORDS) && matches!(scan.end, ScanEnd::Record(RecordError::Zero { .. })) {
        // The planted bug reads the zero tail as data: appends land past it.
        scan.data_end = len;
    }
    let index = sync_index_file(storage, dir, base, &scan.index, notes)?;
    let seg = Segment {
        base_offset: base,
        generation: header.generation,
        file: SegmentFile::held(path.clone(), file, cache.clone()),
        path,
        index: RwLock::new(scan.index.clone()),
        written_end: AtomicU64::new(scan.data_end),
        readable_end: AtomicU64::new(scan.data_end),
        max_timestamp: OnceLock::new(),
        records: AtomicU64::new(scan.records),
        tally: RwLock::new(None),
    };
    let now = now_ms();
    let active = Active {
        seg: Arc::new(seg),
        log,
        index: ActiveIndex::open(index),
        data_end: scan.data_end,
        file_len: len,
        index_len: (scan.index.len() * INDEX_ENTRY_LEN) as u64,
        builder: IndexBuilder::resume(scan.index.last().copied()),
        // The segment's age counts from its first record (clamped to now), like Kafka.
        born_ms: first_ts.map_or(now, |t: i64| t.min(now)),
        max_timestamp: scan.max_timestamp_ms,
        zero: Arc::new(ZeroTarget::new(
            path_of_active(dir, base),
            scan.data_end,
            len,
            0,
            journal.clone(),
        )),
    };
    // Recovery kept a zeroed tail (preallocated space) past the data: appends go there.
    // Nothing is reserved past the topic's `segment_bytes` (the next append rolls).
    active.zero.cap_at(segment_bytes.max(active.data_end));
    zero::preallocate(
        &*active.log,
        &active.zero,
        active.data_end,
        wp.preallocate_bytes.load(Ordering::Relaxed),
    );
    wp.register(&active.zero);
    // A record at u64::MAX leaves no offset to append at: refuse the partition.
    let next = match scan.last_offset {
        None => base,
        Some(last) => last.checked_add(1).ok_or_else(|| EngineError::Corrupt {
            path: dir.join(log_file_name(base)),
            detail: format!("a record has offset {last}, leaving no next offset"),
        })?,
    };
    Ok((active, next))
}

fn path_of_active(dir: &Path, base: u64) -> PathBuf {
    dir.join(log_file_name(base))
}

/// Makes the active segment's index file equal to `entries` (the index is derived
/// data, so no fsync: a crash leaves something recovery rebuilds).
pub(super) fn sync_index_file(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    entries: &[IndexEntry],
    notes: &mut Vec<String>,
) -> Result<Arc<dyn StorageFile>, EngineError> {
    let path = dir.join(index_file_name(base));
    let io_err = |e| EngineError::io(format!("writing {}", path.display()), e);
    let want = encode_index(entries);
    let opened = match storage.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => storage.create(&path).map_err(io_err)?,
        Err(e) => return Err(io_err(e)),
    };
    let file: Arc<dyn StorageFile> = Arc::from(opened);
    let len = file.len().map_err(io_err)?;
    let mut have = vec![0u8; usize::try_from(len.min(want.len() as u64)).unwrap_or(0)];
    let n = file.read_at(&mut have, 0).map_err(io_err)?;
    let prefix = n == have.len() && want.starts_with(&have);
    if len == want.len() as u64 && prefix {
        return Ok(file);
    }
    if prefix {
        file.write_at(want.get(have.len()..).unwrap_or(&[]), len)
            .map_err(io_err)?;
    } else {
        file.set_len(0).map_err(io_err)?;
        file.write_at(&want, 0).map_err(io_err)?;
    }
    file.set_len(want.len() as u64).map_err(io_err)?;
    notes.push(format!(
        "{}: index brought in line with the log ({} entries)",
        path.display(),
        entries.len()
    ));
    Ok(file)
}
