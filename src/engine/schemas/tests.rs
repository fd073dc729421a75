use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::engine::storage::io::RealStorage;
use crate::format::wire::WireRecord;
use crate::testkit::sim::{crash_states, DirModel, Materialiser, Rng, SimStorage};
use crate::testkit::storage::{FailOn, FailingStorage};

fn open(dir: &Path, topics: &[&str]) -> SchemaRegistry {
    let names: Vec<String> = topics.iter().map(ToString::to_string).collect();
    SchemaRegistry::open(Arc::new(RealStorage), dir, &names).unwrap()
}

fn person(extra: Option<(&str, Value)>) -> Value {
    let mut s = json!({
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
    });
    if let Some((k, v)) = extra {
        s["properties"][k] = v;
    }
    s
}

fn batch(values: &[&'static str]) -> Vec<PartitionBatch<'static>> {
    vec![PartitionBatch {
        partition: 2,
        records: values
            .iter()
            .map(|v| WireRecord {
                timestamp_ms: 0,
                key: None,
                value: v.as_bytes(),
            })
            .collect(),
    }]
}

fn violation(r: &SchemaRegistry, values: &[&'static str]) -> (u64, String) {
    match r.check_produce("t", &batch(values)) {
        Err(SchemaError::Violation { index, pointer, .. }) => (index, pointer),
        other => panic!("expected a violation, got {other:?}"),
    }
}

#[test]
fn register_versions_and_validate() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path(), &["t"]);
    assert!(r.check_produce("t", &batch(&["not json"])).is_ok());
    let v1 = r.register("t", &person(None), None).unwrap();
    assert_eq!(
        v1,
        Registered {
            version: 1,
            created: true
        }
    );
    // The same schema again: the same version, nothing new.
    assert_eq!(
        r.register("t", &person(None), None).unwrap(),
        Registered {
            version: 1,
            created: false
        }
    );
    let ok = r#"{"name":"x","age":3,"kind":"a","address":{"zip":"1"}}"#;
    assert!(r.check_produce("t", &batch(&[ok, ok])).is_ok());
    assert_eq!(violation(&r, &[ok, r#"{"name":1}"#]), (1, "/name".into()));
    assert_eq!(violation(&r, &[r#"{"age":1}"#]), (0, String::new()));
    assert_eq!(
        violation(&r, &[ok, ok, r#"{"name":"x","kind":"c"}"#]),
        (2, "/kind".into())
    );
    assert_eq!(
        violation(&r, &[r#"{"name":"x","address":{"zip":5}}"#]),
        (0, "/address/zip".into())
    );
    assert_eq!(violation(&r, &[ok, "{nope"]), (1, String::new()));
    // A tombstone (keyed, empty value) is not checked.
    let tomb = vec![PartitionBatch {
        partition: 0,
        records: vec![WireRecord {
            timestamp_ms: 0,
            key: Some(b"k"),
            value: b"",
        }],
    }];
    assert!(r.check_produce("t", &tomb).is_ok());
    // Adding an optional property to a closed model is backward compatible.
    let v2 = person(Some(("nick", json!({"type": "string"}))));
    assert_eq!(r.register("t", &v2, None).unwrap().version, 2);
    assert!(r
        .check_produce("t", &batch(&[r#"{"name":"x","nick":"y"}"#]))
        .is_ok());
    let mode = std::fs::metadata(dir.path().join(SCHEMAS_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn each_rule_accepts_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path(), &["t"]);
    let base = person(None);
    let added = person(Some(("nick", json!({"type": "string"}))));
    let mut narrowed = person(None);
    narrowed["properties"]["kind"] = json!({"enum": ["a"]});
    // backward: adding to a closed model passes, removing from it does not.
    r.register("t", &base, Some(Compatibility::Backward))
        .unwrap();
    r.register("t", &added, None).unwrap();
    let err = r.register("t", &base, None).unwrap_err();
    assert!(
        matches!(
            err,
            SchemaError::Incompatible {
                version: 2,
                rule: "backward",
                ..
            }
        ),
        "{err}"
    );
    // forward: removing from the closed model passes (old readers never see it),
    // adding a property does not.
    r.register("t", &base, Some(Compatibility::Forward))
        .unwrap();
    let err = r.register("t", &added, None).unwrap_err();
    assert!(
        matches!(
            err,
            SchemaError::Incompatible {
                rule: "forward",
                ..
            }
        ),
        "{err}"
    );
    // forward: narrowing an enum passes (the old reader knows every value).
    assert_eq!(r.register("t", &narrowed, None).unwrap().version, 4);
    // full: widening the enum back is backward- but not forward-compatible.
    let err = r
        .register("t", &base, Some(Compatibility::Full))
        .unwrap_err();
    assert!(
        matches!(err, SchemaError::Incompatible { rule: "full", .. }),
        "{err}"
    );
    let mut described = narrowed.clone();
    described["description"] = json!("annotations change nothing");
    assert_eq!(
        r.register("t", &described, Some(Compatibility::Full))
            .unwrap()
            .version,
        5
    );
    // none: anything valid goes.
    assert_eq!(
        r.register("t", &json!({"type": "array"}), Some(Compatibility::None))
            .unwrap()
            .version,
        6
    );
    // check says the same without registering.
    assert!(r.check("t", &json!({"type": "string"})).unwrap().is_none());
    r.register(
        "t",
        &json!({"type": "array"}),
        Some(Compatibility::Backward),
    )
    .unwrap();
    let reason = r.check("t", &json!({"type": "string"})).unwrap().unwrap();
    assert!(reason.contains("type"), "{reason}");
    assert_eq!(r.snapshot().topics["t"].latest().unwrap().version, 6);
}

#[test]
fn invalid_schemas_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = open(dir.path(), &["t"]);
    for bad in [
        json!({"type": "strin"}),
        json!({"type": 5}),
        json!({"required": "name"}),
        json!({"properties": {"a": {"minLength": -1}}}),
        json!({"pattern": "("}),
        json!(7),
        json!({"$ref": "https://example.com/elsewhere.json"}),
    ] {
        let err = r.register("t", &bad, None).unwrap_err();
        assert!(
            matches!(err, SchemaError::InvalidSchema { .. }),
            "{bad}: {err}"
        );
    }
    assert!(r.snapshot().topics.is_empty());
    assert!(!dir.path().join(SCHEMAS_FILE).exists());
    assert!(matches!(
        parse_schema("{"),
        Err(SchemaError::InvalidSchema { .. })
    ));
}

#[test]
fn delete_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = open(dir.path(), &["t", "u"]);
        r.register("t", &json!({"type": "object"}), Some(Compatibility::None))
            .unwrap();
        r.register("t", &json!({"type": "string"}), None).unwrap();
        r.register("t", &json!({"type": "integer"}), None).unwrap();
        r.register("u", &json!({"type": "integer"}), None).unwrap();
        assert_eq!(r.delete("t", Some(3)).unwrap(), vec![3]);
        // Version 2 is the latest again and its validator is used.
        assert!(r.check_produce("t", &batch(&["\"s\""])).is_ok());
        assert!(matches!(
            r.delete("t", Some(3)),
            Err(SchemaError::NoVersion { version: 3, .. })
        ));
        // Numbers are not reused.
        assert_eq!(
            r.register("t", &json!({"type": "boolean"}), None)
                .unwrap()
                .version,
            4
        );
    }
    let r = open(dir.path(), &["t", "u"]);
    let doc = r.snapshot();
    let versions: Vec<u32> = doc.topics["t"].versions.iter().map(|v| v.version).collect();
    assert_eq!(versions, [1, 2, 4]);
    assert_eq!(doc.topics["t"].rule(), Compatibility::None);
    assert!(r.check_produce("t", &batch(&["true"])).is_ok());
    assert!(r.check_produce("t", &batch(&["1"])).is_err());
    assert_eq!(r.delete("t", None).unwrap(), vec![1, 2, 4]);
    assert!(matches!(
        r.delete("t", None),
        Err(SchemaError::NoSchema { .. })
    ));
    assert!(r.check_produce("t", &batch(&["1"])).is_ok());
    drop(r);
    // A topic that no longer exists loses its schemas at open.
    let r = open(dir.path(), &["t"]);
    assert!(r.snapshot().topics.is_empty());
    assert!(read_file(dir.path()).unwrap().topics.is_empty());
}

#[test]
fn unreadable_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(SCHEMAS_FILE),
        b"{\"format\": 1, \"topics\": ",
    )
    .unwrap();
    let err = SchemaRegistry::open(Arc::new(RealStorage), dir.path(), &[]).unwrap_err();
    assert!(matches!(err, SchemaError::Unreadable { .. }), "{err}");
}

#[test]
fn a_failed_replace_changes_nothing_and_poisons() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path(), &["t"])
        .register("t", &json!({"type": "object"}), None)
        .unwrap();
    let before = std::fs::read(dir.path().join(SCHEMAS_FILE)).unwrap();
    // The replace makes 4 counted calls: create, write, sync, rename (+ dir sync).
    for n in 1..=5 {
        let s = FailingStorage::new(Arc::new(RealStorage), n, FailOn::Any, false);
        let r = SchemaRegistry::open(Arc::new(s.clone()), dir.path(), &["t".into()]).unwrap();
        let new = json!({"type": "object", "title": format!("try {n}")});
        let err = r.register("t", &new, None).unwrap_err();
        assert!(s.has_failed(), "call {n}");
        assert!(matches!(err, SchemaError::Io { .. }), "call {n}: {err}");
        // Not acknowledged: the registry still serves the old version...
        assert_eq!(r.snapshot().topics["t"].versions.len(), 1);
        // ...and refuses further changes until a restart.
        assert!(matches!(
            r.register("t", &json!({"type": "object", "title": "again"}), None),
            Err(SchemaError::Poisoned { .. })
        ));
        let now = read_file(dir.path()).unwrap();
        let latest = now.topics["t"].latest().unwrap().schema.clone();
        assert!(
            latest == json!({"type": "object"}) || latest == new,
            "call {n}"
        );
        // Put the old file back for the next round.
        std::fs::write(dir.path().join(SCHEMAS_FILE), &before).unwrap();
    }
}

/// Every crash state of a register leaves the old file or the new one (never a
/// torn or missing one), and the acknowledged register is in every state after the
/// call returned.
#[test]
fn a_crash_while_replacing_leaves_old_or_new() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    std::fs::create_dir(&root).unwrap();
    open(&root, &["t"])
        .register("t", &json!({"type": "object"}), None)
        .unwrap();
    let old = read_file(&root).unwrap();
    let sim = SimStorage::new(&root).unwrap();
    let r = SchemaRegistry::open(Arc::new(sim.clone()), &root, &["t".into()]).unwrap();
    let new_schema = json!({"type": "object", "title": "v2", "properties": {"a": {}}});
    r.register("t", &new_schema, None).unwrap();
    let new = r.snapshot();
    let trace = sim.trace();
    assert!(!trace.ops.is_empty());
    let dur = trace.durability();
    let mut mat = Materialiser::new(&trace);
    let mut rng = Rng::new(7);
    let n = trace.ops.len();
    let mut states = 0;
    for k in 0..=n {
        let pending = dur.pending(&trace, k);
        for model in [DirModel::InOrder, DirModel::AnyOrder] {
            for choices in crash_states(&trace, &pending, model, 4096, 64, &mut rng) {
                let img = mat.image(&dur, k, &pending, &choices);
                let bytes = img
                    .file(Path::new(SCHEMAS_FILE))
                    .expect("schemas.json exists");
                let doc = decode_schemas(bytes)
                    .unwrap_or_else(|e| panic!("crash point {k}/{n} {choices:?}: unreadable: {e}"));
                assert!(doc == old || doc == new, "crash point {k}/{n} {choices:?}");
                if k == n {
                    assert_eq!(doc, new, "the register returned, so it is durable");
                }
                states += 1;
            }
        }
    }
    assert!(states > n);
}

/// Off the event loop, a large request is checked in parts on other threads; the
/// failure reported is still the first in request order, and tombstones are skipped.
#[test]
fn off_thread_checks_report_the_first_failure_in_order() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let c = Arc::new(compile(&person(None), 3).unwrap());
    let good = br#"{"name": "x", "age": 1}"#.as_slice();
    let make = |bad: &[(u32, usize)]| -> Vec<PartitionBatch<'static>> {
        (0..2u32)
            .map(|partition| PartitionBatch {
                partition,
                records: (0..40usize)
                    .map(|i| WireRecord {
                        timestamp_ms: -1,
                        key: (i == 7).then_some(b"k".as_slice()),
                        value: if bad.contains(&(partition, i)) {
                            br#"{"name": "x", "age": "old"}"#.as_slice()
                        } else if i == 7 {
                            b"".as_slice()
                        } else {
                            good
                        },
                    })
                    .collect(),
            })
            .collect()
    };
    let check = |bad: &[(u32, usize)]| {
        let batches = make(bad);
        let one = c.check_batches(&batches);
        let off = rt.block_on(c.check_batches_off_thread(&batches));
        assert_eq!(format!("{one:?}"), format!("{off:?}"), "{bad:?}");
        off
    };
    assert!(check(&[]).is_ok());
    for bad in [
        vec![(0, 5), (1, 30)],
        vec![(1, 30)],
        vec![(1, 39), (1, 2)],
        vec![(0, 39)],
    ] {
        let mut first = bad.clone();
        first.sort_unstable();
        match check(&bad) {
            Err(SchemaError::Violation {
                partition,
                index,
                version,
                pointer,
                ..
            }) => {
                assert_eq!((partition, index as usize), first[0], "{bad:?}");
                assert_eq!((version, pointer.as_str()), (3, "/age"));
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}
