//! The checker of the replication tests: what the producers had acknowledged against
//! what each node's data partitions hold once the cluster is stopped (read offline
//! with `seglog dump --json --bytes hex`). The properties:
//! 1. every acknowledged record is on every node, at its acknowledged offset;
//! 2. all replicas hold the same offset -> record mapping;
//! 3. no offset holds two records (in one dump, or in two acknowledgements);
//! 4. no value appears twice (values are unique per produce call, so a second copy is
//!    a retry that was applied twice, in a dump, or acknowledged at two offsets).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One acknowledged record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    pub producer: u64,
    pub value: Vec<u8>,
    pub partition: u32,
    pub offset: u64,
}

/// One record of a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dumped {
    pub partition: u32,
    pub offset: u64,
    pub value: Vec<u8>,
}

/// What one node holds.
#[derive(Clone, Debug, Default)]
pub struct Replica {
    pub node: u64,
    /// In dump order.
    pub records: Vec<Dumped>,
}

/// A broken property, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Property 1: an acknowledged record is not at its offset on `node`.
    Lost {
        node: u64,
        partition: u32,
        offset: u64,
        want: String,
        got: Option<String>,
    },
    /// Property 2: the replicas hold different records (or none) at an offset.
    Diverged {
        partition: u32,
        offset: u64,
        by_node: Vec<(u64, Option<String>)>,
    },
    /// Property 3: an offset holds two records on `node`.
    TwoRecords {
        node: u64,
        partition: u32,
        offset: u64,
        values: Vec<String>,
    },
    /// Property 3: two different records were acknowledged at one offset.
    AckedTwice {
        partition: u32,
        offset: u64,
        values: Vec<String>,
    },
    /// Property 4: a value is stored twice on `node`.
    StoredTwice {
        node: u64,
        value: String,
        at: Vec<(u32, u64)>,
    },
    /// Property 4: a value was acknowledged at two places.
    AckedAtTwoOffsets { value: String, at: Vec<(u32, u64)> },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost {
                node,
                partition,
                offset,
                want,
                got,
            } => write!(
                f,
                "node {node}: acknowledged {want:?} at {partition}/{offset}, holds {got:?}"
            ),
            Violation::Diverged {
                partition,
                offset,
                by_node,
            } => write!(f, "replicas differ at {partition}/{offset}: {by_node:?}"),
            Violation::TwoRecords {
                node,
                partition,
                offset,
                values,
            } => write!(f, "node {node}: {partition}/{offset} holds {values:?}"),
            Violation::AckedTwice {
                partition,
                offset,
                values,
            } => write!(f, "{partition}/{offset} acknowledged for {values:?}"),
            Violation::StoredTwice { node, value, at } => {
                write!(f, "node {node}: {value:?} stored at {at:?}")
            }
            Violation::AckedAtTwoOffsets { value, at } => {
                write!(f, "{value:?} acknowledged at {at:?}")
            }
        }
    }
}

