//! The Raft log's small state file, `raft.json`, beside its segments: the vote, the
//! committed log id and the last purged log id. Replaced atomically (temporary file,
//! fsync, rename, directory fsync) before the call that changed it returns.

use std::io;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::entry::StoredLogId;
use crate::engine::storage::io::{write_file_atomic, Storage};

/// Name of the state file in a Raft log's directory.
pub const STATE_FILE: &str = "raft.json";
/// Largest state file read (it holds three small values).
pub const STATE_FILE_BYTES_MAX: u64 = 64 * 1024;
/// The state file's format version.
pub const STATE_VERSION: u32 = 1;

/// The state file's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaftState<V> {
    pub version: u32,
    pub vote: Option<V>,
    pub committed: Option<StoredLogId>,
    pub purged: Option<StoredLogId>,
}

impl<V> Default for RaftState<V> {
    fn default() -> Self {
        RaftState {
            version: STATE_VERSION,
            vote: None,
            committed: None,
            purged: None,
        }
    }
}

/// Why the state file cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is {len} bytes (at most {STATE_FILE_BYTES_MAX})")]
    TooLarge { path: String, len: u64 },
    #[error("{path}: {detail}")]
    Bad { path: String, detail: String },
}

/// Reads the state file in `dir`; none yet is the empty state.
pub fn read_state<V: DeserializeOwned>(dir: &Path) -> Result<RaftState<V>, StateFileError> {
    let path = dir.join(STATE_FILE);
    let shown = path.display().to_string();
    let io_err = |source| StateFileError::Io {
        path: shown.clone(),
        source,
    };
    let len = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(RaftState::default()),
        Err(e) => return Err(io_err(e)),
    };
    if len > STATE_FILE_BYTES_MAX {
        return Err(StateFileError::TooLarge { path: shown, len });
    }
    let bytes = std::fs::read(&path).map_err(io_err)?;
    if bytes.len() as u64 > STATE_FILE_BYTES_MAX {
        return Err(StateFileError::TooLarge {
            path: shown,
            len: bytes.len() as u64,
        });
    }
    let state: RaftState<V> = serde_json::from_slice(&bytes).map_err(|e| StateFileError::Bad {
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(StateFileError::Bad {
            path: shown,
            detail: format!("unknown version {}", state.version),
        });
    }
    Ok(state)
}

/// Replaces the state file in `dir` atomically; durable when it returns.
pub fn write_state<V: Serialize>(
    storage: &dyn Storage,
    dir: &Path,
    state: &RaftState<V>,
) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    bytes.push(b'\n');
    write_file_atomic(storage, dir, STATE_FILE, &bytes)
}
