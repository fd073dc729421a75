//! Produced values read in place for validation. serde_json parses each value into one
//! arena that is reused for every value of a request, with strings borrowed from the
//! request where they hold no escape, instead of building a `serde_json::Value` per
//! record (a few dozen small allocations and frees, most of the cost of a check).
//! The validator runs on it through jsonschema's representation trait
//! ([`jsonschema::json::Json`]); the schema crate does all the validating.
//!
//! Invariants, which make a value valid here exactly when its `serde_json::Value` is:
//! - numbers are `serde_json::Number`s made by the same parser callbacks as `Value`'s
//!   (a float that is not finite becomes null, as there);
//! - an object holds each key once, the last occurrence winning, in byte order of the
//!   keys: what serde_json's `Map` (a `BTreeMap` here) holds after the same parse;
//! - the nesting depth is serde_json's parser limit, as for `Value`.
//!
//! Slots are pushed children first, so a container's children have lower indices and
//! the root is the last slot. `items` and `members` hold each container's children
//! contiguously; `scratch_*` collect them while a container is being read, nested
//! containers draining their own part first.

use std::borrow::Cow;

use jsonschema::json::{cmp, Array, Json, Node, NodeIdentity, Object};
use jsonschema::JsonType;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The representation: nodes of a [`Parsed`] arena.
pub struct InPlace;

/// One parsed value.
#[derive(Debug)]
enum Slot<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    /// `items[start..start + len]` are the elements' slots.
    Array {
        start: usize,
        len: usize,
    },
    /// `members[start..start + len]`: sorted by name, names distinct.
    Object {
        start: usize,
        len: usize,
    },
}

/// The arena one value at a time is parsed into; [`Parsed::parse`] reuses its memory.
#[derive(Debug, Default)]
pub struct Parsed<'a> {
    slots: Vec<Slot<'a>>,
    items: Vec<usize>,
    members: Vec<(Cow<'a, str>, usize)>,
    scratch_items: Vec<usize>,
    scratch_members: Vec<(Cow<'a, str>, usize)>,
}

/// Backs the nodes of [`InPlace::with_string_node`], which hold no container.
static EMPTY: Parsed<'static> = Parsed {
    slots: Vec::new(),
    items: Vec::new(),
    members: Vec::new(),
    scratch_items: Vec::new(),
    scratch_members: Vec::new(),
};

impl<'a> Parsed<'a> {
    /// Parses `value` (one JSON text, nothing after it but whitespace), replacing what
    /// was parsed before. The error is serde_json's, as for `from_slice`.
    pub fn parse(&mut self, value: &'a [u8]) -> Result<(), serde_json::Error> {
        self.slots.clear();
        self.items.clear();
        self.members.clear();
        self.scratch_items.clear();
        self.scratch_members.clear();
        // One UTF-8 check of the whole text is cheaper than serde_json's per string;
        // a text that is not UTF-8 is parsed as bytes, for serde_json's own error.
        let Ok(text) = std::str::from_utf8(value) else {
            let mut de = serde_json::Deserializer::from_slice(value);
            Seed { parsed: self }.deserialize(&mut de)?;
            return de.end();
        };
        let mut de = serde_json::Deserializer::from_str(text);
        Seed { parsed: self }.deserialize(&mut de)?;
        de.end()
    }

    /// The value parsed last; `None` before the first successful parse.
    pub fn root(&self) -> Option<Ref<'_>> {
        self.slots.last().map(|slot| Ref { parsed: self, slot })
    }

    fn push(&mut self, slot: Slot<'a>) -> usize {
        self.slots.push(slot);
        self.slots.len() - 1
    }
}

/// Reads one value into the arena; yields its slot index.
struct Seed<'p, 'a> {
    parsed: &'p mut Parsed<'a>,
}

