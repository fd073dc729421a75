//! Binary-safe clients against a real broker: arbitrary bytes round-trip through
//! `produce --value-file`/`-0`/`--delimiter` and `consume --raw`/`--format`, CRLF
//! stripping, `--from -N`, `--from-time`, and an all-partition read where one
//! partition is shorter than `--from`.

use std::io::Write;
use std::process::{Output, Stdio};

use crate::util::rng::{seed_or, with_seed, Rng};
use crate::util::serve::Serve;

/// Runs a client command with raw `input` on stdin; returns its output.
fn run_bytes(b: &Serve, args: &[&str], input: &[u8]) -> Output {
    let mut child = b
        .cmd()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A command refused before it reads stdin closes the pipe: that write may fail.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// Runs a command that must succeed; returns its stdout as bytes.
fn ok_bytes(b: &Serve, args: &[&str], input: &[u8]) -> Vec<u8> {
    let out = run_bytes(b, args, input);
    assert!(
        out.status.success(),
        "seglog {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A value of 0..300 bytes, rich in NUL, `\r`, `\n` and 0xFF; without NUL if `no_nul`.
fn random_value(rng: &mut Rng, no_nul: bool) -> Vec<u8> {
    let len = rng.below(300) as usize;
    (0..len)
        .map(|_| {
            let b = match rng.below(6) {
                0 => 0,
                1 => b'\r',
                2 => b'\n',
                3 => 0xff,
                _ => rng.below(256) as u8,
            };
            if no_nul && b == 0 {
                1
            } else {
                b
            }
        })
        .collect()
}

/// Splits `%S:%s` output (length, colon, bytes) back into values.
fn length_prefixed(mut out: &[u8]) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    while !out.is_empty() {
        let colon = out.iter().position(|&c| c == b':').expect("a length");
        let len: usize = std::str::from_utf8(&out[..colon]).unwrap().parse().unwrap();
        values.push(out[colon + 1..colon + 1 + len].to_vec());
        out = &out[colon + 1 + len..];
    }
    values
}

#[test]
fn random_binary_values_round_trip_byte_for_byte() {
    let seed = seed_or(13);
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "bin"]);
    b.ok(&["topics", "create", "nul"]);
    let files_path = files.path().to_path_buf();
    let addr = &b;
    with_seed(
        seed,
        std::panic::AssertUnwindSafe(|| {
            let mut rng = Rng::new(seed);
            // One record per --value-file: every byte value allowed.
            let mut sent = Vec::new();
            for i in 0..20 {
                let value = random_value(&mut rng, false);
                let path = files_path.join(format!("v{i}"));
                std::fs::write(&path, &value).unwrap();
                ok_bytes(
                    addr,
                    &["produce", "bin", "--value-file", path.to_str().unwrap()],
                    b"",
                );
                sent.push(value);
            }
            let framed = ok_bytes(addr, &["consume", "bin", "--format", "%S:%s"], b"");
            assert_eq!(length_prefixed(&framed), sent);
            let one = ok_bytes(
                addr,
                &["consume", "bin", "--raw", "--from", "7", "--count", "1"],
                b"",
            );
            assert_eq!(one, sent[7]);
            let joined = ok_bytes(addr, &["consume", "bin", "--raw"], b"");
            assert_eq!(joined, sent.concat());

            // NUL-separated stdin, several records per request.
            let values: Vec<Vec<u8>> = (0..50).map(|_| random_value(&mut rng, true)).collect();
            let mut input = Vec::new();
            for v in &values {
                input.extend_from_slice(v);
                input.push(0);
            }
            ok_bytes(addr, &["produce", "nul", "-0", "--batch", "7"], &input);
            let back = ok_bytes(
                addr,
                &["consume", "nul", "--raw", "--delimiter", "\\0"],
                b"",
            );
            assert_eq!(back, input);
            let framed = ok_bytes(addr, &["consume", "nul", "--format", "%V:%v"], b"");
            assert_eq!(length_prefixed(&framed), values);

            // A binary key from a file.
            let key: Vec<u8> = vec![0, b'\n', 0xff, b'\r'];
            let key_path = files_path.join("key");
            std::fs::write(&key_path, &key).unwrap();
            ok_bytes(
                addr,
                &[
                    "produce",
                    "nul",
                    "--key-file",
                    key_path.to_str().unwrap(),
                    "--value",
                    "v",
                ],
                b"",
            );
            let out = ok_bytes(
                addr,
                &["consume", "nul", "--from", "-1", "--format", "%K:%k|%s"],
                b"",
            );
            assert_eq!(out, [b"4:".as_slice(), &key, b"|v"].concat());
        }),
    );
    b.stop();
}

