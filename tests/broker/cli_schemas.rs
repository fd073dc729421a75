//! Schemas through a real `seglog serve`: produce validated against a topic's latest
//! JSON Schema (a refused request writes nothing), the compatibility rules at
//! registration, invalid schemas refused, schemas kept across a restart, read offline,
//! dropped with their topic, and a damaged `schemas.json` reported by verify.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Output;

use seglog::engine::net::client::{Client, ClientError};
use seglog::format::wire::{
    decode_response_version, encode_request, ErrorCode, PartitionBatch, Request, WireRecord,
};
use serde_json::{json, Value};

use crate::util::bin::{json as parse_json, run};
use crate::util::serve::{Serve, PATIENCE};

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "kind": {"enum": ["a", "b"]},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string"}},
                "required": ["zip"]
            }
        },
        "required": ["name"],
        "additionalProperties": false
    })
}

fn with(mut s: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut s);
    s
}

fn write_schema(dir: &Path, name: &str, schema: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(schema).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn end_offsets(c: &mut Client, topic: &str) -> Vec<u64> {
    c.list_offsets(topic)
        .unwrap()
        .iter()
        .map(|p| p.end_offset)
        .collect()
}

fn records<'a>(values: &[&'a str]) -> Vec<WireRecord<'a>> {
    values
        .iter()
        .map(|v| WireRecord {
            timestamp_ms: -1,
            key: None,
            value: v.as_bytes(),
        })
        .collect()
}

const OK: &str = r#"{"name":"ann","age":3,"kind":"a","address":{"zip":"1000"}}"#;