impl<'de> DeserializeSeed<'de> for Seed<'_, 'de> {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_, 'de> {
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::Bool(v)))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::Number(v.into())))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::Number(v.into())))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<usize, E> {
        let slot = Number::from_f64(v).map_or(Slot::Null, Slot::Number);
        Ok(self.parsed.push(slot))
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::String(Cow::Borrowed(v))))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::String(Cow::Owned(v.to_owned()))))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::String(Cow::Owned(v))))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::Null))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<usize, E> {
        Ok(self.parsed.push(Slot::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let p = self.parsed;
        let mark = p.scratch_items.len();
        while let Some(slot) = seq.next_element_seed(Seed { parsed: &mut *p })? {
            p.scratch_items.push(slot);
        }
        let start = p.items.len();
        p.items.extend(p.scratch_items.drain(mark..));
        let len = p.items.len() - start;
        Ok(p.push(Slot::Array { start, len }))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let p = self.parsed;
        let mark = p.scratch_members.len();
        while let Some(name) = map.next_key_seed(NameSeed)? {
            let slot = map.next_value_seed(Seed { parsed: &mut *p })?;
            p.scratch_members.push((name, slot));
        }
        // Last occurrence first, then a stable sort by name: the first of each run of
        // equal names is the one a map keeps. Names already in strictly increasing
        // order (as serde_json writes a map) need neither.
        let part = &mut p.scratch_members[mark..];
        if !part.windows(2).all(|w| w[0].0 < w[1].0) {
            part.reverse();
            part.sort_by(|a, b| a.0.cmp(&b.0));
        }
        let start = p.members.len();
        for (name, slot) in p.scratch_members.drain(mark..) {
            if p.members.len() > start && p.members.last().is_some_and(|(n, _)| *n == name) {
                continue;
            }
            p.members.push((name, slot));
        }
        let len = p.members.len() - start;
        Ok(p.push(Slot::Object { start, len }))
    }
}

/// Reads an object member's name, borrowed where it has no escape.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object member name")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

/// A node: one slot of an arena.
#[derive(Clone, Copy)]
pub struct Ref<'a> {
    parsed: &'a Parsed<'a>,
    slot: &'a Slot<'a>,
}

impl<'a> Ref<'a> {
    fn at(self, index: usize) -> Ref<'a> {
        Ref {
            parsed: self.parsed,
            slot: &self.parsed.slots[index],
        }
    }

    /// The same value as a `serde_json::Value` (for errors and the rare keyword that
    /// compares whole containers).
    fn value(self) -> Value {
        match self.slot {
            Slot::Null => Value::Null,
            Slot::Bool(b) => Value::Bool(*b),
            Slot::Number(n) => Value::Number(n.clone()),
            Slot::String(s) => Value::String(s.to_string()),
            Slot::Array { start, len } => Value::Array(
                self.parsed.items[*start..*start + *len]
                    .iter()
                    .map(|&i| self.at(i).value())
                    .collect(),
            ),
            Slot::Object { start, len } => Value::Object(
                self.parsed.members[*start..*start + *len]
                    .iter()
                    .map(|(name, i)| (name.to_string(), self.at(*i).value()))
                    .collect::<Map<String, Value>>(),
            ),
        }
    }
}

impl Json for InPlace {
    type Node<'a> = Ref<'a>;
    type PreparedKey = String;
    type StringBuffer = ();

    // A lookup is a binary search over sorted names, as cheap as serde_json's map.
    const KEYS_PER_LOOKUP: usize = 2;
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> String {
        key.to_owned()
    }

    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(Ref<'_>) -> T) -> T {
        let slot = Slot::String(Cow::Borrowed(string));
        f(Ref {
            parsed: &EMPTY,
            slot: &slot,
        })
    }
}

