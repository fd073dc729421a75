//! File and directory names: segment files, temporary files, topic and group names.

/// Digits in a segment file's base offset.
pub const SEGMENT_NAME_DIGITS: usize = 20;
/// Extension of a segment's log file.
pub const LOG_EXT: &str = "log";
/// Extension of a segment's index file.
pub const INDEX_EXT: &str = "index";
/// Suffix of a compaction result not yet renamed into place.
pub const TMP_SUFFIX: &str = ".tmp";
/// Name of the compaction marker file in a partition directory.
pub const COMPACTION_MARKER: &str = "compaction.marker";
/// Name of the lock file in a data directory.
pub const LOCK_FILE: &str = "LOCK";
/// Name of a topic's metadata file.
pub const TOPIC_FILE: &str = "topic.json";
/// Directory holding topics inside the data directory.
pub const TOPICS_DIR: &str = "topics";
/// Suffix of a topic directory being built (never part of a valid topic name).
pub const TOPIC_CREATING_SUFFIX: &str = "~new";
/// Suffix of a topic directory being removed (never part of a valid topic name).
pub const TOPIC_DELETING_SUFFIX: &str = "~del";
/// Directory of the node's spare segment files inside the data directory.
pub const SPARES_DIR: &str = "spares";
/// Prefix of a spare file's name: `spare-<20-digit sequence>.log`.
pub const SPARE_PREFIX: &str = "spare-";
/// Longest topic or group name.
pub const NAME_LEN_MAX: usize = 249;

/// The 20-digit stem of a segment: `00000000000000000147`.
pub fn segment_stem(base_offset: u64) -> String {
    format!("{base_offset:020}")
}

/// `00000000000000000147.log`
pub fn log_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.{LOG_EXT}")
}

/// `00000000000000000147.index`
pub fn index_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.{INDEX_EXT}")
}

/// `spare-00000000000000000007.log`: a spare file in `DATA/spares/`.
pub fn spare_file_name(seq: u64) -> String {
    format!("{SPARE_PREFIX}{seq:020}.{LOG_EXT}")
}

/// `applied-<partition>.json`: a replicated partition's Raft checkpoint, kept in its
/// topic directory (docs/FORMAT.md, Raft logs).
pub fn checkpoint_name(partition: u32) -> String {
    format!("applied-{partition}.json")
}

/// The partition of a name [`checkpoint_name`] gives (decimal, no leading zeros).
pub fn parse_checkpoint_name(name: &str) -> Option<u32> {
    let p = name.strip_prefix("applied-")?.strip_suffix(".json")?;
    p.parse::<u32>().ok().filter(|n| n.to_string() == p)
}

/// The sequence number of a name [`spare_file_name`] gives.
pub fn parse_spare_file_name(name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(SPARE_PREFIX)?
        .strip_suffix(LOG_EXT)?
        .strip_suffix('.')?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `<name>.tmp`: the name a file is written under before it is renamed to `name`
/// (compaction results, rewritten indexes, cleanup copies).
pub fn tmp_file_name(name: &str) -> String {
    format!("{name}{TMP_SUFFIX}")
}

/// Marks the unique temporary name of an atomic replace: `<name>.tmp-<pid>-<seq>`.
pub const ATOMIC_TMP_MARK: &str = ".tmp-";

/// Longest file name (bytes) the file systems seglog runs on take (Linux's
/// `NAME_MAX`).
pub const FILE_NAME_BYTES_MAX: usize = 255;

/// `<name>.tmp-<pid>-<seq>`: the unique temporary name of an atomic replace of
/// `name` (FORMAT: leftovers `*.tmp-*` are reported as repairable). When that is
/// longer than [`FILE_NAME_BYTES_MAX`] (a group file of a name of 239 characters or
/// more: `<name>.json` is up to 254 bytes), `<name>` is cut at its end to fit: the
/// name is still unique by its pid and sequence number, and still a leftover by its
/// `.tmp-`. Nothing reads the name back out of a temporary name.
pub fn atomic_tmp_file_name(name: &str, pid: u32, seq: u64) -> String {
    let tail = format!("{ATOMIC_TMP_MARK}{pid}-{seq}");
    let mut keep = name
        .len()
        .min(FILE_NAME_BYTES_MAX.saturating_sub(tail.len()));
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{tail}", name.get(..keep).unwrap_or_default())
}

/// True for a leftover of an atomic replace: any name matching `*.tmp-*` (what
/// [`atomic_tmp_file_name`] gives), or `.<name>.<pid>.<seq>.tmp`, the name earlier
/// versions gave, so that a directory they left one in is still repaired.
pub fn is_atomic_tmp_file_name(name: &str) -> bool {
    name.contains(ATOMIC_TMP_MARK) || is_legacy_atomic_tmp_file_name(name)
}

/// `.<name>.<pid>.<seq>.tmp`.
fn is_legacy_atomic_tmp_file_name(name: &str) -> bool {
    let Some(inner) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(TMP_SUFFIX))
    else {
        return false;
    };
    let mut parts = inner.rsplitn(3, '.');
    let seq = parts.next().unwrap_or_default();
    let pid = parts.next().unwrap_or_default();
    let base = parts.next().unwrap_or_default();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !base.is_empty() && digits(pid) && digits(seq)
}

