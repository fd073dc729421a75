//! `seglog damage`: makes damaged fixtures on purpose. One action per run, applied to
//! one file named relative to PATH, exactly the bytes asked for and nothing else; what
//! it did is printed as one JSON object. It takes `DATA/LOCK` like every tool that
//! modifies a data directory, so it refuses a directory a broker holds.
//!
//! Invariants: a FILE that is absolute, holds `..`, or resolves (through symlinks) to
//! something outside PATH is refused before anything is opened for writing; every
//! number is range-checked against the file before a byte changes; a write is
//! followed by an fsync of the file, a removal by an fsync of its directory.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::Context as _;
use serde_json::json;

use super::verify::resolve_target;
use super::{exit, hex, ExitError, Global};
use crate::engine::storage::io::{RealStorage, Storage, StorageFile};
use crate::engine::storage::layout::{Target, TargetKind};
use crate::engine::storage::lock::{DirLock, LockError};
use crate::format::names::{parse_stem, INDEX_EXT, LOG_EXT};

/// Ranges up to this many bytes are shown as hex in the report (before and after).
pub const SHOWN_BYTES_MAX: u64 = 64;
/// Zero and garbage bytes are written in chunks of this size.
const CHUNK_BYTES: usize = 64 * 1024;

/// Arguments of `seglog damage`.
#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("action")
        .required(true)
        .multiple(false)
        .args(["flip_bit", "truncate", "zero", "garbage", "drop_index"])),
    after_long_help = "A testing tool: damages a copy of a data directory in exactly one way, to \
make fixtures for `seglog verify --expect` and `seglog recover` tests. Never run it on data you \
want to keep.\n\n\
PATH is a directory: a data directory, a topic directory or a partition directory (a loose copy \
too), recognised as the other offline tools recognise it; a directory holding no seglog data is \
refused (64) and nothing in it is touched. FILE and SEGMENT are relative to PATH (for a data \
directory, e.g. topics/events/0/00000000000000000000.log) and name a file of PATH: anything below \
a data directory, a file of a topic directory or of one of its partition directories, a file \
directly in a partition directory. An absolute path, a path with `..`, one that leads outside \
PATH through a symlink, or a file elsewhere (a subdirectory of a partition) is refused (64). \
Byte positions count from 0; ranges are half-open (FROM included, TO excluded) and must lie \
inside the file. BIT 0 is the least significant bit of the byte.\n\n\
--garbage writes LEN bytes from SplitMix64 seeded with --seed (default 0): each 64-bit output in \
little-endian order, so the same seed gives the same bytes on every machine. --drop-index \
deletes the index of SEGMENT (its .log or .index file, or its name without extension).\n\n\
When PATH is in a data directory, damage takes DATA/LOCK (creating the empty LOCK file if \
missing) and refuses while a broker or another tool holds it; a loose partition copy has no \
lock. Each write is fsynced; a removal fsyncs the directory. Nothing else is touched.\n\n\
Prints one JSON object: {\"action\", \"file\", \"range\": {\"from\", \"to\"}, \"file_bytes_before\", \
\"file_bytes_after\", \"bytes_before\", \"bytes_after\"} (the range's bytes as hex when it is at \
most 64 bytes, else null), with \"bit\" for --flip-bit and \"seed\" for --garbage.\n\n\
Exit: 0 done; 64 a bad argument (the message names the value: a PATH holding no seglog data, a \
FILE outside PATH, a byte, bit, length or range outside the file); 73 the data directory is \
locked; 74 I/O error."
)]
pub struct Args {
    /// A data, topic or partition directory; FILE and SEGMENT are relative to it.
    pub path: PathBuf,
    /// Flip bit BIT (0-7, 0 = least significant) of byte BYTE of FILE.
    #[arg(long, value_name = "FILE:BYTE:BIT")]
    pub flip_bit: Option<String>,
    /// Cut FILE to LEN bytes (LEN shorter than the file).
    #[arg(long, value_name = "FILE:LEN")]
    pub truncate: Option<String>,
    /// Overwrite bytes FROM..TO (TO excluded) of FILE with zeros.
    #[arg(long, value_name = "FILE:FROM:TO")]
    pub zero: Option<String>,
    /// Overwrite LEN bytes of FILE from FROM with bytes made from --seed.
    #[arg(long, value_name = "FILE:FROM:LEN")]
    pub garbage: Option<String>,
    /// Seed of the --garbage bytes.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Delete the index file of SEGMENT (a .log or .index path, or the name without extension).
    #[arg(long, value_name = "SEGMENT")]
    pub drop_index: Option<String>,
}