#[test]
fn delimiters_and_crlf() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "crlf"]);
    ok_bytes(&b, &["produce", "crlf", "--strip-cr"], b"a\r\nb\r\nc\n");
    ok_bytes(&b, &["produce", "crlf"], b"kept\r\n");
    ok_bytes(
        &b,
        &["produce", "crlf", "--delimiter", "\\r\\n"],
        b"x\ny\r\nz\r\n",
    );
    ok_bytes(
        &b,
        &["produce", "crlf", "--value-file", "-"],
        b"all\nof\nstdin\n",
    );
    let out = ok_bytes(&b, &["consume", "crlf", "--delimiter", "|"], b"");
    assert_eq!(out, b"a|b|c|kept\r|x\ny|z|all\nof\nstdin\n|".to_vec());
    // --raw adds nothing; the default adds \n.
    let out = ok_bytes(&b, &["consume", "crlf", "--raw", "--count", "3"], b"");
    assert_eq!(out, b"abc".to_vec());
    assert_eq!(b.ok(&["consume", "crlf", "--count", "2"]), "a\nb\n");
    // An empty delimiter is refused.
    let out = run_bytes(&b, &["produce", "crlf", "--delimiter", ""], b"x");
    assert_eq!(out.status.code(), Some(64));
    let out = run_bytes(&b, &["produce", "crlf", "--delimiter", "\\q"], b"x");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown escape"));
    b.stop();
}

#[test]
fn print_key_and_every_format_letter() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "f", "--partitions", "2"]);
    b.ok(&[
        "produce",
        "f",
        "--partition",
        "1",
        "--key",
        "k1",
        "--value",
        "v1",
    ]);
    b.ok(&["produce", "f", "--partition", "1", "--value", "plain"]);
    assert_eq!(b.ok(&["consume", "f", "--print-key"]), "k1\tv1\n\tplain\n");
    assert_eq!(
        b.ok(&[
            "consume",
            "f",
            "--print-key",
            "--key-delimiter",
            "=",
            "--delimiter",
            ";"
        ]),
        "k1=v1;=plain;"
    );
    let ts: Vec<String> = b
        .ok(&["consume", "f", "--format", "%T\\n"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ts.len(), 2);
    assert!(ts
        .iter()
        .all(|t| t.parse::<i64>().unwrap() > 1_600_000_000_000));
    let out = b.ok(&[
        "consume",
        "f",
        "--format",
        "%t|%p|%o|%k|%K|%s|%S|%v|%V|%h|%%\\t%T\\n",
    ]);
    assert_eq!(
        out,
        format!(
            "f|1|0|k1|2|v1|2|v1|2||%\t{}\nf|1|1||-1|plain|5|plain|5||%\t{}\n",
            ts[0], ts[1]
        )
    );
    let raw = ok_bytes(&b, &["consume", "f", "--format", "%R"], b"");
    assert_eq!(raw, [0, 0, 0, 2, 0, 0, 0, 5]);
    // Unknown letters and conflicting flags are usage errors.
    let out = b.run(&["consume", "f", "--format", "%q"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown token %q"));
    let out = b.run(&["consume", "f", "--format", "%s", "--json"]);
    assert_eq!(out.status.code(), Some(64));
    b.stop();
}

#[test]
fn from_last_n_and_negative_count() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "n", "--partitions", "2"]);
    let ten: String = (0..10).map(|i| format!("a{i}\n")).collect();
    b.ok_with_stdin(&["produce", "n", "--partition", "0"], &ten);
    b.ok_with_stdin(&["produce", "n", "--partition", "1"], "b0\nb1\nb2\n");
    assert_eq!(
        b.ok(&["consume", "n", "--from", "-4", "--format", "%p:%o:%s\\n"]),
        "0:6:a6\n0:7:a7\n0:8:a8\n0:9:a9\n1:0:b0\n1:1:b1\n1:2:b2\n"
    );
    assert_eq!(
        b.ok(&["consume", "n", "--partition", "0", "--from", "-1"]),
        "a9\n"
    );
    assert_eq!(b.ok(&["consume", "n", "--from", "-0"]), "");
    let out = b.run(&["consume", "n", "--count", "-1"]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("negative") && stderr.contains("--from -N"),
        "{stderr}"
    );
    b.stop();
}

