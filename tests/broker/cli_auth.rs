//! API keys and authentication through a real `seglog serve`: keys made offline and
//! online, every kind of refusal (no token, wrong token, revoked key, a pattern that
//! does not match, a role that does not allow the request) with nothing written,
//! the right keys working, `api_keys.json` holding no secret (mode 0600), and failed
//! logins limited per source address without touching another address.

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use seglog::engine::net::client::{Client, ClientError};
use seglog::format::wire::{ErrorCode, PartitionBatch, WireRecord};
use serde_json::Value;

use crate::util::bin::{json as parse_json, json_lines, run};
use crate::util::serve::Serve;

const TIMEOUT: Duration = Duration::from_secs(30);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Creates a key offline; returns (id, token).
fn create_offline(dir: &Path, args: &[&str]) -> (String, String) {
    let mut all = vec![
        "keys",
        "create",
        "--json",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let (code, out, err) = run(&all, dir);
    assert_eq!(code, 0, "{err}");
    let v = parse_json(&out);
    (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    )
}

fn connect(addr: &str, token: Option<&str>) -> Result<Client, ClientError> {
    Client::connect_with_token(addr, TIMEOUT, token)
}

fn refused_code(r: Result<impl std::fmt::Debug, ClientError>) -> ErrorCode {
    match r {
        Err(e) => e.code().unwrap_or_else(|| panic!("not a refusal: {e}")),
        Ok(v) => panic!("expected a refusal, got {v:?}"),
    }
}

fn one(value: &[u8]) -> Vec<PartitionBatch<'_>> {
    vec![PartitionBatch {
        partition: 0,
        records: vec![WireRecord {
            timestamp_ms: 1,
            key: None,
            value,
        }],
    }]
}

fn end(admin: &mut Client, topic: &str) -> u64 {
    admin.list_offsets(topic).unwrap()[0].end_offset
}