/// One action, its numbers parsed but not yet checked against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    FlipBit { byte: u64, bit: u64 },
    Truncate { len: u64 },
    Zero { from: u64, to: u64 },
    Garbage { from: u64, len: u64, seed: u64 },
    DropIndex,
}

impl Action {
    fn name(&self) -> &'static str {
        match self {
            Action::FlipBit { .. } => "flip_bit",
            Action::Truncate { .. } => "truncate",
            Action::Zero { .. } => "zero",
            Action::Garbage { .. } => "garbage",
            Action::DropIndex => "drop_index",
        }
    }
}

/// Splits `FILE:N:M…` from the right into the file and one number per name (a FILE may
/// itself hold `:`).
fn split_spec<'a>(
    flag: &str,
    spec: &'a str,
    names: &[&str],
) -> anyhow::Result<(&'a str, Vec<u64>)> {
    let mut parts: Vec<&str> = spec.rsplitn(names.len() + 1, ':').collect();
    parts.reverse();
    let form = format!("FILE:{}", names.join(":"));
    let Some((file, nums)) = parts.split_first().filter(|(_, n)| n.len() == names.len()) else {
        return Err(ExitError::usage(format!(
            "--{flag} '{spec}' is not of the form {form}"
        )));
    };
    if file.is_empty() {
        return Err(ExitError::usage(format!(
            "--{flag} '{spec}': FILE is empty"
        )));
    }
    let mut out = Vec::new();
    for (name, text) in names.iter().zip(nums) {
        let n = text.parse::<u64>().map_err(|_| {
            ExitError::usage(format!(
                "--{flag} '{spec}': {name} '{text}' is not a whole number"
            ))
        })?;
        out.push(n);
    }
    Ok((file, out))
}

/// The action and the FILE it names (relative to PATH, unchecked).
fn parse(args: &Args) -> anyhow::Result<(Action, String)> {
    if let (Some(seed), None) = (args.seed, &args.garbage) {
        return Err(ExitError::usage(format!(
            "--seed {seed} is only for --garbage"
        )));
    }
    let num = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    if let Some(spec) = &args.flip_bit {
        let (file, v) = split_spec("flip-bit", spec, &["BYTE", "BIT"])?;
        let bit = num(&v, 1);
        if bit > 7 {
            return Err(ExitError::usage(format!(
                "--flip-bit '{spec}': bit {bit} is not 0-7"
            )));
        }
        return Ok((
            Action::FlipBit {
                byte: num(&v, 0),
                bit,
            },
            file.to_string(),
        ));
    }
    if let Some(spec) = &args.truncate {
        let (file, v) = split_spec("truncate", spec, &["LEN"])?;
        return Ok((Action::Truncate { len: num(&v, 0) }, file.to_string()));
    }
    if let Some(spec) = &args.zero {
        let (file, v) = split_spec("zero", spec, &["FROM", "TO"])?;
        let (from, to) = (num(&v, 0), num(&v, 1));
        if from >= to {
            return Err(ExitError::usage(format!(
                "--zero '{spec}': FROM {from} is not before TO {to}"
            )));
        }
        return Ok((Action::Zero { from, to }, file.to_string()));
    }
    if let Some(spec) = &args.garbage {
        let (file, v) = split_spec("garbage", spec, &["FROM", "LEN"])?;
        let (from, len) = (num(&v, 0), num(&v, 1));
        if len == 0 {
            return Err(ExitError::usage(format!(
                "--garbage '{spec}': LEN 0 writes nothing"
            )));
        }
        let seed = args.seed.unwrap_or(0);
        return Ok((Action::Garbage { from, len, seed }, file.to_string()));
    }
    if let Some(segment) = &args.drop_index {
        return Ok((Action::DropIndex, index_of(segment)?));
    }
    Err(ExitError::usage(
        "one of --flip-bit, --truncate, --zero, --garbage, --drop-index is needed",
    ))
}

