//! Compatibility of two JSON Schemas: can a reader schema read every value a writer
//! schema accepts? A documented subset of Confluent Schema Registry's JSON Schema
//! checks (docs/FORMAT.md, Schemas, lists exactly what each rule accepts and refuses).
//!
//! The analysis is conservative: a change it cannot prove harmless is refused. The
//! keywords it understands are compared structurally (`type`, `enum`, `const`,
//! `properties`, `required`, `additionalProperties`, `items`, the numeric and length
//! bounds); annotations are ignored; every other keyword must be equal in both
//! schemas at the same place. Nesting is bounded by [`DEPTH_MAX`] (no unbounded
//! recursion on input).

use serde_json::{Map, Value};

use crate::format::schemas::Compatibility;

/// Deepest nesting of schemas the check follows.
pub const DEPTH_MAX: usize = 64;

/// Keywords that never change which values a schema accepts.
const ANNOTATIONS: [&str; 11] = [
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$anchor",
];

/// Keywords compared structurally below.
const UNDERSTOOD: [&str; 15] = [
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// Why a new schema is not compatible with the latest one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incompatible {
    /// JSON pointer into the schemas where the change is.
    pub path: String,
    pub reason: String,
}

impl std::fmt::Display for Incompatible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.path.is_empty() {
            "the root"
        } else {
            &self.path
        };
        write!(f, "at {path}: {}", self.reason)
    }
}

/// Checks `new` against `latest` under `rule`: backward = `new` reads what `latest`
/// wrote; forward = `latest` reads what `new` writes; full = both; none = always.
pub fn check(rule: Compatibility, latest: &Value, new: &Value) -> Result<(), Incompatible> {
    let backward = || {
        can_read(new, latest, "", 0).map_err(|mut e| {
            e.reason = format!("backward: {}", e.reason);
            e
        })
    };
    let forward = || {
        can_read(latest, new, "", 0).map_err(|mut e| {
            e.reason = format!("forward: {}", e.reason);
            e
        })
    };
    match rule {
        Compatibility::None => Ok(()),
        Compatibility::Backward => backward(),
        Compatibility::Forward => forward(),
        Compatibility::Full => backward().and_then(|()| forward()),
    }
}

fn fail(path: &str, reason: impl Into<String>) -> Result<(), Incompatible> {
    Err(Incompatible {
        path: path.to_string(),
        reason: reason.into(),
    })
}

