//! The shipped binary carries no test support: built without the `testkit` feature
//! (as `cargo build --release` and `cargo install` build it), it has no symbol of the
//! planted bugs or of anything else under `src/testkit`.
//!
//! The check builds the binary without optimisation: which code is compiled in is
//! decided by features, and features are the same in every profile. An unoptimised
//! build keeps every function it compiles as a symbol (nothing is inlined away), so it
//! is the stricter check, and it builds about three times faster than a release build
//! (1m50s against 5m34s from scratch on the 2-core CI machine), which is most of this
//! suite's time. It goes to its own target directory, `target/nofeature`, because the
//! binaries under `target/` are built by `cargo test` with the feature on; that
//! directory is kept, so later runs are incremental.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/nofeature` next to the normal build outputs.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("nofeature")
}

/// `cargo build --bin seglog` without the feature: the dev profile without debug
/// information (not needed for symbol names, and the slowest part of the link).
fn build_without_testkit() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let dir = target_dir();
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", &dir)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .args(["build", "--locked", "--bin", "seglog"])
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("debug").join("seglog")
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
fn the_shipped_binary_has_no_test_support() {
    let binary = build_without_testkit();
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