/// The index file of a SEGMENT argument: `…/NAME.log`, `…/NAME.index` or `…/NAME`.
fn index_of(segment: &str) -> anyhow::Result<String> {
    let stem = segment
        .strip_suffix(&format!(".{LOG_EXT}"))
        .or_else(|| segment.strip_suffix(&format!(".{INDEX_EXT}")))
        .unwrap_or(segment);
    let name = Path::new(stem)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if parse_stem(&name).is_none() {
        return Err(ExitError::usage(format!(
            "--drop-index '{segment}' does not name a segment (a .log or .index file, or its 20-digit name)"
        )));
    }
    Ok(format!("{stem}.{INDEX_EXT}"))
}

/// Checks FILE against PATH and returns the file's real path. Refused (64): an
/// absolute path, `..`, a file that does not exist or is not a regular file, and one
/// that leads outside PATH through a symlink.
fn contained(root: &Path, file: &str) -> anyhow::Result<PathBuf> {
    let rel = Path::new(file);
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(ExitError::usage(format!(
                    "'{file}' is not a path inside {}: FILE must be relative to PATH, without `..`",
                    root.display()
                )));
            }
        }
    }
    let joined = root.join(rel);
    let real = match joined.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ExitError::usage(format!(
                "no file '{file}' in {}",
                root.display()
            )));
        }
        Err(e) => return Err(anyhow::Error::new(e).context(joined.display().to_string())),
    };
    let real_root = root
        .canonicalize()
        .with_context(|| root.display().to_string())?;
    if !real.starts_with(&real_root) {
        return Err(ExitError::usage(format!(
            "'{file}' leads outside {} (to {})",
            root.display(),
            real.display()
        )));
    }
    if !real.is_file() {
        return Err(ExitError::usage(format!(
            "'{file}' in {} is not a regular file",
            root.display()
        )));
    }
    Ok(real)
}

/// Refuses (64) a FILE that is not where the resolved PATH keeps its files: a
/// partition's files lie directly in its directory, a topic's in the topic directory
/// or one of its partition directories; a data directory holds anything below it.
/// `real` and `root` are canonical.
fn check_inside(target: &Target, root: &Path, real: &Path, file: &str) -> anyhow::Result<()> {
    let parent = real.parent().unwrap_or(real);
    let inside = match target.kind {
        TargetKind::DataDir => real.starts_with(root),
        TargetKind::Topic => {
            parent == root
                || target.topics.iter().any(|t| {
                    t.partition_dirs
                        .iter()
                        .any(|p| parent == root.join(p.to_string()))
                })
        }
        TargetKind::Partition | TargetKind::LogFile => parent == root,
    };
    if inside {
        return Ok(());
    }
    let what = match target.kind {
        TargetKind::DataDir => "the data directory",
        TargetKind::Topic => "the topic directory or one of its partition directories",
        TargetKind::Partition | TargetKind::LogFile => "the partition directory",
    };
    Err(ExitError::usage(format!(
        "'{file}' is not a file of {what} {}",
        root.display()
    )))
}

/// SplitMix64 (Steele, Lea, Flood 2014): the documented source of `--garbage` bytes.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Fills `buf`, continuing the stream of 8-byte little-endian words; `carry` holds
    /// the unused bytes of the last word between calls.
    fn fill(&mut self, buf: &mut [u8], carry: &mut Vec<u8>) {
        for b in buf.iter_mut() {
            if carry.is_empty() {
                carry.extend(self.next_u64().to_le_bytes().iter().rev());
            }
            *b = carry.pop().unwrap_or(0);
        }
    }
}

