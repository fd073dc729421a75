//! Consumer groups against a real broker: `consume --group` processes splitting a
//! topic and rebalancing as members come, go and die; the `groups` commands online and
//! offline; bad group requests refused with clear errors while the broker serves on.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::net::client::Client;
use seglog::format::wire::ErrorCode;

use crate::util::bin::{json, BIN};
use crate::util::serve::{Serve, PATIENCE};

/// A `consume --group` child whose stdout (JSON lines) is collected as it arrives.
struct Member {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Member {
    fn start(server: &Serve, group: &str) -> Member {
        let mut child = Command::new(BIN)
            .env("SEGLOG_BROKER", &server.addr)
            .args([
                "consume",
                "t",
                "--group",
                group,
                "--json",
                "--session-timeout",
                "1500ms",
                "--commit-interval",
                "100ms",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start consume --group");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("stdout");
        let sink = Arc::clone(&lines);
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let err = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Member {
            child,
            lines,
            stderr,
        }
    }

    fn values(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| json(l)["value"].as_str().unwrap().to_string())
            .collect()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    fn wait(mut self) -> (i32, Vec<String>, String) {
        let status = self.child.wait().unwrap();
        // Let the reader threads drain the pipes.
        thread::sleep(Duration::from_millis(100));
        let values = self.values();
        let stderr = self.stderr.lock().unwrap().clone();
        (status.code().unwrap_or(-1), values, stderr)
    }
}

/// Polls `groups describe g --json` until `ok` holds for it.
fn wait_for(
    server: &Serve,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = server.run(&["groups", "describe", "g", "--json"]);
        if out.status.success() {
            let v = json(&String::from_utf8_lossy(&out.stdout));
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "waiting for {what}: last {v}");
        } else {
            assert!(Instant::now() < deadline, "waiting for {what}: {out:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The sorted partition counts of the group's members, when it is stable.
fn split(v: &serde_json::Value) -> Option<Vec<usize>> {
    if v["state"] != "Stable" {
        return None;
    }
    let mut counts: Vec<usize> = v["members"]
        .as_array()?
        .iter()
        .map(|m| m["partitions"].as_array().map_or(0, Vec::len))
        .collect();
    counts.sort_unstable();
    Some(counts)
}

fn all_committed(v: &serde_json::Value) -> bool {
    let offsets = v["offsets"].as_array().unwrap();
    offsets.len() == 4 && offsets.iter().all(|o| o["lag"] == 0)
}

fn produce(server: &Serve, phase: &str, produced: &mut BTreeSet<String>) {
    for p in 0..4 {
        let values: Vec<String> = (0..10).map(|i| format!("{phase}-p{p}-{i}")).collect();
        let input = values.join("\n") + "\n";
        server.ok_with_stdin(&["produce", "t", "--partition", &p.to_string()], &input);
        produced.extend(values);
    }
}

#[test]
fn members_split_rebalance_and_take_over_a_killed_member() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start_with(dir.path(), &["--group-min-session-timeout", "500ms"]);
    server.ok(&["topics", "create", "t", "--partitions", "4"]);
    let mut produced = BTreeSet::new();
    produce(&server, "a", &mut produced);

    let m1 = Member::start(&server, "g");
    let m2 = Member::start(&server, "g");
    wait_for(&server, "a 2/2 split", |v| split(v) == Some(vec![2, 2]));
    let m3 = Member::start(&server, "g");
    wait_for(&server, "a 2/1/1 split", |v| {
        split(v) == Some(vec![1, 1, 2])
    });
    produce(&server, "b", &mut produced);
    wait_for(&server, "every record read and committed", |v| {
        split(v) == Some(vec![1, 1, 2]) && all_committed(v)
    });

    // The third member dies without leaving: after its session timeout the others
    // take its partitions over from its last commit.
    m3.signal(rustix::process::Signal::KILL);
    produce(&server, "c", &mut produced);
    let v = wait_for(&server, "a 2/2 split after the kill", |v| {
        split(v) == Some(vec![2, 2]) && all_committed(v)
    });
    let owned: BTreeSet<u64> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["partitions"].as_array().unwrap().clone())
        .map(|p| p["partition"].as_u64().unwrap())
        .collect();
    assert_eq!(owned, (0..4).collect(), "{v}");

    // A clean exit commits and leaves.
    m1.signal(rustix::process::Signal::TERM);
    m2.signal(rustix::process::Signal::TERM);
    let mut consumed: BTreeMap<String, usize> = BTreeMap::new();
    for (i, m) in [m1, m2, m3].into_iter().enumerate() {
        let (code, values, stderr) = m.wait();
        if i < 2 {
            assert_eq!(code, 0, "member {i}: {stderr}");
        }
        for value in values {
            *consumed.entry(value).or_default() += 1;
        }
    }
    let missing: Vec<&String> = produced
        .iter()
        .filter(|v| !consumed.contains_key(*v))
        .collect();
    assert!(missing.is_empty(), "records never consumed: {missing:?}");
    let unknown: Vec<&String> = consumed.keys().filter(|v| !produced.contains(*v)).collect();
    assert!(unknown.is_empty(), "records never produced: {unknown:?}");
    let v = wait_for(&server, "an empty group", |v| v["state"] == "Empty");
    assert!(v["members"].as_array().unwrap().is_empty());
    assert!(all_committed(&v), "{v}");
    server.stop();
}

#[test]
fn groups_commands_online_and_offline() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(dir.path());
    server.ok(&["topics", "create", "t", "--partitions", "2"]);
    server.ok_with_stdin(&["produce", "t", "--partition", "0"], "a\nb\nc\n");
    server.ok_with_stdin(&["produce", "t", "--partition", "1"], "d\n");

    // A member reads two records and exits cleanly: it commits and leaves.
    let out = server.ok(&[
        "consume",
        "t",
        "--group",
        "g",
        "--count",
        "2",
        "--assignor",
        "roundrobin",
    ]);
    assert_eq!(out.lines().count(), 2, "{out}");
    let listed = server.ok(&["groups", "list", "--json"]);
    assert_eq!(
        json(&listed),
        serde_json::json!({"groups": [{"group": "g", "state": "Empty"}]})
    );
    let v = json(&server.ok(&["groups", "describe", "g", "--json"]));
    assert_eq!(v["group"], "g");
    let committed: u64 = v["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(committed, 2, "{v}");

    // The next member resumes after the commit: it reads the other two records.
    let out = server.ok(&["consume", "t", "--group", "g", "--count", "2"]);
    let mut all: Vec<&str> = out.lines().collect();
    all.sort_unstable();
    assert_eq!(all.len(), 2, "{out}");

    // reset-offsets: refused while a member lives, done once it left.
    let out = server.ok(&[
        "groups",
        "reset-offsets",
        "g",
        "--topic",
        "t",
        "--to",
        "earliest",
        "--json",
    ]);
    let v = json(&out);
    assert_eq!(v["offsets"][0]["committed"], 0, "{v}");
    let mut live = Command::new(BIN)
        .env("SEGLOG_BROKER", &server.addr)
        .args(["consume", "t", "--group", "g", "--session-timeout", "10s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&server, "a live member", |v| {
        v["members"].as_array().is_some_and(|m| m.len() == 1)
    });
    let refused = server.run(&[
        "groups",
        "reset-offsets",
        "g",
        "--topic",
        "t",
        "--to",
        "latest",
    ]);
    assert_eq!(refused.status.code(), Some(69), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("group g has 1 live member ["), "{err}");
    let refused = server.run(&["groups", "delete", "g"]);
    assert_eq!(refused.status.code(), Some(69), "{refused:?}");
    let pid = rustix::process::Pid::from_raw(live.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(live.wait().unwrap().success());
    // The member read everything from 0 and committed the ends on its way out.
    let v = wait_for(&server, "the ends committed", |v| {
        v["state"] == "Empty"
            && v["offsets"]
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o["lag"] == 0)
    });
    assert_eq!(v["offsets"][0]["committed"], 3, "{v}");
    server.ok(&["groups", "reset-offsets", "g", "--topic", "t", "--to", "1"]);
    server.stop();

    // Offline: the data directory's group file.
    let d = dir.path().to_str().unwrap();
    let (code, out, err) =
        crate::util::bin::run(&["groups", "list", "--data-dir", d, "--json"], dir.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["groups"][0]["group"], "g");
    let (code, out, err) = crate::util::bin::run(
        &["groups", "describe", "g", "--data-dir", d, "--json"],
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let rows: Vec<(u64, u64, u64)> = v["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["committed"].as_u64().unwrap(),
                o["end"].as_u64().unwrap(),
                o["lag"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, vec![(1, 3, 2), (1, 1, 0)], "{v}");

    // delete, back online.
    let server = Serve::start(dir.path());
    server.ok(&["groups", "delete", "g"]);
    assert!(!dir.path().join("groups/g.json").exists());
    let out = server.run(&["groups", "describe", "g"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{out:?}"
    );
    server.stop();
}

#[test]
fn bad_group_requests_are_refused_and_the_broker_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(dir.path());
    server.ok(&["topics", "create", "t", "--partitions", "2"]);
    let mut c = Client::connect(&server.addr, PATIENCE).unwrap();
    let code = |r: Result<(), seglog::engine::net::client::ClientError>| r.unwrap_err().code();
    // Unknown group or member.
    assert_eq!(
        code(c.heartbeat("nobody", 1, "m")),
        Some(ErrorCode::UNKNOWN_MEMBER)
    );
    assert_eq!(
        code(c.leave_group("nobody", "m")),
        Some(ErrorCode::UNKNOWN_GROUP)
    );
    let j = c
        .join_group(
            "g",
            "",
            "test",
            Duration::from_secs(10),
            Duration::from_secs(10),
            "consumer",
            &[("range", b"")],
        )
        .unwrap();
    assert_eq!((j.generation, j.leader == j.member_id), (1, true));
    c.sync_group("g", 1, &j.member_id, &[], Duration::ZERO)
        .unwrap();
    assert_eq!(
        code(c.heartbeat("g", 1, "someone-else")),
        Some(ErrorCode::UNKNOWN_MEMBER)
    );
    // A stale generation.
    assert_eq!(
        code(c.heartbeat("g", 0, &j.member_id)),
        Some(ErrorCode::ILLEGAL_GENERATION)
    );
    assert_eq!(
        code(c.commit_offsets("g", 0, &j.member_id, "t", &[(0, 1, "")])),
        Some(ErrorCode::ILLEGAL_GENERATION)
    );
    // A partition that does not exist, a topic that does not exist.
    assert_eq!(
        code(c.commit_offsets("g", 1, &j.member_id, "t", &[(2, 1, "")])),
        Some(ErrorCode::UNKNOWN_PARTITION)
    );
    assert_eq!(
        code(c.commit_offsets("g", 1, &j.member_id, "nope", &[(0, 1, "")])),
        Some(ErrorCode::UNKNOWN_TOPIC)
    );
    // Oversized metadata.
    let big = "m".repeat(4097);
    assert_eq!(
        code(c.commit_offsets("g", 1, &j.member_id, "t", &[(0, 1, &big)])),
        Some(ErrorCode::METADATA_TOO_LARGE)
    );
    // A group name that tries to leave the directory.
    assert_eq!(
        code(c.heartbeat("../x", 1, "m")),
        Some(ErrorCode::INVALID_NAME)
    );
    assert_eq!(
        code(c.commit_offsets("../x", -1, "", "t", &[(0, 1, "")])),
        Some(ErrorCode::INVALID_NAME)
    );
    assert_eq!(code(c.delete_group("..")), Some(ErrorCode::INVALID_NAME));
    // A session timeout outside the broker's bounds.
    let r = c.join_group(
        "g2",
        "",
        "test",
        Duration::from_millis(10),
        Duration::from_secs(1),
        "consumer",
        &[("range", b"")],
    );
    assert_eq!(
        r.unwrap_err().code(),
        Some(ErrorCode::INVALID_SESSION_TIMEOUT)
    );
    // Nothing was committed by any of them.
    assert!(c.fetch_offsets("g", -1, "", "").unwrap().is_empty());
    // The group file (written in the background after the join) holds no offsets,
    // and no other file was made.
    let file = dir.path().join("groups/g.json");
    if file.exists() {
        let (_, l) = seglog::engine::groups::offsets::read_group_file(&file).unwrap();
        assert!(l.offsets.is_empty());
    }
    let names: Vec<String> = std::fs::read_dir(dir.path().join("groups"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "g.json")
        // g.json's own atomic replace, caught in flight (written in the background).
        .filter(|n| !n.starts_with("g.json.tmp-"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    assert!(!dir.path().join("x.json").exists());
    // The connection and the broker serve on; a good commit lands.
    c.commit_offsets("g", 1, &j.member_id, "t", &[(1, 0, "ok")])
        .unwrap();
    assert_eq!(
        c.fetch_offsets("g", 1, &j.member_id, "t").unwrap()[0].metadata,
        "ok"
    );
    assert_eq!(c.list_topics().unwrap(), vec!["t".to_string()]);
    server.stop();
}

/// A `--session-timeout` outside the broker's range is an invalid argument (64) as
/// when the client finds it; one too long for the join request is refused naming
/// the limit, not cut down to it.
#[test]
fn a_session_timeout_out_of_range_is_a_usage_error() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    b.ok(&["topics", "create", "t"]);
    let o = b.run(&["consume", "t", "--group", "g", "--session-timeout", "1s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("invalid_session_timeout"), "{err}");
    let o = b.run(&[
        "consume",
        "t",
        "--group",
        "g",
        "--session-timeout",
        "99999h",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("99999h"), "{err}");
    assert!(err.contains("over the limit of 4294967295 ms"), "{err}");
    b.stop();
}

/// `serve` refuses group session limits that no timeout fits between.
#[test]
fn serve_refuses_a_min_session_timeout_over_the_max() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("d"))
        .args([
            "--group-min-session-timeout",
            "10s",
            "--group-max-session-timeout",
            "5s",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains(
            "--group-min-session-timeout 10s is longer than --group-max-session-timeout 5s"
        ),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!data.path().join("d").exists());
}

/// A member heartbeats as often as Kafka's consumer does by default (3 s), and never
/// less often than three times per session: with the default 45 s session a new
/// member no longer waits about 15 s for the others to hear of the rebalance.
#[test]
fn a_member_heartbeats_every_3s_at_most_a_third_of_its_session() {
    use seglog::cmd::consume_group::heartbeat_interval;
    let s = Duration::from_secs;
    assert_eq!(heartbeat_interval(s(45)), s(3));
    assert_eq!(heartbeat_interval(s(10)), s(3));
    assert_eq!(heartbeat_interval(s(9)), s(3));
    assert_eq!(heartbeat_interval(s(6)), s(2));
    assert_eq!(
        heartbeat_interval(Duration::from_millis(300)),
        Duration::from_millis(100)
    );
}

/// `groups describe` prints its offsets as a comfy-table like `topics describe`
/// (borders, one row per partition), under the group line.
#[test]
fn groups_describe_prints_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(dir.path());
    server.ok(&["topics", "create", "t"]);
    server.ok_with_stdin(&["produce", "t"], "a\nb\nc\n");
    server.ok(&["consume", "t", "--group", "g", "--count", "2"]);
    let out = server.ok(&["groups", "describe", "g"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("group g: Empty (generation "), "{out}");
    assert!(lines[0].ends_with("), 0 members"), "{out}");
    assert!(
        lines[1].starts_with("+-") && lines[1].ends_with("-+"),
        "{out}"
    );
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
    assert_eq!(
        cells(lines[2]),
        [
            "",
            "topic",
            "partition",
            "committed",
            "end",
            "lag",
            "member",
            ""
        ],
        "{out}"
    );
    let row = lines
        .iter()
        .find(|l| l.starts_with("| t "))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cells(row), ["", "t", "0", "2", "3", "1", "-", ""], "{out}");
    server.stop();
}

/// One JoinGroup (version 5) on the Kafka listener at `addr`, on a connection of its
/// own (kept open in the result, so the member is not dropped with it): the error
/// code and the member id.
fn kafka_join(addr: &str, group: &str) -> (i16, String, std::net::TcpStream) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let r = kafka_join_on(&mut conn, group);
    (r.error_code, r.member_id.as_str().to_string(), conn)
}

/// One JoinGroup (version 5) of a Kafka consumer subscribed to topic `t`, on `conn`.
fn kafka_join_on(
    conn: &mut std::net::TcpStream,
    group: &str,
) -> kafka_protocol::messages::JoinGroupResponse {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{ApiKey, GroupId, JoinGroupRequest, JoinGroupResponse};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    let mut body = crate::util::kafka_raw::call(conn, ApiKey::JoinGroup, 5, |b, v| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                // Kafka's ConsumerProtocol subscription, version 0, of topic t.
                .with_metadata(bytes::Bytes::from_static(&[
                    0, 0, 0, 0, 0, 1, 0, 1, b't', 0xff, 0xff, 0xff, 0xff,
                ]))])
            .encode(b, v)
            .unwrap();
    });
    JoinGroupResponse::decode(&mut body, 5).unwrap()
}

/// Native and Kafka consumers join with the same protocol type and names but encode
/// subscriptions and assignments differently: a group with members refuses the
/// other listener's join with INCONSISTENT_GROUP_PROTOCOL (Kafka's 23; `consume
/// --group` exits 69 with one line naming the group and why), its members untouched.
/// Committed offsets alone let either in.
#[test]
fn native_and_kafka_members_do_not_share_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start_with(dir.path(), &["--kafka-listen", "127.0.0.1:0"]);
    let kafka = server.kafka_addr.clone().expect("kafka listening line");
    server.ok(&["topics", "create", "t", "--partitions", "2"]);

    // A native member, Stable: a Kafka join is refused with 23.
    let mut c = Client::connect(&server.addr, PATIENCE).unwrap();
    let j = c
        .join_group(
            "native",
            "",
            "test",
            Duration::from_secs(30),
            Duration::from_secs(30),
            "consumer",
            &[("range", b"")],
        )
        .unwrap();
    c.sync_group("native", j.generation, &j.member_id, &[], Duration::ZERO)
        .unwrap();
    c.commit_offsets("native", j.generation, &j.member_id, "t", &[(0, 0, "")])
        .unwrap();
    let (code, _, _conn) = kafka_join(&kafka, "native");
    assert_eq!(code, 23, "INCONSISTENT_GROUP_PROTOCOL");
    let d = json(&server.ok(&["groups", "describe", "native", "--json"]));
    assert_eq!(d["state"], "Stable", "{d}");
    assert_eq!(d["members"].as_array().unwrap().len(), 1, "{d}");
    c.heartbeat("native", j.generation, &j.member_id).unwrap();
    // Once it leaves, its committed offsets do not keep a Kafka member out.
    c.leave_group("native", &j.member_id).unwrap();
    let (code, _, _taken) = kafka_join(&kafka, "native");
    assert_eq!(code, 0);

    // A Kafka member: `consume --group` is refused, in one line, and exits 69.
    let (code, member, _kept) = kafka_join(&kafka, "kafka");
    assert_eq!(code, 0);
    assert!(!member.is_empty());
    let o = server.run(&["consume", "t", "--group", "kafka", "--count", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "group kafka: its members joined through the Kafka listener, and a member cannot \
             join it through the native protocol"
        ),
        "{err}"
    );
    assert!(err.contains("[inconsistent_group_protocol"), "{err}");
    let d = json(&server.ok(&["groups", "describe", "kafka", "--json"]));
    let ids: Vec<&str> = d["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["member_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [member.as_str()], "{d}");
    server.stop();
}

/// Kafka's `ConsumerProtocolAssignment` at `version` of `assignment`, as a Kafka
/// consumer group's leader encodes it: the i16 version, then the message.
fn consumer_assignment(version: i16, assignment: &[(&str, &[i32])]) -> bytes::Bytes {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    let mut bytes = bytes::BytesMut::new();
    bytes.extend_from_slice(&version.to_be_bytes());
    ConsumerProtocolAssignment::default()
        .with_assigned_partitions(
            assignment
                .iter()
                .map(|(t, ps)| {
                    TopicPartition::default()
                        .with_topic(TopicName(StrBytes::from_string((*t).to_string())))
                        .with_partitions(ps.to_vec())
                })
                .collect(),
        )
        .encode(&mut bytes, version)
        .unwrap();
    bytes.freeze()
}

/// A Kafka consumer group's member on `conn`, as librdkafka and Kafka's own consumer
/// take part: JoinGroup (version 5), then, as the lone member and so the leader,
/// SyncGroup (version 3) handing itself `assignment`. Returns the member id.
fn kafka_member_synced(
    conn: &mut std::net::TcpStream,
    group: &str,
    assignment: bytes::Bytes,
) -> String {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{ApiKey, GroupId, SyncGroupRequest, SyncGroupResponse};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    let joined = kafka_join_on(conn, group);
    assert_eq!(joined.error_code, 0, "join: {joined:?}");
    assert_eq!(joined.leader, joined.member_id, "a lone member leads");
    let mut body = crate::util::kafka_raw::call(conn, ApiKey::SyncGroup, 3, |b, v| {
        SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id(joined.generation_id)
            .with_member_id(joined.member_id.clone())
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(joined.member_id.clone())
                .with_assignment(assignment)])
            .encode(b, v)
            .unwrap();
    });
    let synced = SyncGroupResponse::decode(&mut body, 3).unwrap();
    assert_eq!(synced.error_code, 0, "sync: {synced:?}");
    joined.member_id.as_str().to_string()
}

/// `groups describe` lists a Kafka consumer's partitions: its assignment is Kafka's
/// consumer-protocol encoding as the group's leader handed it over in SyncGroup
/// (versions 0 and 3 here), not seglog's, and the table names the member as the
/// owner of its partitions. A member whose assignment is not one shows no
/// partitions, and the rest of the description still comes.
#[test]
fn describe_lists_the_partitions_of_kafka_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start_with(dir.path(), &["--kafka-listen", "127.0.0.1:0"]);
    let kafka = server.kafka_addr.clone().expect("kafka listening line");
    server.ok(&["topics", "create", "t", "--partitions", "3"]);