/// `{}` and `true` accept everything; `false` nothing.
fn accepts_all(s: &Value) -> bool {
    match s {
        Value::Bool(b) => *b,
        Value::Object(m) => m.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

fn accepts_nothing(s: &Value) -> bool {
    matches!(s, Value::Bool(false))
}

/// The JSON types a schema admits (`None` = any).
fn types(m: &Map<String, Value>) -> Option<Vec<&str>> {
    match m.get("type")? {
        Value::String(t) => Some(vec![t.as_str()]),
        Value::Array(ts) => Some(ts.iter().filter_map(Value::as_str).collect()),
        _ => Some(Vec::new()),
    }
}

fn admits(types: &Option<Vec<&str>>, t: &str) -> bool {
    match types {
        None => true,
        Some(ts) => ts.contains(&t) || (t == "integer" && ts.contains(&"number")),
    }
}

/// The values a schema allows by `enum` or `const`, if it restricts them.
fn allowed_values(m: &Map<String, Value>) -> Option<Vec<&Value>> {
    let from_enum = m
        .get("enum")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect::<Vec<_>>());
    let from_const = m.get("const").map(|c| vec![c]);
    match (from_enum, from_const) {
        (Some(e), Some(c)) => Some(e.into_iter().filter(|v| c.contains(v)).collect()),
        (e, c) => e.or(c),
    }
}

/// Can a reader with schema `r` read every value valid under writer schema `w`?
fn can_read(r: &Value, w: &Value, path: &str, depth: usize) -> Result<(), Incompatible> {
    if depth > DEPTH_MAX {
        return fail(path, format!("schemas nested deeper than {DEPTH_MAX}"));
    }
    if r == w || accepts_all(r) || accepts_nothing(w) {
        return Ok(());
    }
    if accepts_nothing(r) {
        return fail(path, "the reader accepts nothing (false)");
    }
    let empty = Map::new();
    let (Some(rm), wm) = (r.as_object(), w.as_object().unwrap_or(&empty)) else {
        return fail(path, "a schema is neither an object nor a boolean");
    };
    check_other_keywords(rm, wm, path)?;
    check_types(rm, wm, path)?;
    check_values(rm, wm, path)?;
    check_bounds(rm, wm, path)?;
    let (rt, wt) = (types(rm), types(wm));
    if admits(&rt, "object") && admits(&wt, "object") {
        check_object(rm, wm, path, depth)?;
    }
    if admits(&rt, "array") && admits(&wt, "array") {
        if let Some(ri) = rm.get("items") {
            let wi = wm.get("items").unwrap_or(&Value::Bool(true));
            can_read(ri, wi, &format!("{path}/items"), depth + 1)?;
        }
    }
    Ok(())
}

/// Keywords that are neither annotations nor understood must be the same.
fn check_other_keywords(
    rm: &Map<String, Value>,
    wm: &Map<String, Value>,
    path: &str,
) -> Result<(), Incompatible> {
    let other =
        |k: &String| !ANNOTATIONS.contains(&k.as_str()) && !UNDERSTOOD.contains(&k.as_str());
    for k in rm.keys().chain(wm.keys()).filter(|k| other(k)) {
        if rm.get(k) != wm.get(k) {
            return fail(
                &format!("{path}/{k}"),
                format!("keyword {k} differs (changes to it are not analysed, so refused)"),
            );
        }
    }
    Ok(())
}

fn check_types(
    rm: &Map<String, Value>,
    wm: &Map<String, Value>,
    path: &str,
) -> Result<(), Incompatible> {
    let Some(rt) = types(rm) else { return Ok(()) };
    let at = format!("{path}/type");
    match types(wm) {
        None => fail(&at, format!("type narrowed from any to {rt:?}")),
        Some(wt) => match wt.iter().find(|t| !admits(&Some(rt.clone()), t)) {
            Some(t) => fail(&at, format!("type {t:?} no longer allowed (now {rt:?})")),
            None => Ok(()),
        },
    }
}

fn check_values(
    rm: &Map<String, Value>,
    wm: &Map<String, Value>,
    path: &str,
) -> Result<(), Incompatible> {
    let Some(rv) = allowed_values(rm) else {
        return Ok(());
    };
    let at = format!("{path}/enum");
    match allowed_values(wm) {
        None => fail(&at, "enum added where any value was allowed"),
        Some(wv) => match wv.iter().find(|v| !rv.contains(v)) {
            Some(v) => fail(&at, format!("enum narrowed: {v} no longer allowed")),
            None => Ok(()),
        },
    }
}

/// A reader's lower bound may not rise and its upper bound may not fall.
fn check_bounds(
    rm: &Map<String, Value>,
    wm: &Map<String, Value>,
    path: &str,
) -> Result<(), Incompatible> {
    let lower = ["minimum", "exclusiveMinimum", "minLength", "minItems"];
    let upper = ["maximum", "exclusiveMaximum", "maxLength", "maxItems"];
    for (keys, is_lower) in [(&lower[..], true), (&upper[..], false)] {
        for k in keys {
            let Some(rb) = rm.get(*k).and_then(Value::as_f64) else {
                continue;
            };
            let at = format!("{path}/{k}");
            match wm.get(*k).and_then(Value::as_f64) {
                None => return fail(&at, format!("{k} {rb} added")),
                Some(wb) if (is_lower && rb > wb) || (!is_lower && rb < wb) => {
                    return fail(&at, format!("{k} tightened from {wb} to {rb}"));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// `additionalProperties` as a schema: absent = `true`.
fn additional(m: &Map<String, Value>) -> &Value {
    m.get("additionalProperties").unwrap_or(&Value::Bool(true))
}

fn props(m: &Map<String, Value>) -> Option<&Map<String, Value>> {
    m.get("properties").and_then(Value::as_object)
}

fn required(m: &Map<String, Value>) -> Vec<&str> {
    m.get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn check_object(
    rm: &Map<String, Value>,
    wm: &Map<String, Value>,
    path: &str,
    depth: usize,
) -> Result<(), Incompatible> {
    let empty = Map::new();
    let (rp, wp) = (props(rm).unwrap_or(&empty), props(wm).unwrap_or(&empty));
    let (ra, wa) = (additional(rm), additional(wm));
    let wreq = required(wm);
    for name in required(rm) {
        if !wreq.contains(&name) {
            return fail(
                &format!("{path}/required"),
                format!("property {name:?} became required"),
            );
        }
    }
    for (name, rs) in rp {
        let at = format!("{path}/properties/{}", escape(name));
        match wp.get(name) {
            Some(ws) => can_read(rs, ws, &at, depth + 1)?,
            // The writer's data holds `name` only as its additional properties allow.
            None => can_read(rs, wa, &at, depth + 1).map_err(|mut e| {
                if accepts_all(wa) {
                    e.reason = format!(
                        "property {name:?} added to an open content model (the old data may \
                         hold any value there): {}",
                        e.reason
                    );
                }
                e
            })?,
        }
    }
    for (name, ws) in wp {
        if rp.contains_key(name) {
            continue;
        }
        let at = format!("{path}/properties/{}", escape(name));
        can_read(ra, ws, &at, depth + 1).map_err(|mut e| {
            if accepts_nothing(ra) {
                e.reason = format!("property {name:?} removed from a closed content model");
            }
            e
        })?;
    }
    can_read(ra, wa, &format!("{path}/additionalProperties"), depth + 1).map_err(|mut e| {
        if accepts_nothing(ra) {
            e.reason = "additional properties closed (additionalProperties: false) where the \
                        old model was open"
                .to_string();
        }
        e
    })
}

/// A property name as a JSON pointer token.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use serde_json::json;

    fn backward(old: Value, new: Value) -> Result<(), Incompatible> {
        check(Compatibility::Backward, &old, &new)
    }

    fn obj(props: Value, required: Value, additional: Option<bool>) -> Value {
        let mut v = json!({"type": "object", "properties": props, "required": required});
        if let Some(a) = additional {
            v["additionalProperties"] = json!(a);
        }
        v
    }

    #[test]
    fn types() {
        let s = |t: Value| json!({ "type": t });
        assert!(backward(s(json!("integer")), s(json!("number"))).is_ok());
        assert!(backward(s(json!("number")), s(json!("integer"))).is_err());
        assert!(backward(s(json!("string")), s(json!(["string", "null"]))).is_ok());
        assert!(backward(s(json!(["string", "null"])), s(json!("string"))).is_err());
        assert!(backward(json!({}), s(json!("string"))).is_err());
        assert!(backward(s(json!("string")), json!({})).is_ok());
        assert!(backward(s(json!("string")), json!(true)).is_ok());
        assert!(backward(s(json!("string")), json!(false)).is_err());
    }

    #[test]
    fn enums() {
        let e = |v: Value| json!({ "type": "string", "enum": v });
        assert!(backward(e(json!(["a", "b"])), e(json!(["a", "b", "c"]))).is_ok());
        let err = backward(e(json!(["a", "b"])), e(json!(["a"]))).unwrap_err();
        assert_eq!(err.path, "/enum");
        assert!(err.reason.contains("narrowed"), "{err}");
        assert!(backward(json!({"type": "string"}), e(json!(["a"]))).is_err());
        assert!(backward(
            json!({"type": "string", "const": "a"}),
            e(json!(["a", "b"]))
        )
        .is_ok());
        // Types are compared as written: a writer without `type` may hold any type.
        assert!(backward(json!({"const": "a"}), e(json!(["a", "b"]))).is_err());
    }

    #[test]
    fn properties_open_and_closed() {
        let s = json!({"type": "string"});
        let i = json!({"type": "integer"});
        // Added optional property: refused under an open model, fine under a closed one.
        let old_open = obj(json!({"a": s}), json!([]), None);
        let new_open = obj(json!({"a": s, "b": i}), json!([]), None);
        let err = backward(old_open.clone(), new_open.clone()).unwrap_err();
        assert_eq!(err.path, "/properties/b/type");
        assert!(err.reason.contains("open content model"), "{err}");
        let old_closed = obj(json!({"a": s}), json!([]), Some(false));
        let new_closed = obj(json!({"a": s, "b": i}), json!([]), Some(false));
        assert!(backward(old_closed.clone(), new_closed.clone()).is_ok());
        // Removed property: fine under an open reader, refused under a closed one.
        assert!(backward(new_open.clone(), old_open.clone()).is_ok());
        let err = backward(new_closed, old_closed).unwrap_err();
        assert!(err.reason.contains("closed content model"), "{err}");
        // Added property that accepts anything is fine even for an open writer.
        let new_any = obj(json!({"a": s, "b": {}}), json!([]), None);
        assert!(backward(old_open.clone(), new_any).is_ok());
        // Closing an open model is refused; opening a closed one is fine.
        let closed = obj(json!({"a": s}), json!([]), Some(false));
        assert!(backward(old_open.clone(), closed.clone()).is_err());
        assert!(backward(closed, old_open).is_ok());
    }

    #[test]
    fn required_and_nesting() {
        let s = json!({"type": "string"});
        let old = obj(json!({"a": s, "b": s}), json!(["a"]), None);
        let new = obj(json!({"a": s, "b": s}), json!(["a", "b"]), None);
        let err = backward(old.clone(), new.clone()).unwrap_err();
        assert_eq!(err.path, "/required");
        assert!(backward(new, old).is_ok());
        let nest = |inner: Value| obj(json!({ "addr": inner }), json!([]), None);
        let zip_s = obj(json!({"zip": {"type": "string"}}), json!([]), None);
        let zip_i = obj(json!({"zip": {"type": "integer"}}), json!([]), None);
        let err = backward(nest(zip_s.clone()), nest(zip_i)).unwrap_err();
        assert_eq!(err.path, "/properties/addr/properties/zip/type");
        assert!(backward(nest(zip_s.clone()), nest(zip_s)).is_ok());
        let arr = |t: &str| json!({"type": "array", "items": {"type": t}});
        assert!(backward(arr("integer"), arr("number")).is_ok());
        assert!(backward(arr("number"), arr("integer")).is_err());
    }

    #[test]
    fn bounds_and_unknown_keywords() {
        let s = |max: u64| json!({"type": "string", "maxLength": max});
        assert!(backward(s(10), s(20)).is_ok());
        assert!(backward(s(20), s(10)).is_err());
        assert!(backward(json!({"type": "string"}), s(10)).is_err());
        let p = |pat: &str| json!({"type": "string", "pattern": pat});
        assert!(backward(p("^a"), p("^a")).is_ok());
        assert!(backward(p("^a"), p("^b")).is_err());
        assert!(backward(json!({"title": "x"}), json!({"title": "y"})).is_ok());
    }

    #[test]
    fn rules() {
        let s = json!({"type": "string"});
        let old = obj(json!({"a": s}), json!([]), Some(false));
        let new = obj(json!({"a": s, "b": s}), json!([]), Some(false));
        // Adding to a closed model: backward yes, forward no, full no, none yes.
        assert!(check(Compatibility::Backward, &old, &new).is_ok());
        assert!(check(Compatibility::Forward, &old, &new).is_err());
        assert!(check(Compatibility::Full, &old, &new).is_err());
        assert!(check(Compatibility::None, &old, &new).is_ok());
        // Adding to an open model an optional property of any value: full.
        let open_old = obj(json!({"a": s}), json!([]), None);
        let open_new = obj(json!({"a": s, "b": {}}), json!([]), None);
        assert!(check(Compatibility::Full, &open_old, &open_new).is_ok());
        assert!(check(Compatibility::Forward, &new, &old).is_ok());
    }

    #[test]
    fn depth_is_bounded() {
        let nest = |inner: &str| {
            let mut deep = json!({ "type": inner });
            for _ in 0..(DEPTH_MAX + 5) {
                deep = json!({"type": "array", "items": deep});
            }
            deep
        };
        let err = backward(nest("integer"), nest("number")).unwrap_err();
        assert!(err.reason.contains("deeper"), "{err}");
    }
}