#[test]
fn from_time_finds_the_first_record_at_or_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "t"]);
    for i in 0..12 {
        b.ok(&["produce", "t", "--value", &format!("r{i}")]);
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    let stamps: Vec<i64> = b
        .ok(&["consume", "t", "--format", "%T\\n"])
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(stamps.len(), 12);
    for at in [0usize, 1, 5, 11] {
        // The first offset stamped at or after stamps[at].
        let want = stamps.iter().position(|&s| s >= stamps[at]).unwrap();
        let out = b.ok(&[
            "consume",
            "t",
            "--from-time",
            &stamps[at].to_string(),
            "--format",
            "%o\\n",
        ]);
        let first: usize = out.lines().next().unwrap().parse().unwrap();
        assert_eq!(first, want, "{stamps:?}");
        assert_eq!(out.lines().count(), 12 - want);
    }
    let later = (stamps[11] + 1).to_string();
    assert_eq!(b.ok(&["consume", "t", "--from-time", &later]), "");
    assert_eq!(
        b.ok(&["consume", "t", "--from-time", "2999-01-01T00:00:00Z"]),
        ""
    );
    assert_eq!(
        b.ok(&["consume", "t", "--from-time", "1970-01-01T01:00:00+01:00"])
            .lines()
            .count(),
        12
    );
    let out = b.run(&["consume", "t", "--from-time", "yesterday"]);
    assert_eq!(out.status.code(), Some(64));
    let out = b.run(&["consume", "t", "--from-time", "0", "--from", "3"]);
    assert_eq!(out.status.code(), Some(64));
    b.stop();
}