impl<'a> Node<'a, InPlace> for Ref<'a> {
    type Object = Members<'a>;
    type Array = Items<'a>;
    type Number = &'a Number;

    fn as_object(&self) -> Option<Members<'a>> {
        match self.slot {
            Slot::Object { start, len } => Some(Members {
                parsed: self.parsed,
                members: &self.parsed.members[*start..*start + *len],
            }),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<Items<'a>> {
        match self.slot {
            Slot::Array { start, len } => Some(Items {
                parsed: self.parsed,
                items: &self.parsed.items[*start..*start + *len],
            }),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self.slot {
            Slot::String(s) => Some(Cow::Borrowed(s.as_ref())),
            _ => None,
        }
    }

    fn as_number(&self) -> Option<&'a Number> {
        match self.slot {
            Slot::Number(n) => Some(n),
            _ => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match self.slot {
            Slot::Bool(b) => Some(*b),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(self.slot, Slot::Null)
    }

    fn json_type(&self) -> JsonType {
        match self.slot {
            Slot::Null => JsonType::Null,
            Slot::Bool(_) => JsonType::Boolean,
            Slot::Number(_) => JsonType::Number,
            Slot::String(_) => JsonType::String,
            Slot::Array { .. } => JsonType::Array,
            Slot::Object { .. } => JsonType::Object,
        }
    }

    fn equals_value(&self, expected: &Value) -> bool {
        match (self.slot, expected) {
            (Slot::String(s), Value::String(e)) => s == e,
            (Slot::Bool(b), Value::Bool(e)) => b == e,
            (Slot::Null, Value::Null) => true,
            (Slot::Number(n), Value::Number(e)) => cmp::equal_numbers(n, e),
            (Slot::Array { .. }, Value::Array(_)) | (Slot::Object { .. }, Value::Object(_)) => {
                cmp::equal(&self.value(), expected)
            }
            _ => false,
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        Cow::Owned(self.value())
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::new(std::ptr::from_ref(self.slot) as usize))
    }
}

/// An object's members.
pub struct Members<'a> {
    parsed: &'a Parsed<'a>,
    members: &'a [(Cow<'a, str>, usize)],
}

impl<'a> Object<'a, InPlace> for Members<'a> {
    type Node = Ref<'a>;
    type MemberName = &'a str;
    type MembersIter = MembersIter<'a>;

    fn len(&self) -> usize {
        self.members.len()
    }

    fn get(&self, key: &String) -> Option<Ref<'a>> {
        let parsed = self.parsed;
        self.members
            .binary_search_by(|(name, _)| name.as_ref().cmp(key.as_str()))
            .ok()
            .map(|i| Ref {
                parsed,
                slot: &parsed.slots[self.members[i].1],
            })
    }

    fn members(&self) -> MembersIter<'a> {
        MembersIter {
            parsed: self.parsed,
            members: self.members.iter(),
        }
    }
}

pub struct MembersIter<'a> {
    parsed: &'a Parsed<'a>,
    members: std::slice::Iter<'a, (Cow<'a, str>, usize)>,
}

impl<'a> Iterator for MembersIter<'a> {
    type Item = (&'a str, Ref<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let parsed = self.parsed;
        self.members.next().map(|(name, i)| {
            (
                name.as_ref(),
                Ref {
                    parsed,
                    slot: &parsed.slots[*i],
                },
            )
        })
    }
}

/// An array's elements.
pub struct Items<'a> {
    parsed: &'a Parsed<'a>,
    items: &'a [usize],
}

impl<'a> Array<'a, InPlace> for Items<'a> {
    type Node = Ref<'a>;
    type ElementsIter = ItemsIter<'a>;

    fn len(&self) -> usize {
        self.items.len()
    }

    fn elements(&self) -> ItemsIter<'a> {
        ItemsIter {
            parsed: self.parsed,
            items: self.items.iter(),
        }
    }
}

pub struct ItemsIter<'a> {
    parsed: &'a Parsed<'a>,
    items: std::slice::Iter<'a, usize>,
}

impl<'a> Iterator for ItemsIter<'a> {
    type Item = Ref<'a>;

    fn next(&mut self) -> Option<Ref<'a>> {
        let parsed = self.parsed;
        self.items.next().map(|i| Ref {
            parsed,
            slot: &parsed.slots[*i],
        })
    }
}