/// Reads `from..to` of `file` for the report, when the range is small.
fn shown(file: &dyn StorageFile, from: u64, to: u64) -> anyhow::Result<Option<String>> {
    if to.saturating_sub(from) > SHOWN_BYTES_MAX {
        return Ok(None);
    }
    let mut buf = vec![0u8; (to - from) as usize];
    let n = file.read_at(&mut buf, from)?;
    buf.truncate(n);
    Ok(Some(hex(&buf)))
}

/// Writes `len` bytes from `from`, chunk by chunk, each made by `make`.
fn write_chunks(
    file: &dyn StorageFile,
    from: u64,
    len: u64,
    make: &mut dyn FnMut(&mut [u8]),
) -> io::Result<()> {
    let mut done = 0u64;
    let mut buf = vec![0u8; CHUNK_BYTES];
    while done < len {
        let n = (len - done).min(CHUNK_BYTES as u64) as usize;
        let chunk = buf.get_mut(..n).unwrap_or_default();
        make(chunk);
        file.write_at(chunk, from + done)?;
        done += n as u64;
    }
    Ok(())
}

/// `--{flag} 'FILE…'` for error messages.
fn flag_of(action: &Action) -> &'static str {
    match action {
        Action::FlipBit { .. } => "--flip-bit",
        Action::Truncate { .. } => "--truncate",
        Action::Zero { .. } => "--zero",
        Action::Garbage { .. } => "--garbage",
        Action::DropIndex => "--drop-index",
    }
}

/// Checks the action's numbers against the file's length: the range it changes.
fn range_in(action: &Action, file: &str, file_len: u64) -> anyhow::Result<(u64, u64)> {
    let flag = flag_of(action);
    let bad =
        |what: String| ExitError::usage(format!("{flag}: {what} ('{file}' is {file_len} bytes)"));
    match *action {
        Action::FlipBit { byte, .. } => {
            if byte >= file_len {
                return Err(bad(format!("byte {byte} is past the end of the file")));
            }
            Ok((byte, byte + 1))
        }
        Action::Truncate { len } => {
            if len >= file_len {
                return Err(bad(format!("length {len} is not shorter than the file")));
            }
            Ok((len, file_len))
        }
        Action::Zero { from, to } => {
            if to > file_len {
                return Err(bad(format!("TO {to} is past the end of the file")));
            }
            Ok((from, to))
        }
        Action::Garbage { from, len, .. } => match from.checked_add(len) {
            Some(to) if to <= file_len => Ok((from, to)),
            _ => Err(bad(format!(
                "FROM {from} + LEN {len} is past the end of the file"
            ))),
        },
        Action::DropIndex => Ok((0, file_len)),
    }
}

