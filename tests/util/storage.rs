//! Small helpers around the storages of `seglog::testkit::storage`, where the hook
//! and failing storages live.

use std::path::Path;
use std::sync::Arc;

use seglog::engine::storage::io::{RealStorage, StorageRef};

/// True for a segment log file (`.log`).
pub fn is_log(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "log")
}

/// The real file system as the engine takes it.
pub fn real() -> StorageRef {
    Arc::new(RealStorage)
}
