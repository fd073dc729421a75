//! Segments, partitions and data directories built with `seglog::format`'s encoders,
//! byte for byte what the broker writes: a header, records, and the index the rule
//! gives.

use std::fs;
use std::path::{Path, PathBuf};

use seglog::format::names::{index_file_name, log_file_name};
use seglog::format::topic::{TopicConfig, TopicMeta};
use seglog::format::{encode_record, IndexBuilder, SegmentHeader};

/// One record as the tests describe it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rec {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// A segment being built in memory.
#[derive(Debug)]
pub struct Segment {
    pub base: u64,
    pub generation: u64,
    /// The log file: header then records.
    pub log: Vec<u8>,
    /// The index file the rule gives for `log`.
    pub index: Vec<u8>,
    /// Each record's (offset, position, encoded length).
    pub records: Vec<(u64, u64, usize)>,
    builder: IndexBuilder,
}

impl Segment {
    pub fn new(base: u64, generation: u64) -> Segment {
        Segment {
            base,
            generation,
            log: SegmentHeader {
                base_offset: base,
                generation,
                flags: 0,
            }
            .encode()
            .to_vec(),
            index: Vec::new(),
            records: Vec::new(),
            builder: IndexBuilder::new(),
        }
    }

    /// Appends one record; returns its encoded length.
    pub fn push(
        &mut self,
        offset: u64,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: &[u8],
    ) -> usize {
        let pos = self.log.len() as u64;
        if let Some(e) = self.builder.observe(self.base, offset, pos) {
            e.encode_into(&mut self.index);
        }
        let n = encode_record(
            &mut self.log,
            offset,
            timestamp_ms,
            key,
            value,
            self.generation,
        )
        .unwrap();
        self.records.push((offset, pos, n));
        n
    }

    /// Appends each record.
    pub fn with(mut self, records: &[Rec]) -> Segment {
        for r in records {
            self.push(r.offset, r.timestamp_ms, r.key.as_deref(), &r.value);
        }
        self
    }

    /// Writes the log and the index file, named after `base`, into `dir`.
    pub fn write(&self, dir: &Path) {
        fs::write(dir.join(log_file_name(self.base)), &self.log).unwrap();
        fs::write(dir.join(index_file_name(self.base)), &self.index).unwrap();
    }
}

/// A segment of `records`, generation `generation`.
pub fn segment(base: u64, generation: u64, records: &[Rec]) -> Segment {
    Segment::new(base, generation).with(records)
}

/// `DATA/topics/<topic>/topic.json` of `partitions` and `config`; returns the topic's
/// directory. The partition directories are the caller's.
pub fn topic(data: &Path, topic: &str, partitions: u32, config: TopicConfig) -> PathBuf {
    let dir = data.join("topics").join(topic);
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("topic.json"),
        TopicMeta { partitions, config }.encode(),
    )
    .unwrap();
    dir
}

/// `DATA/topics/<topic>/topic.json` with the given text; returns the directory of
/// partition 0, created.
pub fn topic_json(data: &Path, topic: &str, json: &str) -> PathBuf {
    let dir = data.join("topics").join(topic);
    let part = dir.join("0");
    fs::create_dir_all(&part).unwrap();
    fs::write(dir.join("topic.json"), json).unwrap();
    part
}

/// Bytes from lowercase or uppercase hex, two digits a byte.
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