#[test]
fn a_short_partition_is_read_from_its_start_and_never_stops_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "s", "--partitions", "3"]);
    let ten: String = (0..10).map(|i| format!("x{i}\n")).collect();
    b.ok_with_stdin(&["produce", "s", "--partition", "0"], &ten);
    b.ok_with_stdin(&["produce", "s", "--partition", "1"], "y0\ny1\n");
    b.ok_with_stdin(&["produce", "s", "--partition", "2"], &ten);
    let out = b.run(&["consume", "s", "--from", "8", "--format", "%p:%o\\n"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0:8\n0:9\n1:0\n1:1\n2:8\n2:9\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        "seglog: s/1 ends at offset 2, before --from 8: reading it from its start (offset 0)\n"
    );
    // --quiet silences the note, not the records.
    let out = b.run(&["--quiet", "consume", "s", "--from", "8"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty());
    assert_eq!(out.stdout.len(), 6 * 3);
    // One named partition, or an offset past every partition: still refused.
    let out = b.run(&["consume", "s", "--partition", "1", "--from", "8"]);
    assert_eq!(out.status.code(), Some(69));
    let out = b.run(&["consume", "s", "--from", "11"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("offset_out_of_range"));
    // Reading a standalone broker's partitions never asks it for a cluster status
    // (which it refuses, and logs).
    assert!(!b.stderr().contains("cluster_status"), "{}", b.stderr());
    b.stop();
}

/// A broker that takes the connection but never answers: the client says that no
/// answer came within --timeout (exit 69), not the socket's EAGAIN.
#[test]
fn a_broker_that_does_not_answer_is_a_timeout() {
    // The kernel completes the connection from the backlog; nothing ever reads it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let out = std::process::Command::new(crate::util::bin::BIN)
        .args(["topics", "list", "--broker", &addr, "--timeout", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(
        err,
        format!("seglog: no answer from the broker at {addr} within 1s (--timeout)\n")
    );
    drop(silent);
}

/// A broker killed under a producer and left down: the final error is why the
/// reconnects failed (connection refused), not "closed after an earlier error"; the
/// exit code (69) and the count of acknowledged records are kept.
#[test]
fn produce_names_why_the_reconnects_failed() {
    use std::io::{BufRead, BufReader, Read};
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    b.ok(&["topics", "create", "t"]);
    let addr = b.addr.clone();
    let mut child = b
        .cmd()
        .args([
            "produce",
            "t",
            "--json",
            "--retries",
            "2",
            "--retry-backoff",
            "10ms",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut acks = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"one\n").unwrap();
    stdin.flush().unwrap();
    let mut ack = String::new();
    acks.read_line(&mut ack).unwrap();
    assert!(ack.contains("\"ack\""), "{ack}");
    b.kill9();
    stdin.write_all(b"two\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    acks.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!("cannot connect to the broker at {addr}")),
        "{err}"
    );
    assert!(!err.contains("closed after an earlier error"), "{err}");
    assert!(err.contains("1 record was acknowledged before it"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// One client request, one broker log line: produce and consume ask a missing
/// topic's offsets once (the refusal is logged once), and `serve` logs
/// "listening" once.
#[test]
fn a_refused_request_is_logged_once() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    for args in [
        &["produce", "nosuch", "--value", "v"][..],
        &["consume", "nosuch"],
    ] {
        let o = b.run(args);
        assert_eq!(o.status.code(), Some(69), "{args:?}");
    }
    let refused = "client error: unknown topic \"nosuch\"";
    assert!(b.stderr_gets(refused));
    // Any second line would follow the first at once.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let log = b.stderr();
    assert_eq!(log.matches(refused).count(), 2, "{log}");
    assert_eq!(log.matches(" listening listen=").count(), 1, "{log}");
    b.stop();
}

/// A partition past the topic's end is a usage error whose message counts the
/// partitions with the right noun: "1 partition", "2 partitions".
#[test]
fn a_partition_past_the_end_is_named_with_the_right_plural() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "hello"]);
    b.ok(&["topics", "create", "pair", "--partitions", "2"]);
    let cases = [
        (
            "hello",
            "topic hello has 1 partition; there is no partition 3",
        ),
        (
            "pair",
            "topic pair has 2 partitions; there is no partition 3",
        ),
    ];
    for (topic, want) in cases {
        let o = b.run_with_stdin(&["produce", topic, "--partition", "3"], Some("x\n"));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{err}");
        assert!(err.contains(want), "{err}");
        let o = b.run(&["consume", topic, "--partition", "3"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{err}");
        assert!(err.contains(want), "{err}");
    }
    b.stop();
}

/// `consume --follow` goes on across a restart of a standalone broker: the lost
/// connection is made again, and records produced after the restart are printed.
#[test]
fn follow_goes_on_across_a_broker_restart() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let addr = format!("127.0.0.1:{}", crate::util::port::free_port());
    let serve = || {
        let mut cmd = std::process::Command::new(crate::util::bin::BIN);
        cmd.args(["serve", "--listen", &addr, "--data-dir"])
            .arg(&data);
        Serve::spawn(cmd)
    };
    let s = serve();
    s.ok(&["topics", "create", "t"]);
    s.ok(&["produce", "t", "--value", "before"]);
    let mut child = s
        .cmd()
        .args(["consume", "t", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait = std::time::Duration::from_secs(30);
    assert_eq!(rx.recv_timeout(wait).unwrap(), "before");
    s.stop();
    let s = serve();
    s.ok(&["produce", "t", "--value", "after"]);
    let line = rx.recv_timeout(wait);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        line.as_deref(),
        Ok("after"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.stop();
}

/// A broker that takes connections but never answers (a paused process) costs a
/// client `--connect-timeout`, not its whole `--timeout`: alone it fails naming the
/// setup's wait; listed before a live broker, the client moves on to the live one.
#[test]
fn a_silent_broker_costs_the_connect_timeout_then_the_next_is_tried() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let quiet = silent.local_addr().unwrap().to_string();
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    b.ok(&["topics", "create", "t"]);
    let run = |brokers: &str| {
        std::process::Command::new(crate::util::bin::BIN)
            .args(["topics", "list", "--broker", brokers])
            .args(["--connect-timeout", "300ms", "--timeout", "10m"])
            .output()
            .unwrap()
    };
    let out = run(&quiet);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(
        err,
        format!("seglog: no answer from the broker at {quiet} within 300ms (--connect-timeout)\n")
    );
    let out = run(&format!("{quiet},{}", b.addr));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t");
    b.stop();
    drop(silent);
}
