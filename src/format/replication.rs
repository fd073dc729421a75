//! `DATA/topics/<name>/replication.json`: a replicated topic's replication factor and,
//! per partition, the node ids that hold its replicas (the members of its Raft
//! group). A topic without the file is not replicated (today's single-node topic).
//!
//! ```text
//! {"replication_factor": 3, "replicas": [[1, 2, 3], [2, 3, 1]]}
//! ```
//! Invariants (checked by [`Replication::decode`]): one list per partition, each of
//! exactly `replication_factor` distinct node ids; the factor is 1..=[`REPLICAS_MAX`].

use crate::format::topic::PARTITIONS_MAX;

/// The file's name in the topic directory.
pub const REPLICATION_FILE: &str = "replication.json";
/// Most replicas of one partition.
pub const REPLICAS_MAX: u32 = 7;
/// Largest file read.
pub const REPLICATION_FILE_BYTES_MAX: usize = 4 << 20;

/// A replicated topic's placement.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replication {
    pub replication_factor: u32,
    pub replicas: Vec<Vec<u64>>,
}

/// Why a placement is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    #[error("{REPLICATION_FILE} of {len} bytes is larger than {REPLICATION_FILE_BYTES_MAX}")]
    TooLarge { len: usize },
    #[error("{REPLICATION_FILE}: {detail}")]
    Json { detail: String },
    #[error("replication factor {factor} is outside 1..={REPLICAS_MAX}")]
    Factor { factor: u32 },
    #[error("replication factor {factor} is more than the {nodes} nodes of the cluster")]
    TooFewNodes { factor: u32, nodes: usize },
    #[error("partition {partition}: {detail}")]
    Replicas { partition: usize, detail: String },
}

impl Replication {
    /// Places `partitions` partitions on `nodes` (ids, any order): partition p on the
    /// `factor` nodes after position p of the sorted ids, so every replica of a
    /// partition is on a distinct node and leadership candidates spread.
    pub fn place(
        nodes: &[u64],
        partitions: u32,
        factor: u32,
    ) -> Result<Replication, ReplicationError> {
        if factor == 0 || factor > REPLICAS_MAX {
            return Err(ReplicationError::Factor { factor });
        }
        let mut ids = nodes.to_vec();
        ids.sort_unstable();
        ids.dedup();
        if factor as usize > ids.len() {
            return Err(ReplicationError::TooFewNodes {
                factor,
                nodes: ids.len(),
            });
        }
        let n = ids.len();
        let replicas = (0..partitions as usize)
            .map(|p| {
                (0..factor as usize)
                    .filter_map(|i| ids.get((p + i) % n).copied())
                    .collect()
            })
            .collect();
        Ok(Replication {
            replication_factor: factor,
            replicas,
        })
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Parses and checks a file for a topic of `partitions` partitions.
    pub fn decode(bytes: &[u8], partitions: u32) -> Result<Replication, ReplicationError> {
        if bytes.len() > REPLICATION_FILE_BYTES_MAX {
            return Err(ReplicationError::TooLarge { len: bytes.len() });
        }
        let r: Replication = serde_json::from_slice(bytes).map_err(|e| ReplicationError::Json {
            detail: e.to_string(),
        })?;
        r.check(partitions)?;
        Ok(r)
    }

    fn check(&self, partitions: u32) -> Result<(), ReplicationError> {
        let factor = self.replication_factor;
        if factor == 0 || factor > REPLICAS_MAX {
            return Err(ReplicationError::Factor { factor });
        }
        if partitions > PARTITIONS_MAX || self.replicas.len() != partitions as usize {
            return Err(ReplicationError::Json {
                detail: format!(
                    "{} replica lists for {partitions} partitions",
                    self.replicas.len()
                ),
            });
        }
        for (partition, nodes) in self.replicas.iter().enumerate() {
            if nodes.len() != factor as usize {
                return Err(ReplicationError::Replicas {
                    partition,
                    detail: format!("{} replicas, not {factor}", nodes.len()),
                });
            }
            let mut sorted = nodes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != nodes.len() {
                return Err(ReplicationError::Replicas {
                    partition,
                    detail: "a node holds two replicas".into(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn placement_is_distinct_and_spread() {
        let r = Replication::place(&[3, 1, 2], 4, 3).unwrap();
        assert_eq!(
            r.replicas,
            vec![vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2], vec![1, 2, 3]]
        );
        let r = Replication::place(&[1, 2, 3], 2, 1).unwrap();
        assert_eq!(r.replicas, vec![vec![1], vec![2]]);
        assert_eq!(
            Replication::place(&[1, 2], 1, 3),
            Err(ReplicationError::TooFewNodes {
                factor: 3,
                nodes: 2
            })
        );
        assert!(matches!(
            Replication::place(&[1], 1, 0),
            Err(ReplicationError::Factor { .. })
        ));
    }

    #[test]
    fn round_trip_and_checks() {
        let r = Replication::place(&[1, 2, 3], 3, 2).unwrap();
        let bytes = r.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            "{\"replication_factor\":2,\"replicas\":[[1,2],[2,3],[3,1]]}\n"
        );
        assert_eq!(Replication::decode(&bytes, 3).unwrap(), r);
        assert!(Replication::decode(&bytes, 2).is_err());
        let dup = br#"{"replication_factor":2,"replicas":[[1,1]]}"#;
        assert!(matches!(
            Replication::decode(dup, 1),
            Err(ReplicationError::Replicas { .. })
        ));
        let extra = br#"{"replication_factor":1,"replicas":[[1]],"x":1}"#;
        assert!(matches!(
            Replication::decode(extra, 1),
            Err(ReplicationError::Json { .. })
        ));
        assert!(matches!(
            Replication::decode(&vec![b' '; REPLICATION_FILE_BYTES_MAX + 1], 1),
            Err(ReplicationError::TooLarge { .. })
        ));
    }
}
