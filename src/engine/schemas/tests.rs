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

/// Off the event loop, a request is checked on the checker threads, a large one in
/// parts; with no checker, on the calling thread. The failure reported is still the
/// first in request order, and tombstones are skipped.
#[test]
fn off_thread_checks_report_the_first_failure_in_order() {
    for threads in [3, 1, 0] {
        off_thread_checks(threads, SPLIT_RECORDS_MIN / 2 + 8);
        off_thread_checks(threads, OFF_THREAD_RECORDS_MIN / 2 + 8);
    }
}

/// Requests of two partitions of `per_partition` records each, checked by a pool of
/// `threads` checkers.
fn off_thread_checks(threads: usize, per_partition: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let c = Arc::new(compile(&person(None), 3).unwrap());
    let checkers = super::pool::CheckPool::with_threads(threads);
    assert_eq!(checkers.busy(), threads == 0);
    // Bad records sit near both ends of each partition.
    let per = per_partition;
    let (mid, last) = (per / 2 + 1, per - 1);
    let good = br#"{"name": "x", "age": 1}"#.as_slice();
    let make = |bad: &[(u32, usize)]| -> Vec<PartitionBatch<'static>> {
        (0..2u32)
            .map(|partition| PartitionBatch {
                partition,
                records: (0..per)
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
        let off = rt.block_on(c.check_batches_off_thread(&checkers, &batches));
        assert_eq!(
            format!("{one:?}"),
            format!("{off:?}"),
            "{threads} {per} {bad:?}"
        );
        off
    };
    assert!(check(&[]).is_ok());
    for bad in [
        vec![(0, 5), (1, mid)],
        vec![(1, mid)],
        vec![(1, last), (1, 2)],
        vec![(0, last)],
        vec![(1, last)],
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

/// Schemas over most keywords, for the in-place check against the `Value` check.
fn parity_schemas() -> Vec<Value> {
    vec![
        person(None),
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
               "required": ["a"], "additionalProperties": false}),
        json!({"type": "object", "minProperties": 2, "maxProperties": 3,
               "propertyNames": {"maxLength": 2}}),
        json!({"type": "object", "patternProperties": {"^x": {"type": "string"}},
               "additionalProperties": {"type": "number"}}),
        json!({"type": "object", "dependentRequired": {"a": ["b"]},
               "unevaluatedProperties": false, "properties": {"a": true, "b": true}}),
        json!({"type": "array", "items": {"type": ["integer", "null"]}, "uniqueItems": true,
               "minItems": 1, "maxItems": 4}),
        json!({"type": "array", "contains": {"const": {"a": [1, 2.0]}}}),
        json!({"type": "array", "prefixItems": [{"type": "string"}], "items": false}),
        json!({"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^[a-zé]+$"}),
        json!({"enum": [1, "x", null, true, [1, {"b": 2}], {"a": 1, "b": [true]}]}),
        json!({"const": 1.0}),
        json!({"type": "number", "multipleOf": 0.5, "exclusiveMaximum": 100}),
        json!({"type": "integer"}),
        json!({"oneOf": [{"type": "string"}, {"type": "integer"}, {"minimum": 5}]}),
        json!({"anyOf": [{"type": "object", "required": ["a"]}, {"type": "array"}],
               "not": {"type": "array", "maxItems": 0}}),
        json!({"if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
               "then": {"required": ["b"]}, "else": {"required": ["c"]}}),
        json!({"$defs": {"node": {"type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v"]}},
               "$ref": "#/$defs/node"}),
        json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}),
        json!({"$schema": "http://json-schema.org/draft-07/schema#",
               "items": [{"type": "string"}], "additionalItems": {"type": "integer"},
               "dependencies": {"a": {"required": ["b"]}}}),
        json!(false),
    ]
}

/// Instances chosen for the places a reader in place could differ from `Value`:
/// duplicate names (the last one counts), names out of order, escapes in names and
/// strings, numbers an integer or a float, non-ASCII lengths, nesting.
const PARITY_VALUES: &[&str] = &[
    r#"{"name": "x", "age": 1}"#,
    r#"{"name": "x", "name": 5}"#,
    r#"{"name": 5, "name": "x"}"#,
    r#"{"age": 1, "name": "x", "age": "old"}"#,
    r#"{"na\u006de": "x"}"#,
    r#"{"name": "\"quoted\"\n", "kind": "a"}"#,
    r#"{"name": "x", "address": {"zip": "1"}, "kind": "b"}"#,
    r#"{"name": "x", "address": {"zip": 1}}"#,
    r#"{"name": "x", "extra": null}"#,
    r#"{"a": 1}"#,
    r#"{"a": -1}"#,
    r#"{"a": 1.0}"#,
    r#"{"a": 1, "b": 2}"#,
    r#"{"b": 2, "a": 1, "c": 3}"#,
    r#"{"a": 1, "a": 2, "a": 3}"#,
    r#"{"xa": "s", "y": 1.5}"#,
    r#"{"xa": 1}"#,
    r#"{"y": "s"}"#,
    r#"{"abc": 1, "d": 2}"#,
    r#"{"a": 1, "b": 2, "c": 3, "d": 4}"#,
    r#"{"c": 1}"#,
    r#"{"a": 1, "c": 2}"#,
    r#"{"a": 2}"#,
    r#"{"a": {"a": 1, "b": [true]}}"#,
    r#"{"v": 1, "next": {"v": 2, "next": {"v": "x"}}}"#,
    r#"{"v": 1, "next": {"v": 2, "next": {"v": 3}}}"#,
    r#"{"b": [true], "a": 1}"#,
    r#"{"b": [true], "a": 1.0}"#,
    r#"{"b": [1], "a": 1}"#,
    r#"[]"#,
    r#"[1]"#,
    r#"[1, 1]"#,
    r#"[1, 1.0]"#,
    r#"[1, null, 3]"#,
    r#"[null, null]"#,
    r#"[1, 2, 3, 4, 5]"#,
    r#"["s"]"#,
    r#"["s", 1]"#,
    r#"["s", "t"]"#,
    r#"[{"a": [1, 2]}]"#,
    r#"[{"a": [1, 2.0]}, 3]"#,
    r#"[[1, {"b": 2}]]"#,
    r#"[1, {"b": 2}]"#,
    r#"[1, {"b": 2.0}]"#,
    r#""ab""#,
    r#""abcd""#,
    r#""ééé""#,
    r#""éééé""#,
    r#""\u00e9\u00e9""#,
    r#""AB""#,
    r#""x""#,
    r#"1"#,
    r#"1.0"#,
    r#"-0"#,
    r#"-0.0"#,
    r#"1e2"#,
    r#"2.5"#,
    r#"99.5"#,
    r#"100"#,
    r#"0.1"#,
    r#"5"#,
    r#"7"#,
    r#"18446744073709551615"#,
    r#"-9223372036854775808"#,
    r#"true"#,
    r#"null"#,
    r#"{}"#,
    r#"  {"name" : "x" }  "#,
];