pub fn run(args: Args, _global: Global) -> anyhow::Result<u8> {
    let (action, file) = parse(&args)?;
    if !args.path.is_dir() {
        return Err(ExitError::usage(format!(
            "{} is not a directory (PATH is a data, topic or partition directory)",
            args.path.display()
        )));
    }
    // PATH must hold seglog data, as for every offline tool (64 and nothing created
    // otherwise), and FILE must be one of its files.
    let target = resolve_target(&args.path)?;
    let real = contained(&args.path, &file)?;
    let real_root = args
        .path
        .canonicalize()
        .with_context(|| args.path.display().to_string())?;
    check_inside(&target, &real_root, &real, &file)?;
    let _lock = match target.root_is_data_dir {
        true => Some(DirLock::acquire(&target.root).map_err(|e| match e {
            LockError::Held { path } => ExitError::new(
                exit::LOCKED,
                format!(
                    "{} is held by a running broker or another tool; damage only a copy nobody serves",
                    path.display()
                ),
            ),
            other => anyhow::Error::new(other),
        })?),
        false => None,
    };
    let storage = RealStorage;
    let f = storage
        .open(&real)
        .with_context(|| format!("opening {}", real.display()))?;
    let file_len = f.len()?;
    let (from, to) = range_in(&action, &file, file_len)?;
    let before = shown(&*f, from, to)?;
    let mut report = json!({
        "action": action.name(),
        "file": file,
        "range": {"from": from, "to": to},
        "file_bytes_before": file_len,
    });
    let context = || format!("damaging {}", real.display());
    match action {
        Action::FlipBit { byte, bit } => {
            let mut b = [0u8; 1];
            f.read_at(&mut b, byte).with_context(context)?;
            b[0] ^= 1 << bit;
            f.write_at(&b, byte).with_context(context)?;
            f.sync_all().with_context(context)?;
            report["bit"] = json!(bit);
        }
        Action::Truncate { len } => {
            f.set_len(len).with_context(context)?;
            f.sync_all().with_context(context)?;
        }
        Action::Zero { from, to } => {
            write_chunks(&*f, from, to - from, &mut |c| c.fill(0)).with_context(context)?;
            f.sync_all().with_context(context)?;
        }
        Action::Garbage { from, len, seed } => {
            let mut rng = SplitMix64(seed);
            let mut carry = Vec::new();
            write_chunks(&*f, from, len, &mut |c| rng.fill(c, &mut carry)).with_context(context)?;
            f.sync_all().with_context(context)?;
            report["seed"] = json!(seed);
        }
        Action::DropIndex => {
            drop(f);
            // 1. remove the index, 2. fsync its directory so the removal is durable.
            storage.remove_file(&real).with_context(context)?;
            if let Some(dir) = real.parent() {
                storage.sync_dir(dir).with_context(context)?;
            }
            report["file_bytes_after"] = json!(null);
            report["bytes_before"] = json!(before);
            report["bytes_after"] = json!(null);
            return print(&report);
        }
    }
    let after_len = f.len()?;
    let after = match action {
        Action::Truncate { .. } => before.as_ref().map(|_| String::new()),
        _ => shown(&*f, from, to)?,
    };
    report["file_bytes_after"] = json!(after_len);
    report["bytes_before"] = json!(before);
    report["bytes_after"] = json!(after);
    print(&report)
}

fn print(report: &serde_json::Value) -> anyhow::Result<u8> {
    let mut out = io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string_pretty(report)?)?;
    out.flush()?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        // The first outputs for seed 0 of the reference implementation.
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let mut a = SplitMix64(7);
        let (mut c1, mut c2) = (Vec::new(), Vec::new());
        let mut whole = [0u8; 20];
        a.fill(&mut whole, &mut c1);
        let mut b = SplitMix64(7);
        let (mut p1, mut p2) = ([0u8; 3], [0u8; 17]);
        b.fill(&mut p1, &mut c2);
        b.fill(&mut p2, &mut c2);
        assert_eq!(&whole[..3], &p1);
        assert_eq!(&whole[3..], &p2);
        assert_eq!(&whole[..8], &SplitMix64(7).next_u64().to_le_bytes());
    }

    #[test]
    fn specs_split_from_the_right() {
        let (f, n) = split_spec("zero", "a:b.log:1:2", &["FROM", "TO"]).unwrap();
        assert_eq!((f, n), ("a:b.log", vec![1, 2]));
        assert!(split_spec("zero", "x.log:1", &["FROM", "TO"]).is_err());
        assert!(split_spec("zero", ":1:2", &["FROM", "TO"]).is_err());
        assert!(split_spec("zero", "x:1:y", &["FROM", "TO"]).is_err());
    }

    #[test]
    fn drop_index_names() {
        let want = "topics/t/0/00000000000000000030.index";
        assert_eq!(
            index_of("topics/t/0/00000000000000000030.log").unwrap(),
            want
        );
        assert_eq!(
            index_of("topics/t/0/00000000000000000030.index").unwrap(),
            want
        );
        assert_eq!(index_of("topics/t/0/00000000000000000030").unwrap(), want);
        assert!(index_of("topics/t/0/topic.json").is_err());
    }
}
