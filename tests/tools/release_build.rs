//! The release binary carries no test support: built without the `testkit` feature
//! (as `cargo build --release` builds it), it has no symbol of the planted bugs or of
//! anything else under `src/testkit`. The build goes to its own target directory,
//! `target/release-nofeature`, because the binary under `target/release` is built by
//! `cargo test` with the feature on; that directory is kept, so later runs are
//! incremental.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/release-nofeature` next to the normal build outputs.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("release-nofeature")
}

fn build_release_without_testkit() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let dir = target_dir();
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", &dir)
        .args(["build", "--release", "--locked", "--bin", "seglog"])
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --release failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("release").join("seglog")
}

fn symbols(binary: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .arg(binary)
        .output()
        .expect("run nm (binutils)");
    assert!(
        out.status.success(),
        "nm {} failed:\n{}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_release_binary_has_no_test_support() {
    let binary = build_release_without_testkit();
    let syms = symbols(&binary);
    // The check can fail: the binary has its symbols, the engine's among them.
    assert!(
        syms.iter().any(|s| s.contains("write_file_atomic")),
        "no engine symbol in {} ({} symbols): stripped?",
        binary.display(),
        syms.len()
    );
    let leaked: Vec<&String> = syms
        .iter()
        .filter(|s| {
            let s = s.to_ascii_lowercase();
            s.contains("planted") || s.contains("testkit")
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "test support in the release binary: {leaked:#?}"
    );
}
