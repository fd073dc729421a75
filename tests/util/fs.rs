//! File trees: copy one, read one into memory to compare before and after.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Copies `from` into `to` recursively, leaving out `LOCK` (a copy is not locked).
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else if e.file_name() != "LOCK" {
            fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Every file below `dir` (path relative to `dir`) with its bytes, and every
/// directory below it (relative path and `/`) with no bytes, so that an empty
/// directory left behind shows too.
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if p.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                stack.push(p);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The committed fixture `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Flips bit `mask` of the byte at `pos` of `path` in place, fsynced (no truncation:
/// a running broker may have the file mapped).
pub fn flip_in_place(path: &Path, pos: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= mask;
    f.write_all_at(&b, pos).unwrap();
    f.sync_all().unwrap();
}
