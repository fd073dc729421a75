//! The real `seglog` binary: a command for it, its result as (exit code, stdout,
//! stderr), and comparisons that print what differs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Output;

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_seglog");

/// A command running the binary under test.
pub fn seglog() -> assert_cmd::Command {
    assert_cmd::Command::new(BIN)
}

/// What one run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn of(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
            stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
        }
    }

    /// Asserts the exit code; the message shows both streams.
    pub fn code(&self, want: i32) -> &Run {
        assert_eq!(
            self.code, want,
            "exit code {} (want {want})\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// Asserts stdout equals `want`, showing a line diff if not.
    pub fn stdout_is(&self, want: &str) -> &Run {
        assert_text("stdout", &self.stdout, want);
        self
    }

    /// Asserts stderr equals `want`, showing a line diff if not.
    pub fn stderr_is(&self, want: &str) -> &Run {
        assert_text("stderr", &self.stderr, want);
        self
    }
}

/// Runs the binary with `args` in `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Run {
    Run::of(seglog().current_dir(dir).args(args).output().unwrap())
}

/// Runs the binary with `args` in `dir`; returns (exit code, stdout, stderr).
pub fn run(args: &[&str], dir: &Path) -> (i32, String, String) {
    let r = run_in(dir, args);
    (r.code, r.stdout, r.stderr)
}

/// Asserts `got == want`; on a mismatch the message marks each differing line
/// (`-` expected, `+` got) with the line number.
pub fn assert_text(what: &str, got: &str, want: &str) {
    if got == want {
        return;
    }
    panic!("{what} differs:\n{}", diff(want, got));
}

/// A line-by-line comparison: common lines with two spaces, expected with `-`, got with `+`.
pub fn diff(want: &str, got: &str) -> String {
    let w: Vec<&str> = want.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for i in 0..w.len().max(g.len()) {
        match (w.get(i), g.get(i)) {
            (Some(a), Some(b)) if a == b => {
                let _ = writeln!(out, "  {:>4} {a}", i + 1);
            }
            (a, b) => {
                if let Some(a) = a {
                    let _ = writeln!(out, "- {:>4} {a}", i + 1);
                }
                if let Some(b) = b {
                    let _ = writeln!(out, "+ {:>4} {b}", i + 1);
                }
            }
        }
    }
    if want.ends_with('\n') != got.ends_with('\n') {
        out.push_str("(the final newline differs)\n");
    }
    out
}

/// Parses each line of `text` as JSON.
pub fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// Parses `text` (trimmed) as one JSON value.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}
