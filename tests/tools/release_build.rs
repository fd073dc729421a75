//! The shipped binary carries no test support. `cargo build --release` and `cargo
//! install` build it without the `testkit` feature, which `cargo test` turns on for
//! everything it builds (the crate's dev-dependency on itself), so the test builds
//! never show that the shipped one compiles, nor what it holds. Two checks:
//!
//! - the binary compiles without the feature: `cargo check --bin seglog`. It runs in
//!   the normal target directory, in the dev profile, so it reuses the dependencies
//!   `cargo clippy` checked (in CI it checks this crate alone, about 20 s, where a
//!   build in a target directory of its own rebuilt every dependency, about 3 min);
//! - test support is compiled only with the feature: the `testkit` module is
//!   declared only right below `#[cfg(feature = "testkit")]`, no planted flag is
//!   declared outside `src/testkit/`, and the feature is not a default one. (Code
//!   outside the module that uses it without the gate fails the first check: without
//!   the feature the module does not exist.)

use std::path::Path;
use std::process::Command;

const GATE: &str = "#[cfg(feature = \"testkit\")]";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_shipped_binary_compiles_without_test_support() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(manifest_dir())
        .args(["check", "--locked", "--bin", "seglog"])
        .output()
        .expect("run cargo check");
    assert!(
        out.status.success(),
        "cargo check --bin seglog (without the testkit feature) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The lines outside `src/testkit/` that declare the test support's module or a
/// planted flag without the gate right above them (doc comments and `#[doc]`
/// attributes between allowed), and how many gated ones there are.
fn ungated_mentions(src: &Path) -> (Vec<String>, usize) {
    let (mut ungated, mut gated) = (Vec::new(), 0);
    let sources = crate::util::fs::files(src);
    for (rel, bytes) in sources
        .iter()
        .filter(|(rel, _)| rel.ends_with(".rs") && !rel.starts_with("testkit/"))
    {
        let f = src.join(rel);
        let text = String::from_utf8_lossy(bytes);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim();
            if code.starts_with("//") || code.starts_with('#') {
                continue;
            }
            let names = code.contains("mod testkit")
                || (code.contains("static ") && code.to_ascii_lowercase().contains("planted"));
            if !names {
                continue;
            }
            let above = lines[..i].iter().rev().map(|l| l.trim()).find(|l| {
                !(l.starts_with("///") || l.starts_with("#[doc") || l == &"#[doc(hidden)]")
            });
            if above == Some(GATE) {
                gated += 1;
            } else {
                ungated.push(format!(
                    "{}:{}: {code}",
                    f.strip_prefix(manifest_dir()).unwrap_or(&f).display(),
                    i + 1
                ));
            }
        }
    }
    (ungated, gated)
}

#[test]
fn test_support_is_compiled_only_with_the_feature() {
    let (ungated, gated) = ungated_mentions(&manifest_dir().join("src"));
    assert!(
        ungated.is_empty(),
        "test support named outside src/testkit without {GATE} above it:\n{}",
        ungated.join("\n")
    );
    // The check can fail: it sees the module's declaration.
    assert_eq!(gated, 1, "gated declarations of testkit found: {gated}");
    let manifest = std::fs::read_to_string(manifest_dir().join("Cargo.toml")).unwrap();
    let default = manifest
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("default") && l.contains('='));
    assert!(
        default.is_none_or(|l| !l.contains("testkit")),
        "testkit is a default feature: {default:?}"
    );
}

/// The scan catches what it must: an ungated declaration and a planted flag outside
/// `src/testkit`.
#[test]
fn the_scan_finds_ungated_test_support() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("testkit")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        format!("{GATE}\n#[doc(hidden)]\npub mod testkit;\npub mod testkit_too;\n"),
    )
    .unwrap();
    std::fs::write(
        src.join("engine.rs"),
        "pub static PLANTED_X: AtomicBool = AtomicBool::new(false);\n",
    )
    .unwrap();
    std::fs::write(
        src.join("testkit").join("planted.rs"),
        "pub static PLANTED: u8 = 0;\n",
    )
    .unwrap();
    let (ungated, gated) = ungated_mentions(&src);
    assert_eq!(gated, 1, "{ungated:?}");
    assert_eq!(ungated.len(), 2, "{ungated:?}");
    assert!(
        ungated.iter().any(|l| l.contains("testkit_too")),
        "{ungated:?}"
    );
    assert!(
        ungated.iter().any(|l| l.contains("PLANTED_X")),
        "{ungated:?}"
    );
}