/// `<topic>~new`: a topic directory being built.
pub fn creating_topic_dir_name(topic: &str) -> String {
    format!("{topic}{TOPIC_CREATING_SUFFIX}")
}

/// `<topic>~del`: a topic directory being removed.
pub fn deleting_topic_dir_name(topic: &str) -> String {
    format!("{topic}{TOPIC_DELETING_SUFFIX}")
}

/// What a file in a partition directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionFile {
    Log(u64),
    Index(u64),
    /// `<base>.log.tmp`: a compaction result not yet renamed into place.
    LogTmp(u64),
    /// `<base>.index.tmp`: a compaction or reindex result not yet renamed into place.
    IndexTmp(u64),
    Marker,
    /// Any other name ending in `.tmp`, or an atomic replace's leftover (`*.tmp-*`).
    OtherTmp,
    Unknown,
}

/// Parses a 20-digit segment stem.
pub fn parse_stem(stem: &str) -> Option<u64> {
    if stem.len() != SEGMENT_NAME_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Classifies a file name found in a partition directory.
pub fn classify_partition_file(name: &str) -> PartitionFile {
    if name == COMPACTION_MARKER {
        return PartitionFile::Marker;
    }
    if name.contains(ATOMIC_TMP_MARK) {
        return PartitionFile::OtherTmp;
    }
    let (base, tmp) = match name.strip_suffix(TMP_SUFFIX) {
        Some(b) => (b, true),
        None => (name, false),
    };
    let parsed = base
        .split_once('.')
        .and_then(|(stem, ext)| Some((parse_stem(stem)?, ext)));
    match (parsed, tmp) {
        (Some((b, LOG_EXT)), false) => PartitionFile::Log(b),
        (Some((b, INDEX_EXT)), false) => PartitionFile::Index(b),
        (Some((b, LOG_EXT)), true) => PartitionFile::LogTmp(b),
        (Some((b, INDEX_EXT)), true) => PartitionFile::IndexTmp(b),
        (_, true) => PartitionFile::OtherTmp,
        _ => PartitionFile::Unknown,
    }
}

/// Why a topic or group name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("name is empty")]
    Empty,
    #[error("name is {len} characters long (at most {NAME_LEN_MAX})")]
    TooLong { len: usize },
    #[error("name {name:?} is not allowed")]
    Dots { name: String },
    #[error("name {name:?} has the character {ch:?} at {at}; allowed are A-Z a-z 0-9 . _ -")]
    BadChar { name: String, ch: char, at: usize },
}

