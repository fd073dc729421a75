//! `seglog serve` as a child process: started on a free port (`--listen
//! 127.0.0.1:0`, the address read back from its "listening on" line), driven with the
//! client commands, stopped with SIGTERM (must exit 0) or SIGKILL, and killed on drop.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::bin::BIN;

/// Generous bound for anything that should happen "soon": only a hung test waits it out.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A running `seglog serve`.
pub struct Serve {
    child: Option<Child>,
    pub addr: String,
    stderr: Arc<Mutex<String>>,
    /// The Kafka listener's address, when started with `--kafka-listen`.
    pub kafka_addr: Option<String>,
}

impl Serve {
    /// Serves `dir`; returns once the broker listens.
    pub fn start(dir: &Path) -> Serve {
        Serve::start_with(dir, &[])
    }

    /// Serves `dir` with `extra` flags; returns once the broker listens.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Serve {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra);
        Serve::spawn(cmd)
    }

    /// Runs `cmd` (a `seglog serve` that listens on 127.0.0.1, possibly started
    /// through a shell); returns once the broker listens.
    pub fn spawn(mut cmd: Command) -> Serve {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start seglog serve");
        let stderr = child.stderr.take().expect("stderr");
        let text = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&text);
        let kafka = Arc::new(Mutex::new(None));
        let kafka_sink = Arc::clone(&kafka);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("seglog: kafka listening on ") {
                    *kafka_sink.lock().unwrap() = Some(rest.trim().to_string());
                }
                if let Some(rest) = line.strip_prefix("seglog: listening on ") {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(addr.to_string());
                }
                let mut t = sink.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
            }
            // Dropping `tx` here ends the wait of a broker that exited before listening.
        });
        let Ok(addr) = rx.recv_timeout(PATIENCE) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the broker did not start: {}", text.lock().unwrap());
        };
        assert!(
            addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
            "{addr}"
        );
        let kafka_addr = kafka.lock().unwrap().clone();
        Serve {
            child: Some(child),
            addr,
            stderr: text,
            kafka_addr,
        }
    }

    /// What the broker wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (at most [`PATIENCE`]) until the broker's stderr contains `needle`, which
    /// a reader thread collects a moment after the broker writes it; returns whether
    /// it came.
    pub fn stderr_gets(&self, needle: &str) -> bool {
        let began = std::time::Instant::now();
        loop {
            if self.stderr().contains(needle) {
                return true;
            }
            if began.elapsed() > PATIENCE {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the broker.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let child = self.child.as_ref().unwrap();
        rustix::process::kill_process(rustix::process::Pid::from_child(child), signal).unwrap();
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// True while the broker process runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// The binary, pointed at this broker through `SEGLOG_BROKER`.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("SEGLOG_BROKER", &self.addr);
        c
    }

    /// Runs a client command with no input.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run seglog")
    }

    /// Runs a client command with `input` on stdin (none: stdin closed at once).
    pub fn run_with_stdin(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(text) = input {
            stdin.write_all(text.as_bytes()).unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        succeeded(args, self.run(args))
    }

    /// Runs a command that must succeed with `input` on stdin; returns its stdout.
    pub fn ok_with_stdin(&self, args: &[&str], input: &str) -> String {
        succeeded(args, self.run_with_stdin(args, Some(input)))
    }

    /// SIGTERM; the broker must exit 0.
    pub fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "broker exited with {status}: {}",
            self.stderr.lock().unwrap()
        );
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        let _ = child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn succeeded(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "seglog {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}