/// The in-place check agrees with the `Value` check, value for value, and reads the
/// same value.
#[test]
fn in_place_checks_agree_with_value_checks() {
    let mut parsed = Parsed::default();
    let mut valid = 0;
    for schema in parity_schemas() {
        let c = compile(&schema, 1).unwrap();
        for text in PARITY_VALUES {
            let v: Value = serde_json::from_slice(text.as_bytes()).unwrap();
            parsed.parse(text.as_bytes()).unwrap();
            let root = parsed.root().unwrap();
            assert_eq!(
                jsonschema::json::Node::to_value(&root).as_ref(),
                &v,
                "{text}"
            );
            let exact = c.validator.is_valid(&v);
            assert_eq!(c.in_place.is_valid(root), exact, "{schema} on {text}");
            assert_eq!(
                c.check_value_in(&mut parsed, text.as_bytes()).is_ok(),
                exact
            );
            valid += usize::from(exact);
        }
    }
    // Both outcomes are exercised.
    let all = parity_schemas().len() * PARITY_VALUES.len();
    assert!(valid > all / 10 && valid < all * 9 / 10, "{valid} of {all}");
}

/// A random JSON text over few names and values, members in random order and
/// sometimes repeated, strings sometimes escaped.
fn random_json(rng: &mut Rng, depth: u32, out: &mut String) {
    let names = ["a", "b", "c", "x1", "n\\u0061me", "é"];
    let strings = ["", "s", "ab", "abc", "\\u00e9\\u00e9", "x\\ny", "AB", "é"];
    match rng.below(if depth == 0 { 6 } else { 9 }) {
        0 => out.push_str("null"),
        1 => out.push_str(["true", "false"][rng.below(2) as usize]),
        2 => out.push_str(
            ["0", "1", "-1", "2.0", "0.5", "7", "1e2", "-0", "300"][rng.below(9) as usize],
        ),
        3..=5 => {
            out.push('"');
            out.push_str(strings[rng.below(strings.len() as u64) as usize]);
            out.push('"');
        }
        6 => {
            out.push('[');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                random_json(rng, depth - 1, out);
            }
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.below(6) {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(names[rng.below(names.len() as u64) as usize]);
                out.push_str("\":");
                random_json(rng, depth - 1, out);
            }
            out.push('}');
        }
    }
}

/// Random values over the same schemas: the in-place check and the `Value` check never
/// disagree. `SEGLOG_SEED` reruns a failure.
#[test]
fn in_place_checks_agree_on_random_values() {
    let seed = std::env::var("SEGLOG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Rng::new(std::process::id().into()).next_u64());
    let mut rng = Rng::new(seed);
    let compiled: Vec<(Value, Compiled)> = parity_schemas()
        .into_iter()
        .map(|s| {
            let c = compile(&s, 1).unwrap();
            (s, c)
        })
        .collect();
    for _ in 0..3000 {
        let mut text = String::new();
        random_json(&mut rng, 3, &mut text);
        let v: Value = serde_json::from_str(&text).unwrap();
        let mut parsed = Parsed::default();
        parsed.parse(text.as_bytes()).unwrap();
        let root = parsed.root().unwrap();
        assert_eq!(
            jsonschema::json::Node::to_value(&root).as_ref(),
            &v,
            "seed {seed}: {text}"
        );
        for (s, c) in &compiled {
            assert_eq!(
                c.in_place.is_valid(root),
                c.validator.is_valid(&v),
                "seed {seed}: {s} on {text}"
            );
        }
    }
}

/// What is not one JSON text is refused in place too (and then reported by the `Value`
/// check with serde_json's message).
#[test]
fn in_place_refuses_what_is_not_json() {
    let c = compile(&json!({}), 1).unwrap();
    let mut parsed = Parsed::default();
    for text in [
        "",
        "{",
        "[1,]",
        r#"{"a" 1}"#,
        "1 2",
        "nul",
        "\"\\x\"",
        "{\"a\":1}}",
    ] {
        assert!(parsed.parse(text.as_bytes()).is_err(), "{text:?}");
        let (pointer, detail) = c.check_value_in(&mut parsed, text.as_bytes()).unwrap_err();
        assert_eq!(pointer, "");
        assert!(detail.starts_with("the value is not JSON: "), "{detail}");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(parsed.parse(deep.as_bytes()).is_err());
    assert!(serde_json::from_str::<Value>(&deep).is_err());
    assert!(c.check_value(b"[[1]]").is_ok());
}