/// Validates a topic or group name: 1–249 characters of `[A-Za-z0-9._-]`, not `.`
/// or `..`. Anything else is refused before it touches the file system.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some((at, ch)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::BadChar {
            name: name.chars().take(64).collect(),
            ch,
            at,
        });
    }
    if name.len() > NAME_LEN_MAX {
        return Err(NameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots {
            name: name.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_tmp_names() {
        let name = atomic_tmp_file_name("topic.json", 12, 3);
        assert_eq!(name, "topic.json.tmp-12-3");
        assert!(is_atomic_tmp_file_name(&name));
        // The file of a group of the longest name: cut to fit, still a leftover.
        let group_file = format!("{}.json", "g".repeat(NAME_LEN_MAX));
        for (pid, seq) in [(1, 0), (4_194_304, 7), (u32::MAX, u64::MAX)] {
            let tmp = atomic_tmp_file_name(&group_file, pid, seq);
            assert!(
                tmp.len() <= FILE_NAME_BYTES_MAX,
                "{} bytes: {tmp}",
                tmp.len()
            );
            assert!(tmp.ends_with(&format!(".tmp-{pid}-{seq}")), "{tmp}");
            assert!(group_file.starts_with(tmp.split(".tmp-").next().unwrap()));
            assert!(is_atomic_tmp_file_name(&tmp), "{tmp}");
        }
        let tmp = atomic_tmp_file_name(&group_file, u32::MAX, u64::MAX);
        assert_eq!(tmp.len(), FILE_NAME_BYTES_MAX);
        // Cut on a character, never inside one.
        let tmp = atomic_tmp_file_name(&"é".repeat(200), 1, 2);
        assert!(
            tmp.len() <= FILE_NAME_BYTES_MAX && tmp.ends_with(".tmp-1-2"),
            "{tmp}"
        );
        // FORMAT's pattern is `*.tmp-*`; the name of earlier versions is still known.
        for leftover in ["x.tmp-", ".tmp-1", "g.json.tmp-abc", ".topic.json.12.3.tmp"] {
            assert!(is_atomic_tmp_file_name(leftover), "{leftover}");
        }
        for other in [
            "topic.json",
            ".topic.json.tmp",
            ".x.1.tmp",
            "x.1.2.tmp",
            ".x.a.2.tmp",
            "x.tmp",
            "x-tmp-1",
        ] {
            assert!(!is_atomic_tmp_file_name(other), "{other}");
        }
    }

    #[test]
    fn segment_names() {
        assert_eq!(log_file_name(147), "00000000000000000147.log");
        assert_eq!(index_file_name(u64::MAX), "18446744073709551615.index");
        assert_eq!(
            classify_partition_file("00000000000000000147.log"),
            PartitionFile::Log(147)
        );
        assert_eq!(
            classify_partition_file("00000000000000000147.index.tmp"),
            PartitionFile::IndexTmp(147)
        );
        assert_eq!(
            classify_partition_file("00000000000000000147.log.tmp"),
            PartitionFile::LogTmp(147)
        );
        assert_eq!(classify_partition_file("147.log"), PartitionFile::Unknown);
        assert_eq!(
            classify_partition_file("99999999999999999999.log"),
            PartitionFile::Unknown
        );
        assert_eq!(classify_partition_file("x.tmp"), PartitionFile::OtherTmp);
        assert_eq!(
            tmp_file_name(&log_file_name(3)),
            "00000000000000000003.log.tmp"
        );
        assert_eq!(
            classify_partition_file(&tmp_file_name(&index_file_name(3))),
            PartitionFile::IndexTmp(3)
        );
        assert_eq!(
            atomic_tmp_file_name(COMPACTION_MARKER, 7, 2),
            "compaction.marker.tmp-7-2"
        );
        assert_eq!(
            classify_partition_file(".compaction.marker.7.2.tmp"),
            PartitionFile::OtherTmp
        );
        assert_eq!(
            classify_partition_file("00000000000000000147.log.tmp-1-2"),
            PartitionFile::OtherTmp
        );
        assert_eq!(
            classify_partition_file(&atomic_tmp_file_name(COMPACTION_MARKER, 7, 2)),
            PartitionFile::OtherTmp
        );
        assert_eq!(creating_topic_dir_name("t"), "t~new");
        assert_eq!(deleting_topic_dir_name("t"), "t~del");
        assert!(validate_name(&creating_topic_dir_name("t")).is_err());
        assert!(validate_name(&deleting_topic_dir_name("t")).is_err());
        assert_eq!(
            classify_partition_file("compaction.marker"),
            PartitionFile::Marker
        );
    }

    #[test]
    fn names() {
        assert!(validate_name("orders-v2.eu_1").is_ok());
        assert!(validate_name(&"a".repeat(249)).is_ok());
        assert!(matches!(
            validate_name(&"a".repeat(250)),
            Err(NameError::TooLong { .. })
        ));
        assert!(matches!(validate_name(""), Err(NameError::Empty)));
        assert!(matches!(validate_name("."), Err(NameError::Dots { .. })));
        assert!(matches!(validate_name(".."), Err(NameError::Dots { .. })));
        assert!(matches!(
            validate_name("../x"),
            Err(NameError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            validate_name("a b"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(validate_name("é"), Err(NameError::BadChar { .. })));
    }
}