fn write_token(dir: &Path, name: &str, token: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn keys_roles_patterns_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // No key yet: the broker serves without a login.
    let b = Serve::start(&data);
    b.ok(&["topics", "create", "orders.eu"]);
    b.ok(&["topics", "create", "payments"]);
    b.stop();

    let (_, admin_token) = create_offline(&data, &["--name", "ops", "--role", "admin"]);
    let (producer_id, producer_token) = create_offline(
        &data,
        &["--name", "app", "--role", "producer", "--topic", "orders.*"],
    );
    let (_, consumer_token) = create_offline(
        &data,
        &[
            "--name", "app", "--role", "consumer", "--topic", "orders.*", "--group", "g-*",
        ],
    );
    // A producer key without a topic pattern is a usage error.
    let (code, _, err) = run(
        &[
            "keys",
            "create",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            "x",
            "--role",
            "producer",
        ],
        tmp.path(),
    );
    assert_eq!(code, 64, "{err}");

    let file = data.join("api_keys.json");
    let text = std::fs::read_to_string(&file).unwrap();
    for t in [&admin_token, &producer_token, &consumer_token] {
        assert!(!text.contains(&t[21..]), "api_keys.json holds a secret");
    }
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (code, out, _) = run(
        &[
            "keys",
            "list",
            "--json",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert_eq!(code, 0);
    let report = json_lines(&out);
    assert_eq!(report.len(), 1, "one report object: {out}");
    let keys = report[0]["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys.iter().filter(|k| k["name"] == "app").count(), 2);
    assert!(!out.contains("sgk_") && !out.contains("sha256"));

    let b = Serve::start(&data);
    let addr = b.addr.clone();
    let mut admin = connect(&addr, Some(&admin_token)).unwrap();

    // No token, a wrong secret, an unknown id, a malformed token.
    assert_eq!(refused_code(connect(&addr, None)), ErrorCode::AUTH_REQUIRED);
    let mut wrong = producer_token.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    let unknown = format!("sgk_0000000000000000_{}", &producer_token[21..]);
    for bad in [wrong.as_str(), unknown.as_str(), "sgk_nonsense"] {
        assert_eq!(
            refused_code(connect(&addr, Some(bad))),
            ErrorCode::AUTH_FAILED
        );
    }
    let o = b.run(&["topics", "list"]);
    assert_eq!(o.status.code(), Some(77));
    assert!(stderr(&o).contains("auth_required"), "{}", stderr(&o));

    // The producer: its topics only, nothing else.
    let mut producer = connect(&addr, Some(&producer_token)).unwrap();
    let acks = producer.produce("orders.eu", one(b"p1")).unwrap();
    assert!(acks[0].result.is_ok(), "{acks:?}");
    assert_eq!(
        refused_code(producer.produce("payments", one(b"x"))),
        ErrorCode::NOT_AUTHORIZED
    );
    assert_eq!(
        refused_code(producer.fetch("orders.eu", 0, 0, 1 << 20, Duration::ZERO)),
        ErrorCode::NOT_AUTHORIZED
    );
    assert_eq!(
        refused_code(producer.create_topic("new", 1, &[])),
        ErrorCode::NOT_AUTHORIZED
    );
    assert_eq!(producer.list_topics().unwrap(), ["orders.eu"]);
    assert_eq!(end(&mut admin, "payments"), 0);
    assert!(!admin.list_topics().unwrap().contains(&"new".to_string()));

    // The consumer: fetch yes, produce no.
    let mut consumer = connect(&addr, Some(&consumer_token)).unwrap();
    assert_eq!(
        refused_code(consumer.produce("orders.eu", one(b"c"))),
        ErrorCode::NOT_AUTHORIZED
    );
    assert_eq!(end(&mut admin, "orders.eu"), 1);
    let f = consumer
        .fetch("orders.eu", 0, 0, 1 << 20, Duration::ZERO)
        .unwrap();
    assert_eq!(f.records[0].value, b"p1");
    assert_eq!(
        refused_code(consumer.fetch("payments", 0, 0, 1 << 20, Duration::ZERO)),
        ErrorCode::NOT_AUTHORIZED
    );

    // The CLI with --token-file and with $SEGLOG_TOKEN.
    let pfile = write_token(tmp.path(), "producer.token", &producer_token);
    let o = b.run_with_stdin(
        &["produce", "orders.eu", "--token-file", &pfile],
        Some("cli\n"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = b.run_with_stdin(
        &["produce", "payments", "--token-file", &pfile],
        Some("no\n"),
    );
    assert_eq!(o.status.code(), Some(77));
    assert!(stderr(&o).contains("not_authorized"), "{}", stderr(&o));
    // Told as what was asked (produce), not as the request the client sent first.
    assert!(
        stderr(&o).contains(r#"may not produce to topic "payments""#),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("list_offsets"), "{}", stderr(&o));
    let o = b
        .cmd()
        .env("SEGLOG_TOKEN", &consumer_token)
        .args(["consume", "orders.eu", "--from", "earliest"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "p1\ncli\n");
    assert_eq!(end(&mut admin, "payments"), 0);

    // Online key commands, applied at once.
    let afile = write_token(tmp.path(), "admin.token", &admin_token);
    let out = b.ok(&[
        "keys",
        "create",
        "--json",
        "--token-file",
        &afile,
        "--name",
        "late",
        "--role",
        "producer",
        "--topic",
        "payments",
    ]);
    let created: Value = parse_json(&out);
    let late_token = created["token"].as_str().unwrap().to_string();
    let mut late = connect(&addr, Some(&late_token)).unwrap();
    assert!(late.produce("payments", one(b"ok")).unwrap()[0]
        .result
        .is_ok());
    let listed = json_lines(&b.ok(&["keys", "list", "--json", "--token-file", &afile]));
    // One report object, as every report command prints.
    assert_eq!(listed.len(), 1, "{listed:?}");
    let listed = listed[0]["keys"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 4);
    assert!(listed.iter().all(|k| k.get("token").is_none()));
    let o = b.run(&["keys", "list", "--token-file", &pfile]);
    assert_eq!(o.status.code(), Some(77));
    assert!(stderr(&o).contains("not_authorized"));

    // Revoked: new logins fail, and a connection that logged in with it is refused
    // at its next request.
    b.ok(&["keys", "revoke", &producer_id, "--token-file", &afile]);
    assert_eq!(
        refused_code(connect(&addr, Some(&producer_token))),
        ErrorCode::AUTH_FAILED
    );
    assert_eq!(
        refused_code(producer.produce("orders.eu", one(b"gone"))),
        ErrorCode::AUTH_FAILED
    );
    assert_eq!(end(&mut admin, "orders.eu"), 2);
    let o = b.run(&["keys", "revoke", &producer_id, "--token-file", &afile]);
    assert_eq!(o.status.code(), Some(69));
    assert!(stderr(&o).contains("unknown_key"), "{}", stderr(&o));

    // Offline commands refuse a directory a broker holds.
    let (code, _, err) = run(
        &["keys", "list", "--data-dir", data.to_str().unwrap()],
        tmp.path(),
    );
    assert_eq!(code, 73, "{err}");
    assert!(b.stderr_gets("failed login"));
    drop((admin, producer, consumer, late));
    b.stop();

    // The online changes are on disk; the printed secrets are not.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&late_token[21..]));
    assert!(!text.contains(&producer_id));
    let (_, out, _) = run(
        &[
            "keys",
            "list",
            "--json",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let keys = json_lines(&out)[0]["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert!(keys
        .iter()
        .any(|k| k["name"] == "late" && k["last_used_ms"].as_i64() > Some(0)));
}

#[test]
fn auth_off_and_required_without_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let b = Serve::start_with(&data, &["--auth", "required"]);
    assert_eq!(
        refused_code(connect(&b.addr, None)),
        ErrorCode::AUTH_REQUIRED
    );
    b.stop();
    create_offline(&data, &["--name", "ops", "--role", "admin"]);
    let b = Serve::start_with(&data, &["--auth", "off"]);
    let mut c = connect(&b.addr, None).unwrap();
    c.create_topic("t", 1, &[]).unwrap();
    // With auth off a token is not checked.
    connect(&b.addr, Some("sgk_wrong")).unwrap();
    b.stop();
}

/// A connection to `addr` from the source address `from` (another 127.0.0.x).
fn connect_from(from: &str, addr: &str, token: &str) -> Result<Client, ClientError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream: TcpStream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let s = socket.connect(addr.parse().unwrap()).await.unwrap();
        s.into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    Client::over_stream(stream, addr, TIMEOUT, None, Some(token))
}

#[test]
fn failed_logins_are_limited_per_source_address() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let b = Serve::start(&data);
    b.ok(&["topics", "create", "t"]);
    b.stop();
    let (_, token) = create_offline(&data, &["--name", "ops", "--role", "admin"]);
    let b = Serve::start(&data);
    let wrong = format!("sgk_0000000000000000_{}", &token[21..]);
    let mut limited = 0;
    for _ in 0..1000 {
        match refused_code(connect(&b.addr, Some(&wrong))) {
            ErrorCode::AUTH_RATE_LIMITED => limited += 1,
            code => assert_eq!(code, ErrorCode::AUTH_FAILED),
        }
    }
    assert!(
        limited > 900,
        "{limited} of 1000 failed logins were rate-limited"
    );
    // The address is slowed even with the right token ...
    assert_eq!(
        refused_code(connect(&b.addr, Some(&token))),
        ErrorCode::AUTH_RATE_LIMITED
    );
    // ... and another address logs in and produces meanwhile.
    let mut other = connect_from("127.0.0.2", &b.addr, &token).unwrap();
    let acks = other.produce("t", one(b"fine")).unwrap();
    assert!(acks[0].result.is_ok(), "{acks:?}");
    assert_eq!(other.list_offsets("t").unwrap()[0].end_offset, 1);
    b.stop();
}

/// Patterns a role never checks are refused (64, saying why), online and offline:
/// an admin key may do everything whatever its `--topic`/`--group`, a producer key
/// uses no group. Nothing is created; the allowed combinations still work.
#[test]
fn patterns_a_role_does_not_enforce_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = data.to_str().unwrap();
    let b = Serve::start(&data);
    let refused: [(&[&str], &str); 4] = [
        (&["--role", "admin", "--topic", "a*"], "admin key"),
        (&["--role", "admin", "--group", "g"], "admin key"),
        (
            &["--role", "producer", "--topic", "a*", "--group", "g"],
            "producer key",
        ),
        (
            &["--role", "producer", "--topic", "*", "--group", "*"],
            "producer key",
        ),
    ];
    for (extra, why) in refused {
        let mut args = vec!["keys", "create", "--name", "x"];
        args.extend_from_slice(extra);
        let o = b.run(&args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(why), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    // The broker refuses them too when a client skips the check.
    let mut c = connect(&b.addr, None).unwrap();
    assert_eq!(
        refused_code(c.key_create("x", "admin", &["a*".to_string()], &[])),
        ErrorCode::INVALID_REQUEST
    );
    assert_eq!(
        refused_code(c.key_create("x", "producer", &["*".to_string()], &["g".to_string()])),
        ErrorCode::INVALID_REQUEST
    );
    b.ok(&[
        "keys", "create", "--name", "c", "--role", "consumer", "--topic", "*", "--group", "g",
    ]);
    b.stop();

    for (extra, why) in refused {
        let mut args = vec!["keys", "create", "--name", "x", "--data-dir", d];
        args.extend_from_slice(extra);
        let (code, _, err) = run(&args, tmp.path());
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    create_offline(&data, &["--name", "ops", "--role", "admin"]);
    let (code, out, err) = run(&["keys", "list", "--json", "--data-dir", d], tmp.path());
    assert_eq!(code, 0, "{err}");
    let keys = parse_json(&out)["keys"].as_array().unwrap().clone();
    let roles: Vec<&str> = keys.iter().map(|k| k["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["consumer", "admin"], "{out}");
}

/// `keys list` prints a comfy-table like `topics describe` (borders, one row per
/// key); `--json` keeps its fields.
#[test]
fn keys_list_prints_a_table() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    Serve::start(&data).stop();
    let (id, _) = create_offline(&data, &["--name", "ops", "--role", "admin"]);
    let d = data.to_str().unwrap();
    let (code, out, err) = run(&["keys", "list", "--data-dir", d], tmp.path());
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("+-") && lines[0].ends_with("-+"),
        "{out}"
    );
    let header: Vec<&str> = lines[1].split('|').map(str::trim).collect();
    assert_eq!(
        header,
        [
            "",
            "id",
            "name",
            "role",
            "topics",
            "groups",
            "created",
            "last used",
            ""
        ],
        "{out}"
    );
    let row = lines
        .iter()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(&cells[1..4], [id.as_str(), "ops", "admin"], "{out}");
    assert_eq!(cells[7], "never", "{out}");
    let (code, out, err) = run(&["keys", "list", "--json", "--data-dir", d], tmp.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse_json(&out)["keys"][0]["name"], "ops", "{out}");
}