#[test]
fn produce_is_validated_and_a_refused_request_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let b = Serve::start(&data);
    b.ok(&["topics", "create", "people", "--partitions", "2"]);
    let s1 = write_schema(tmp.path(), "s1.json", &person());
    let out = b.ok(&["schemas", "register", "people", "--file", &s1, "--json"]);
    assert_eq!(parse_json(&out), json!({"topic": "people", "version": 1}));

    b.ok_with_stdin(&["produce", "people"], &format!("{OK}\n{OK}\n"));
    let mut c = Client::connect(&b.addr, PATIENCE).unwrap();
    assert_eq!(end_offsets(&mut c, "people").iter().sum::<u64>(), 2);

    // One request, two partitions: valid records on 0, one bad record on 1.
    for (bad, pointer) in [
        (r#"{"name":7}"#, "/name"),                                 // type
        (r#"{"age":1}"#, ""),                                       // required field
        (r#"{"name":"x","kind":"c"}"#, "/kind"),                    // enum
        (r#"{"name":"x","address":{"zip":1000}}"#, "/address/zip"), // nested path
        (r#"{"name":"x","address":{}}"#, "/address"),               // nested required
        (r#"{"name":"x","extra":1}"#, ""),                          // closed model
        ("not json", ""),                                           // not JSON
    ] {
        let before = end_offsets(&mut c, "people");
        let batches = vec![
            PartitionBatch {
                partition: 0,
                records: records(&[OK, OK]),
            },
            PartitionBatch {
                partition: 1,
                records: records(&[OK, bad, OK]),
            },
        ];
        match c.produce("people", batches) {
            Err(ClientError::Refused { code, message, .. }) => {
                assert_eq!(code, ErrorCode::SCHEMA_VIOLATION, "{bad}: {message}");
                assert!(
                    message.starts_with("record 1 of partition 1 "),
                    "{bad}: {message}"
                );
                assert!(
                    message.contains(&format!("at pointer {pointer:?}")),
                    "{bad}: {message}"
                );
            }
            other => panic!("{bad}: expected a refusal, got {other:?}"),
        }
        assert_eq!(
            end_offsets(&mut c, "people"),
            before,
            "{bad}: nothing written"
        );

        // The CLI: exit 65, naming the input record and the pointer.
        let o = b.run(&["produce", "people", "--partition", "1", "--value", bad]);
        assert_eq!(o.status.code(), Some(65), "{bad}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("record 1 of the input"), "{bad}: {err}");
        assert!(
            err.contains(&format!("at pointer {pointer:?}")),
            "{bad}: {err}"
        );
        assert_eq!(
            end_offsets(&mut c, "people"),
            before,
            "{bad}: nothing written"
        );
    }
    // A request large enough to be checked on the checker threads: the same refusal,
    // naming the record.
    let before = end_offsets(&mut c, "people");
    let many: Vec<&str> = (0..48)
        .map(|i| if i == 41 { r#"{"name":7}"# } else { OK })
        .collect();
    let batches = vec![
        PartitionBatch {
            partition: 0,
            records: records(&many[..2]),
        },
        PartitionBatch {
            partition: 1,
            records: records(&many),
        },
    ];
    match c.produce("people", batches) {
        Err(ClientError::Refused { code, message, .. }) => {
            assert_eq!(code, ErrorCode::SCHEMA_VIOLATION, "{message}");
            assert!(
                message.starts_with("record 41 of partition 1 ") && message.contains("\"/name\""),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(end_offsets(&mut c, "people"), before, "nothing written");
    let acks = c
        .produce(
            "people",
            vec![PartitionBatch {
                partition: 1,
                records: records(&[OK; 48]),
            }],
        )
        .unwrap();
    assert!(acks.iter().all(|a| a.result.is_ok()), "{acks:?}");
    assert_eq!(end_offsets(&mut c, "people")[1], before[1] + 48);

    // A topic without a schema takes anything.
    b.ok(&["topics", "create", "free"]);
    b.ok(&["produce", "free", "--value", "not json"]);
    b.stop();
}

#[test]
fn each_rule_accepts_and_refuses_a_new_version() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Serve::start(&tmp.path().join("data"));
    let base = person();
    let added = with(person(), |s| {
        s["properties"]["nick"] = json!({"type": "string"});
    });
    let removed = with(person(), |s| {
        s["properties"].as_object_mut().unwrap().remove("kind");
    });
    let described = with(person(), |s| s["description"] = json!("people"));
    let array = json!({"type": "array"});
    // (rule, accepted, refused)
    let cases = [
        ("backward", &added, Some(&removed)),
        ("forward", &removed, Some(&added)),
        ("full", &described, Some(&added)),
        ("none", &array, None),
    ];
    for (rule, accepted, refused) in cases {
        let topic = format!("t-{rule}");
        b.ok(&["topics", "create", &topic]);
        let f = write_schema(tmp.path(), "base.json", &base);
        b.ok(&[
            "schemas",
            "register",
            &topic,
            "--file",
            &f,
            "--compatibility",
            rule,
        ]);
        if let Some(refused) = refused {
            let f = write_schema(tmp.path(), "refused.json", refused);
            let o = b.run(&["schemas", "check", &topic, "--file", &f]);
            assert_eq!(o.status.code(), Some(1), "{rule}: {}", stdout(&o));
            assert!(
                stdout(&o).starts_with("not compatible: "),
                "{rule}: {}",
                stdout(&o)
            );
            let o = b.run(&["schemas", "register", &topic, "--file", &f]);
            assert_eq!(o.status.code(), Some(1), "{rule}: {}", stderr(&o));
            assert!(
                stderr(&o).contains(&format!("not {rule}-compatible with version 1")),
                "{rule}: {}",
                stderr(&o)
            );
        }
        let f = write_schema(tmp.path(), "accepted.json", accepted);
        let o = b.run(&["schemas", "check", &topic, "--file", &f, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{rule}: {}", stdout(&o));
        assert_eq!(parse_json(&stdout(&o))["compatible"], json!(true));
        let out = b.ok(&["schemas", "register", &topic, "--file", &f, "--json"]);
        assert_eq!(parse_json(&out)["version"], json!(2), "{rule}");
        let got = parse_json(&b.ok(&["schemas", "get", &topic, "--json"]));
        assert_eq!(got["schema"], *accepted, "{rule}");
        assert_eq!(got["compatibility"], json!(rule));
    }
    // Not valid JSON Schema: refused (64), whatever the rule.
    for bad in [
        json!({"type": "strin"}),
        json!({"required": "name"}),
        json!(3),
    ] {
        let f = write_schema(tmp.path(), "bad.json", &bad);
        let o = b.run(&["schemas", "register", "t-none", "--file", &f]);
        assert_eq!(o.status.code(), Some(64), "{bad}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("not a valid JSON Schema"),
            "{bad}: {}",
            stderr(&o)
        );
    }
    let o = b.run(&[
        "schemas",
        "register",
        "missing",
        "--file",
        &write_schema(tmp.path(), "b.json", &base),
    ]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown topic"), "{}", stderr(&o));
    let list = parse_json(&b.ok(&["schemas", "list", "--json"]));
    assert_eq!(list["topics"].as_array().unwrap().len(), 4);
    assert_eq!(list["topics"][0]["topic"], json!("t-backward"));
    assert_eq!(list["topics"][0]["versions"], json!([1, 2]));
    b.stop();
}

#[test]
fn restart_keeps_schemas_offline_reads_and_topic_delete_drops_them() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = data.to_string_lossy().into_owned();
    let b = Serve::start(&data);
    b.ok(&["topics", "create", "people"]);
    let f = write_schema(tmp.path(), "s.json", &person());
    b.ok(&["schemas", "register", "people", "--file", &f]);
    let added = with(person(), |s| {
        s["properties"]["nick"] = json!({"type": "string"});
    });
    let f = write_schema(tmp.path(), "s2.json", &added);
    b.ok(&["schemas", "register", "people", "--file", &f]);
    b.stop();

    // Offline, while no broker runs.
    let (code, out, err) = run(&["schemas", "list", "--data-dir", &d, "--json"], tmp.path());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        parse_json(&out),
        json!({"topics": [{"topic": "people", "compatibility": "backward", "versions": [1, 2], "latest": 2}]})
    );
    let (code, out, err) = run(
        &[
            "schemas",
            "get",
            "people",
            "--version",
            "1",
            "--data-dir",
            &d,
            "--json",
        ],
        tmp.path(),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse_json(&out)["schema"], person());
    let (code, _, err) = run(
        &["schemas", "delete", "people", "--data-dir", &d],
        tmp.path(),
    );
    assert_eq!(code, 64, "{err}");
    let (code, _, err) = run(
        &[
            "schemas",
            "list",
            "--data-dir",
            tmp.path().to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert_eq!(code, 64, "{err}");
    let (code, _, err) = run(&["verify", &d], tmp.path());
    assert_eq!(code, 0, "{err}");

    let b = Serve::start(&data);
    let got = parse_json(&b.ok(&["schemas", "get", "people", "--json"]));
    assert_eq!(
        (got["version"].clone(), got["schema"].clone()),
        (json!(2), added.clone())
    );
    let o = b.run(&["produce", "people", "--value", r#"{"name":1}"#]);
    assert_eq!(o.status.code(), Some(65), "{}", stderr(&o));
    b.ok(&["produce", "people", "--value", r#"{"name":"x","nick":"y"}"#]);
    // Deleting the latest version makes the previous one current.
    let out = b.ok(&["schemas", "delete", "people", "--version", "2", "--json"]);
    assert_eq!(parse_json(&out), json!({"topic": "people", "deleted": [2]}));
    let o = b.run(&["produce", "people", "--value", r#"{"name":"x","nick":"y"}"#]);
    assert_eq!(o.status.code(), Some(65), "{}", stderr(&o));
    let o = b.run(&["schemas", "get", "people", "--version", "2"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(stderr(&o).contains("no schema version 2"), "{}", stderr(&o));
    // Deleting the topic drops its schemas; a new topic of that name has none.
    b.ok(&["topics", "delete", "people"]);
    assert_eq!(
        parse_json(&b.ok(&["schemas", "list", "--json"])),
        json!({"topics": []})
    );
    b.ok(&["topics", "create", "people"]);
    b.ok(&["produce", "people", "--value", "anything"]);
    b.stop();
    assert_eq!(
        seglog::engine::schemas::read_file(&data)
            .unwrap()
            .topics
            .len(),
        0
    );

    // A damaged schemas.json: verify reports it (corrupt), the broker does not start.
    std::fs::write(data.join("schemas.json"), b"{\"format\": 1, \"topics\": {").unwrap();
    let (code, out, _) = run(&["verify", &d, "--json"], tmp.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("schemas_json_unreadable"), "{out}");
    let o = std::process::Command::new(crate::util::bin::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", &d])
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("schemas.json"), "{}", stderr(&o));
}

/// A connection that agreed on protocol version 2 gets `invalid_request` for the
/// schema requests (and the old error code for a schema violation).
#[test]
fn schema_requests_need_version_3() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Serve::start(&tmp.path().join("data"));
    b.ok(&["topics", "create", "t"]);
    let f = write_schema(tmp.path(), "s.json", &json!({"type": "integer"}));
    b.ok(&["schemas", "register", "t", "--file", &f]);
    let mut s = TcpStream::connect(&b.addr).unwrap();
    let mut call = |id: u32, req: &Request<'_>| -> (ErrorCode, String, Option<String>) {
        let mut out = Vec::new();
        encode_request(&mut out, id, req).unwrap();
        s.write_all(&out).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut frame = vec![0; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut frame).unwrap();
        let r = decode_response_version(&frame, 2).unwrap();
        (
            r.code,
            r.message.to_string(),
            r.body.map(|b| format!("{b:?}")),
        )
    };
    let (code, _, body) = call(
        1,
        &Request::Handshake {
            min_version: 1,
            max_version: 2,
            token: None,
        },
    );
    assert_eq!(code, ErrorCode::NONE);
    assert!(body.unwrap().contains("version: 2"));
    let (code, msg, _) = call(2, &Request::SchemaList);
    assert_eq!(code, ErrorCode::INVALID_REQUEST, "{msg}");
    assert!(msg.contains("needs protocol version 3"), "{msg}");
    let produce = Request::Produce {
        topic: "t",
        partitions: vec![PartitionBatch {
            partition: 0,
            records: records(&["\"x\""]),
        }],
    };
    let (code, msg, _) = call(3, &produce);
    assert_eq!(code, ErrorCode::INVALID_REQUEST, "{msg}");
    assert!(msg.starts_with("record 0 of partition 0 "), "{msg}");
    // Version 3 lists it.
    let mut c = Client::connect(&b.addr, PATIENCE).unwrap();
    assert_eq!(c.version(), 3);
    let list = c.schema_list().unwrap();
    assert_eq!(list.len(), 1);
    assert!(matches!(
        c.schema_get("t", Some(9)),
        Err(ClientError::Refused {
            code: ErrorCode::UNKNOWN_SCHEMA,
            ..
        })
    ));
    b.stop();
}

/// Versions count from 1. On the wire 0 means "every version" (delete) and "the
/// latest" (get), so `--version 0` is a usage error for every subcommand taking it,
/// online and offline, and deletes nothing.
#[test]
fn version_zero_is_refused_and_deletes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = data.to_string_lossy().into_owned();
    let b = Serve::start(&data);
    b.ok(&["topics", "create", "people"]);
    let f = write_schema(tmp.path(), "s.json", &person());
    b.ok(&["schemas", "register", "people", "--file", &f]);
    for args in [
        &["schemas", "delete", "people", "--version", "0"][..],
        &["schemas", "get", "people", "--version", "0"],
        &[
            "schemas",
            "get",
            "people",
            "--version",
            "0",
            "--data-dir",
            &d,
        ],
    ] {
        let o = b.run(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--version"), "{args:?}: {}", stderr(&o));
        assert_eq!(stdout(&o), "", "{args:?}");
    }
    assert_eq!(
        parse_json(&b.ok(&["schemas", "list", "--json"]))["topics"][0]["versions"],
        json!([1])
    );
    b.stop();
}

/// `check` refuses a topic that does not exist as `register` does (69, unknown
/// topic): a CI gate that checks before it registers cannot pass on a misspelt name.
#[test]
fn check_refuses_an_unknown_topic_as_register_does() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Serve::start(&tmp.path().join("data"));
    let f = write_schema(tmp.path(), "s.json", &person());
    for cmd in ["check", "register"] {
        let o = b.run(&["schemas", cmd, "no-such-topic", "--file", &f]);
        assert_eq!(o.status.code(), Some(69), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("unknown topic"),
            "{cmd}: {}",
            stderr(&o)
        );
        assert_eq!(stdout(&o), "", "{cmd}");
    }
    // A topic without a schema is still compatible with anything.
    b.ok(&["topics", "create", "people"]);
    assert_eq!(
        b.ok(&["schemas", "check", "people", "--file", &f]),
        "compatible with the latest schema of people\n"
    );
    b.stop();
}

/// A schema file that cannot be read is an I/O error (74), as for every input file;
/// one that is not JSON is a usage error (64).
#[test]
fn an_unreadable_schema_file_exits_74() {
    let tmp = tempfile::tempdir().unwrap();
    let b = Serve::start(&tmp.path().join("data"));
    b.ok(&["topics", "create", "people"]);
    let missing = tmp.path().join("missing.json");
    let missing = missing.to_str().unwrap();
    for cmd in ["register", "check"] {
        let o = b.run(&["schemas", cmd, "people", "--file", missing]);
        assert_eq!(o.status.code(), Some(74), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("cannot read {missing}")),
            "{cmd}: {}",
            stderr(&o)
        );
    }
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "not json").unwrap();
    let o = b.run(&[
        "schemas",
        "register",
        "people",
        "--file",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    b.stop();
}