fn show(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// (partition, offset) -> value.
type Holdings = BTreeMap<(u32, u64), Vec<u8>>;

/// Checks the four properties; every violation found, in a stable order.
pub fn check(acks: &[Acked], replicas: &[Replica]) -> Vec<Violation> {
    let mut out = Vec::new();
    let acked = check_acks(acks, &mut out);
    let maps: Vec<(u64, Holdings)> = replicas
        .iter()
        .map(|r| (r.node, check_replica(r, &mut out)))
        .collect();
    // 1.
    for ((partition, offset), value) in &acked {
        for (node, map) in &maps {
            let got = map.get(&(*partition, *offset));
            if got != Some(value) {
                out.push(Violation::Lost {
                    node: *node,
                    partition: *partition,
                    offset: *offset,
                    want: show(value),
                    got: got.map(|g| show(g)),
                });
            }
        }
    }
    // 2.
    let offsets: BTreeSet<(u32, u64)> = maps.iter().flat_map(|(_, m)| m.keys().copied()).collect();
    for at in offsets {
        let by_node: Vec<(u64, Option<&Vec<u8>>)> =
            maps.iter().map(|(n, m)| (*n, m.get(&at))).collect();
        if by_node.windows(2).any(|w| w[0].1 != w[1].1) {
            out.push(Violation::Diverged {
                partition: at.0,
                offset: at.1,
                by_node: by_node
                    .into_iter()
                    .map(|(n, v)| (n, v.map(|v| show(v))))
                    .collect(),
            });
        }
    }
    out
}

/// Properties 3 and 4 over the acknowledgements; the offset -> value map they give.
fn check_acks(acks: &[Acked], out: &mut Vec<Violation>) -> Holdings {
    let mut by_offset: BTreeMap<(u32, u64), BTreeSet<&[u8]>> = BTreeMap::new();
    let mut by_value: BTreeMap<&[u8], BTreeSet<(u32, u64)>> = BTreeMap::new();
    for a in acks {
        by_offset
            .entry((a.partition, a.offset))
            .or_default()
            .insert(&a.value);
        by_value
            .entry(&a.value)
            .or_default()
            .insert((a.partition, a.offset));
    }
    for ((partition, offset), values) in &by_offset {
        if values.len() > 1 {
            out.push(Violation::AckedTwice {
                partition: *partition,
                offset: *offset,
                values: values.iter().map(|v| show(v)).collect(),
            });
        }
    }
    for (value, at) in &by_value {
        if at.len() > 1 {
            out.push(Violation::AckedAtTwoOffsets {
                value: show(value),
                at: at.iter().copied().collect(),
            });
        }
    }
    by_offset
        .into_iter()
        .filter_map(|(at, values)| values.first().map(|v| (at, v.to_vec())))
        .collect()
}

/// Properties 3 and 4 on one node; its offset -> value map (the first record seen at
/// each offset).
fn check_replica(r: &Replica, out: &mut Vec<Violation>) -> Holdings {
    let mut by_offset: BTreeMap<(u32, u64), Vec<&[u8]>> = BTreeMap::new();
    let mut by_value: BTreeMap<&[u8], Vec<(u32, u64)>> = BTreeMap::new();
    for d in &r.records {
        by_offset
            .entry((d.partition, d.offset))
            .or_default()
            .push(&d.value);
        by_value
            .entry(&d.value)
            .or_default()
            .push((d.partition, d.offset));
    }
    for ((partition, offset), values) in &by_offset {
        if values.len() > 1 {
            out.push(Violation::TwoRecords {
                node: r.node,
                partition: *partition,
                offset: *offset,
                values: values.iter().map(|v| show(v)).collect(),
            });
        }
    }
    for (value, at) in &by_value {
        if at.len() > 1 {
            out.push(Violation::StoredTwice {
                node: r.node,
                value: show(value),
                at: at.clone(),
            });
        }
    }
    by_offset
        .into_iter()
        .filter_map(|(at, values)| values.first().map(|v| (at, v.to_vec())))
        .collect()
}

/// The records of `seglog dump --json --bytes hex` output; `Err` names the first
/// line that is not a record of the expected shape, or a problem line (other than
/// one of severity "info").
pub fn parse_dump(text: &str) -> Result<Vec<Dumped>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{line:?}: {e}"))?;
        match v["type"].as_str() {
            Some("record") => {}
            // Informational notes (such as a preallocated zero tail) are not damage.
            Some("problem") if v["severity"].as_str() == Some("info") => continue,
            Some("problem") => return Err(format!("the dump met a problem: {line}")),
            _ => continue,
        }
        let partition = v["partition"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| format!("no partition: {line}"))?;
        let offset = v["offset"]
            .as_u64()
            .ok_or_else(|| format!("no offset: {line}"))?;
        let value = v["value"]
            .as_str()
            .and_then(unhex)
            .ok_or_else(|| format!("no hex value: {line}"))?;
        out.push(Dumped {
            partition,
            offset,
            value,
        });
    }
    Ok(out)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