    let mut kept = Vec::new();
    for version in [0, 3] {
        let group = format!("readers{version}");
        let mut conn = std::net::TcpStream::connect(&kafka).unwrap();
        let assignment = consumer_assignment(version, &[("t", &[0, 1, 2])]);
        let member = kafka_member_synced(&mut conn, &group, assignment);
        kept.push(conn);
        let d = json(&server.ok(&["groups", "describe", &group, "--json"]));
        assert_eq!(d["state"], "Stable", "{d}");
        let members = d["members"].as_array().unwrap();
        assert_eq!(members.len(), 1, "{d}");
        assert_eq!(members[0]["member_id"], member.as_str(), "{d}");
        assert_eq!(
            members[0]["partitions"],
            serde_json::json!([
                {"topic": "t", "partition": 0},
                {"topic": "t", "partition": 1},
                {"topic": "t", "partition": 2},
            ]),
            "{d}"
        );
        let partitions: Vec<u64> = d["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["partition"].as_u64().unwrap())
            .collect();
        assert_eq!(partitions, [0, 1, 2], "{d}");
        let out = server.ok(&["groups", "describe", &group]);
        let owned = out
            .lines()
            .filter(|l| l.starts_with("| t ") && l.contains(&member))
            .count();
        assert_eq!(owned, 3, "{out}");
    }

    // Bytes that are no consumer-protocol assignment (a negative version).
    let mut conn = std::net::TcpStream::connect(&kafka).unwrap();
    let member = kafka_member_synced(&mut conn, "odd", bytes::Bytes::from_static(&[0xff; 9]));
    let d = json(&server.ok(&["groups", "describe", "odd", "--json"]));
    assert_eq!(d["members"][0]["member_id"], member.as_str(), "{d}");
    assert_eq!(d["members"][0]["partitions"], serde_json::json!([]), "{d}");
    assert_eq!(d["offsets"], serde_json::json!([]), "{d}");
    server.stop();
}

/// A group name of the longest length (249 characters) works: its file
/// `<name>.json` is 254 bytes, and the temporary file of its atomic replace, whose
/// name would be longer than a file name may be, gets a name cut to fit. A crash's
/// leftover of such a name is still a leftover: verify reports it, recover removes it.
#[test]
fn a_group_of_the_longest_name_commits_and_its_leftover_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let group = "g".repeat(249);
    let s = Serve::start(&data);
    s.ok(&["topics", "create", "t"]);
    s.ok_with_stdin(&["produce", "t"], "a\nb\n");
    let o = s.run(&["consume", "t", "--group", &group, "--count", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "a\n");
    let d = json(&s.ok(&["groups", "describe", &group, "--json"]));
    assert_eq!(d["offsets"][0]["committed"], 1, "{d}");
    // The next consumer of the group goes on from there.
    let out = s.ok(&["consume", "t", "--group", &group, "--count", "1"]);
    assert_eq!(out, "b\n");
    s.stop();
    let groups = data.join("groups");
    assert!(groups.join(format!("{group}.json")).is_file());

    // What a crash between the temporary file's write and its rename leaves.
    let leftover =
        seglog::format::names::atomic_tmp_file_name(&format!("{group}.json"), 4_194_304, 17);
    assert!(leftover.len() <= 255, "{leftover}");
    std::fs::write(groups.join(&leftover), b"{}").unwrap();
    let out = Command::new(BIN)
        .args(["verify", "--json"])
        .arg(&data)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("leftover_temp_file"), "{report}");
    assert!(report.contains(&format!("groups/{leftover}")), "{report}");
    let out = Command::new(BIN)
        .args(["recover", "-q"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!groups.join(&leftover).exists());
    let s = Serve::start(&data);
    let d = json(&s.ok(&["groups", "describe", &group, "--json"]));
    assert_eq!(d["offsets"][0]["committed"], 2, "{d}");
    s.stop();
}
