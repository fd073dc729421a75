//! The API-key store: `DATA/api_keys.json` (bytes: [`crate::format::keys`]) loaded
//! when the broker opens, the check of a presented token, and what a key may do.
//!
//! The API another listener calls (the native server does exactly this):
//! ```text
//! let principal = broker.keys().authenticate(token, peer.ip())?;   // at login
//! principal.allows(Action::Produce, Resource::Topic("orders"))      // per request
//! broker.keys().current(&principal)                                 // still valid?
//! ```
//! [`KeyStore::authenticate`] answers [`AuthError::Failed`] for every token that does
//! not match a live key (malformed, unknown id, revoked, wrong secret) and
//! [`AuthError::RateLimited`] while the peer's address has used up its failed attempts;
//! a Kafka listener maps both to SASL_AUTHENTICATION_FAILED with the API key as the
//! PLAIN password.
//!
//! Invariants:
//! - The file holds SHA-256 hashes of secrets, never a secret; it is replaced whole
//!   with the atomic-replace helper (mode 0600) and a create or revoke returns only
//!   after that replace: an acknowledged change survives a crash. After a failed
//!   replace the store refuses further changes until a restart.
//! - A token is checked in time that does not depend on which part is wrong: the id
//!   is looked up, the secret hashed, and the hash compared with [`subtle`] against
//!   the key's hash or, for an unknown id, against a dummy hash, so a wrong id costs
//!   what a wrong secret and a right token cost.
//! - Failed attempts are limited per source address by a token bucket
//!   ([`FAILURES_BURST`] attempts, refilled at [`FAILURES_PER_SECOND`]); an address
//!   that ran out is refused before its token is looked at, and no other address is
//!   affected. At most [`TRACKED_ADDRESSES_MAX`] addresses are tracked; past that, the
//!   untracked ones share one bucket.
//! - `last_used_ms` is kept in memory at each login and written lazily: with the next
//!   change, at shutdown, or by a login at most once per [`LAST_USED_WRITE_INTERVAL`];
//!   never one fsync per request.
//! - Every change bumps [`KeyStore::generation`], so a session can notice with one
//!   atomic load that its key may have been revoked.
//!
//! Lock order: `change` → `state` → `limiter` (the limiter is never held with `state`
//! the other way round).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use crate::engine::partition::now_ms;
use crate::engine::storage::io::{write_file_atomic, StorageRef};
pub use crate::format::keys::Role;
use crate::format::keys::{
    check_key_name, check_patterns, compile_pattern, decode_hash, decode_keys, encode_hash,
    encode_key_id, encode_keys, format_token, hash_secret, parse_token, KeyEntry, KeysDoc,
    KEYS_FILE, KEYS_FILE_BYTES_MAX, KEYS_MAX, KEY_ID_BYTES, SECRET_BYTES,
};

/// Failed attempts an address may make at once.
pub const FAILURES_BURST: f64 = 20.0;
/// Failed attempts an address regains per second.
pub const FAILURES_PER_SECOND: f64 = 1.0;
/// Most source addresses whose failures are tracked one by one.
pub const TRACKED_ADDRESSES_MAX: usize = 4096;
/// Shortest time between two writes of `last_used_ms` caused by logins.
pub const LAST_USED_WRITE_INTERVAL: Duration = Duration::from_secs(60);

/// Whether the listeners require a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Required as soon as the store holds a key (the default).
    Auto,
    Required,
    Off,
}

/// What a request does, for [`Principal::allows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Produce (plain or idempotent), init producer.
    Produce,
    /// Read metadata: list or describe topics, read a topic's schema.
    Describe,
    /// Fetch, list offsets.
    Consume,
    /// Join, sync, heartbeat, leave, commit and fetch offsets, describe a group.
    Group,
    /// Everything else: create, alter and delete topics and groups, register and
    /// delete schemas, list groups and schemas, stats, API keys.
    Admin,
}

/// What a request acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
    /// No one topic or group (init producer, list topics, admin requests).
    Cluster,
}

/// A key as the store holds it: the entry and its compiled patterns.
#[derive(Debug)]
struct LiveKey {
    entry: KeyEntry,
    hash: [u8; 32],
    topics: Vec<glob::Pattern>,
    groups: Vec<glob::Pattern>,
    last_used_ms: AtomicI64,
}

/// Who a session authenticated as.
#[derive(Clone, Debug)]
pub struct Principal {
    key: Arc<LiveKey>,
}

impl Principal {
    pub fn key_id(&self) -> &str {
        &self.key.entry.id
    }

    pub fn name(&self) -> &str {
        &self.key.entry.name
    }

    pub fn role(&self) -> Role {
        self.key.entry.role
    }

    /// Whether the key's role and patterns allow `action` on `resource`
    /// (docs/PROTOCOL.md, "Authentication").
    pub fn allows(&self, action: Action, resource: Resource<'_>) -> bool {
        let topic_ok = |t: &str| self.key.topics.iter().any(|p| p.matches(t));
        let group_ok = |g: &str| self.key.groups.iter().any(|p| p.matches(g));
        match (self.role(), action, resource) {
            (Role::Admin, _, _) => true,
            (_, Action::Admin, _) => false,
            // Listing topics: the answer holds only the topics the key may see.
            (_, Action::Describe, Resource::Cluster) => true,
            (_, Action::Describe, Resource::Topic(t)) => topic_ok(t),
            (Role::Producer, Action::Produce, Resource::Topic(t)) => topic_ok(t),
            // Init producer names no topic; each produce is checked.
            (Role::Producer, Action::Produce, Resource::Cluster) => true,
            (Role::Consumer, Action::Consume, Resource::Topic(t)) => topic_ok(t),
            (Role::Consumer, Action::Group, Resource::Group(g)) => group_ok(g),
            // A group request's topic (offset commit, offset fetch).
            (Role::Consumer, Action::Group, Resource::Topic(t)) => topic_ok(t),
            _ => false,
        }
    }
}

/// Refuses patterns that `role` does not use (as [`Principal::allows`] decides): an
/// admin key may do everything, so `--topic`/`--group` would not limit it; a producer
/// key uses no consumer group. A key listed with patterns that are never checked would
/// look more limited than it is.
pub fn check_role_patterns(role: Role, topics: &[String], groups: &[String]) -> Result<(), String> {
    match role {
        Role::Admin if !topics.is_empty() || !groups.is_empty() => Err(
            "an admin key may use every topic and group; --topic and --group would not limit it \
             (create a producer or consumer key instead)"
                .to_string(),
        ),
        Role::Producer if !groups.is_empty() => {
            Err("a producer key uses no consumer group; --group is for consumer keys".to_string())
        }
        _ => Ok(()),
    }
}

/// Why a login failed. The messages say nothing about which part of a token is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("authentication failed: the token is not a valid API key")]
    Failed,
    #[error(
        "too many failed logins from {peer}: try again in {}s",
        retry_after.as_secs().max(1)
    )]
    RateLimited { peer: IpAddr, retry_after: Duration },
}

/// Why a key operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("{0}")]
    Invalid(String),
    #[error("unknown role {0:?} (producer, consumer or admin)")]
    BadRole(String),
    #[error("no API key has id {id:?}")]
    UnknownKey { id: String },
    #[error("the broker already holds {KEYS_MAX} API keys; revoke some first")]
    TooMany,
    #[error("{path} is unreadable: {detail}")]
    Unreadable { path: PathBuf, detail: String },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("key changes are refused until a restart: an earlier replace of {path} failed")]
    Poisoned { path: PathBuf },
}

/// A new key, as [`KeyStore::create`] returns it: the token is shown once.
#[derive(Clone, Debug)]
pub struct Created {
    pub entry: KeyEntry,
    pub token: String,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Self {
        Bucket {
            tokens: FAILURES_BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * FAILURES_PER_SECOND).min(FAILURES_BURST);
        self.at = now;
    }

    fn retry_after(&self) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / FAILURES_PER_SECOND).max(0.0))
    }
}

/// Failed attempts per source address.
#[derive(Debug, Default)]
struct Limiter {
    buckets: HashMap<IpAddr, Bucket>,
    /// Shared by the addresses that found the map full.
    overflow: Option<Bucket>,
}

impl Limiter {
    fn bucket(&mut self, peer: IpAddr, now: Instant) -> &mut Bucket {
        if !self.buckets.contains_key(&peer) && self.buckets.len() >= TRACKED_ADDRESSES_MAX {
            // Forget the addresses whose buckets are full again: they are no different
            // from an address never seen.
            self.buckets.retain(|_, b| {
                b.refill(now);
                b.tokens < FAILURES_BURST
            });
        }
        if self.buckets.len() >= TRACKED_ADDRESSES_MAX && !self.buckets.contains_key(&peer) {
            return self.overflow.get_or_insert_with(|| Bucket::full(now));
        }
        self.buckets
            .entry(peer)
            .or_insert_with(|| Bucket::full(now))
    }

    /// `Err(retry_after)` while `peer` has no attempt left.
    fn check(&mut self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let b = self.bucket(peer, now);
        b.refill(now);
        if b.tokens < 1.0 {
            return Err(b.retry_after());
        }
        Ok(())
    }

    fn fail(&mut self, peer: IpAddr, now: Instant) {
        let b = self.bucket(peer, now);
        b.refill(now);
        b.tokens = (b.tokens - 1.0).max(0.0);
    }
}

#[derive(Debug, Default)]
struct State {
    /// In file order.
    keys: Vec<Arc<LiveKey>>,
    by_id: HashMap<String, Arc<LiveKey>>,
}

/// The keys of a data directory; shared by every listener of a broker and used
/// offline by `seglog keys`.
#[derive(Debug)]
pub struct KeyStore {
    storage: StorageRef,
    data_dir: PathBuf,
    change: Mutex<()>,
    state: RwLock<State>,
    count: AtomicUsize,
    generation: AtomicU64,
    limiter: Mutex<Limiter>,
    mode: AtomicU8,
    /// A node of this broker's cluster requires logins (its hello said so): under
    /// [`AuthMode::Auto`] this broker requires them too, keys or none.
    cluster_requires: AtomicBool,
    /// Compared against when a token names no key, so that costs what a real
    /// comparison costs.
    dummy_hash: [u8; 32],
    poisoned: AtomicBool,
    /// A login changed some `last_used_ms` since the file was last written.
    dirty: AtomicBool,
    last_write: Mutex<Instant>,
    failures: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn random<const N: usize>() -> Result<[u8; N], KeyError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| KeyError::Io {
        context: "reading random bytes from the operating system".into(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok(b)
}

fn live(entry: KeyEntry) -> Result<LiveKey, KeyError> {
    let compile = |ps: &[String]| {
        ps.iter()
            .map(|p| compile_pattern(p).map_err(KeyError::Invalid))
            .collect::<Result<Vec<_>, _>>()
    };
    let hash = decode_hash(&entry.secret_sha256)
        .ok_or_else(|| KeyError::Invalid(format!("key {}: bad secret_sha256", entry.id)))?;
    Ok(LiveKey {
        hash,
        topics: compile(&entry.topics)?,
        groups: compile(&entry.groups)?,
        last_used_ms: AtomicI64::new(entry.last_used_ms),
        entry,
    })
}

/// Reads `DATA/api_keys.json`; a missing file holds no key.
pub fn read_file(data_dir: &Path) -> Result<KeysDoc, KeyError> {
    let path = data_dir.join(KEYS_FILE);
    let unreadable = |detail: String| KeyError::Unreadable {
        path: path.clone(),
        detail,
    };
    // A regular file, bounded before anything is allocated (a FIFO is never opened).
    let Some(bytes) =
        crate::engine::producers::read_state_file(&path, KEYS_FILE_BYTES_MAX as usize)
            .map_err(unreadable)?
    else {
        return Ok(KeysDoc::default());
    };
    decode_keys(&bytes).map_err(|e| unreadable(e.to_string()))
}

/// Reads `DATA/api_keys.json` and checks every key as the broker's open does
/// (`verify`); returns how many keys it holds (0 without the file).
pub fn check_file(data_dir: &Path) -> Result<usize, KeyError> {
    let doc = read_file(data_dir)?;
    let count = doc.keys.len();
    for entry in doc.keys {
        live(entry)?;
    }
    Ok(count)
}

impl KeyStore {
    /// Loads `DATA/api_keys.json` (the broker at open, `seglog keys` offline with
    /// `DATA/LOCK` held).
    pub fn open(storage: StorageRef, data_dir: &Path) -> Result<KeyStore, KeyError> {
        KeyStore::from_doc(storage, data_dir, read_file(data_dir)?)
    }

    /// A store holding `doc` (as read from `data_dir`); changes are written there.
    pub fn from_doc(
        storage: StorageRef,
        data_dir: &Path,
        doc: KeysDoc,
    ) -> Result<KeyStore, KeyError> {
        let mut state = State::default();
        for entry in doc.keys {
            let k = Arc::new(live(entry)?);
            state.by_id.insert(k.entry.id.clone(), Arc::clone(&k));
            state.keys.push(k);
        }
        Ok(KeyStore {
            storage,
            data_dir: data_dir.to_path_buf(),
            change: Mutex::new(()),
            count: AtomicUsize::new(state.keys.len()),
            state: RwLock::new(state),
            generation: AtomicU64::new(0),
            limiter: Mutex::new(Limiter::default()),
            mode: AtomicU8::new(0),
            cluster_requires: AtomicBool::new(false),
            dummy_hash: hash_secret(&random::<SECRET_BYTES>()?),
            poisoned: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            last_write: Mutex::new(Instant::now()),
            failures: AtomicU64::new(0),
        })
    }

    fn path(&self) -> PathBuf {
        self.data_dir.join(KEYS_FILE)
    }

    /// Sets whether listeners require a token.
    pub fn set_mode(&self, mode: AuthMode) {
        let v = match mode {
            AuthMode::Auto => 0,
            AuthMode::Required => 1,
            AuthMode::Off => 2,
        };
        self.mode.store(v, Ordering::Relaxed);
    }

    /// The mode set by [`KeyStore::set_mode`].
    pub fn mode(&self) -> AuthMode {
        match self.mode.load(Ordering::Relaxed) {
            1 => AuthMode::Required,
            2 => AuthMode::Off,
            _ => AuthMode::Auto,
        }
    }

    /// Whether a login is required right now (under [`AuthMode::Auto`]: whether the
    /// store holds a key, or a node of the cluster requires logins).
    pub fn required(&self) -> bool {
        match self.mode.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                self.count.load(Ordering::Relaxed) > 0
                    || self.cluster_requires.load(Ordering::Relaxed)
            }
        }
    }

    /// A node of the cluster requires logins: under [`AuthMode::Auto`] this broker
    /// requires them too from now on, until it stops, even while it holds no key
    /// (a new data directory, keys not copied to it): a node of a cluster that
    /// requires logins never serves without one. Returns whether that changed what
    /// [`KeyStore::required`] says.
    pub fn require_for_cluster(&self) -> bool {
        let before = self.required();
        self.cluster_requires.store(true, Ordering::Relaxed);
        !before && self.required()
    }

    /// Bumped by every create and revoke.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Failed logins since the broker started.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Checks a token presented by `peer`; see the module documentation.
    pub fn authenticate(&self, token: &str, peer: IpAddr) -> Result<Principal, AuthError> {
        let now = Instant::now();
        lock(&self.limiter)
            .check(peer, now)
            .map_err(|retry_after| AuthError::RateLimited { peer, retry_after })?;
        let (id, secret) = match parse_token(token) {
            Ok((id, secret)) => (id, secret),
            // Still hash and compare, so a malformed token costs what a wrong one does.
            Err(_) => ("", [0u8; SECRET_BYTES]),
        };
        let found = self
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id
            .get(id)
            .cloned();
        let hash = hash_secret(&secret);
        let expected = found.as_ref().map_or(&self.dummy_hash, |k| &k.hash);
        let equal: bool = hash.ct_eq(expected).into();
        match found {
            Some(key) if equal && !id.is_empty() => {
                key.last_used_ms.store(now_ms(), Ordering::Relaxed);
                self.dirty.store(true, Ordering::Relaxed);
                self.write_last_used_if_due();
                Ok(Principal { key })
            }
            _ => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                lock(&self.limiter).fail(peer, now);
                Err(AuthError::Failed)
            }
        }
    }

    /// The principal's key as the store holds it now: `None` once revoked.
    pub fn current(&self, principal: &Principal) -> Option<Principal> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.by_id.get(principal.key_id()).map(|key| Principal {
            key: Arc::clone(key),
        })
    }

    /// Every key, in creation order, with its in-memory `last_used_ms`.
    pub fn list(&self) -> Vec<KeyEntry> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.keys.iter().map(|k| snapshot(k)).collect()
    }

    /// Creates a key; the token in the result is the only copy of its secret.
    pub fn create(
        &self,
        name: &str,
        role: &str,
        topics: &[String],
        groups: &[String],
    ) -> Result<Created, KeyError> {
        check_key_name(name).map_err(KeyError::Invalid)?;
        let role = Role::parse(role).ok_or_else(|| KeyError::BadRole(role.to_string()))?;
        check_patterns("topic", topics).map_err(KeyError::Invalid)?;
        check_patterns("group", groups).map_err(KeyError::Invalid)?;
        check_role_patterns(role, topics, groups).map_err(KeyError::Invalid)?;
        let _change = lock(&self.change);
        let mut keys = self.entries();
        if keys.len() >= KEYS_MAX {
            return Err(KeyError::TooMany);
        }
        let id = loop {
            let id = encode_key_id(&random::<KEY_ID_BYTES>()?);
            if !keys.iter().any(|k| k.id == id) {
                break id;
            }
        };
        let secret = random::<SECRET_BYTES>()?;
        let entry = KeyEntry {
            id: id.clone(),
            name: name.to_string(),
            role,
            topics: topics.to_vec(),
            groups: groups.to_vec(),
            created_ms: now_ms(),
            last_used_ms: -1,
            secret_sha256: encode_hash(&hash_secret(&secret)),
        };
        keys.push(entry.clone());
        self.replace(keys)?;
        Ok(Created {
            token: format_token(&id, &secret),
            entry,
        })
    }

    /// Removes a key: logins with it fail from now on, and sessions that logged in
    /// with it are refused at their next request.
    pub fn revoke(&self, id: &str) -> Result<KeyEntry, KeyError> {
        let _change = lock(&self.change);
        let mut keys = self.entries();
        let at = keys
            .iter()
            .position(|k| k.id == id)
            .ok_or_else(|| KeyError::UnknownKey { id: id.to_string() })?;
        let gone = keys.remove(at);
        self.replace(keys)?;
        Ok(gone)
    }

    /// Takes a key another node of the cluster created (the same id and secret hash),
    /// after checking it as the file's decoder does; a key of that id already here
    /// is kept. Returns whether it was added.
    pub fn take(&self, entry: KeyEntry) -> Result<bool, KeyError> {
        crate::format::keys::check_entry(&entry).map_err(KeyError::Invalid)?;
        check_role_patterns(entry.role, &entry.topics, &entry.groups).map_err(KeyError::Invalid)?;
        let _change = lock(&self.change);
        let mut keys = self.entries();
        if keys.iter().any(|k| k.id == entry.id) {
            return Ok(false);
        }
        if keys.len() >= KEYS_MAX {
            return Err(KeyError::TooMany);
        }
        keys.push(KeyEntry {
            last_used_ms: -1,
            ..entry
        });
        self.replace(keys)?;
        Ok(true)
    }

    /// [`KeyStore::revoke`] for a revoke another node of the cluster made: a key this
    /// node does not have is no error. Returns whether it was here.
    pub fn forget(&self, id: &str) -> Result<bool, KeyError> {
        match self.revoke(id) {
            Ok(_) => Ok(true),
            Err(KeyError::UnknownKey { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The key of id `id`, as the file holds it.
    pub fn entry(&self, id: &str) -> Option<KeyEntry> {
        self.list().into_iter().find(|k| k.id == id)
    }

    /// Writes `last_used_ms` if a login changed it (the broker at shutdown).
    pub fn flush(&self) -> Result<(), KeyError> {
        if !self.dirty.load(Ordering::Relaxed) {
            return Ok(());
        }
        let _change = lock(&self.change);
        let keys = self.entries();
        self.replace(keys)
    }

    /// A login writes `last_used_ms` when it is dirty and the last write is at least
    /// [`LAST_USED_WRITE_INTERVAL`] old; a failure is logged (the times are advisory).
    fn write_last_used_if_due(&self) {
        if lock(&self.last_write).elapsed() < LAST_USED_WRITE_INTERVAL {
            return;
        }
        let Ok(_change) = self.change.try_lock() else {
            return;
        };
        let keys = self.entries();
        if let Err(e) = self.replace(keys) {
            tracing::warn!(error = %e, "writing the keys' last-used times failed");
        }
    }

    /// The entries as the file will hold them (in-memory `last_used_ms`).
    fn entries(&self) -> Vec<KeyEntry> {
        self.list()
    }

    /// Writes `keys` atomically, then makes them current. The caller holds `change`.
    fn replace(&self, keys: Vec<KeyEntry>) -> Result<(), KeyError> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(KeyError::Poisoned { path: self.path() });
        }
        let mut live_keys = Vec::with_capacity(keys.len());
        for e in &keys {
            live_keys.push(Arc::new(live(e.clone())?));
        }
        self.dirty.store(false, Ordering::Relaxed);
        let bytes = encode_keys(&KeysDoc {
            format: crate::format::keys::KEYS_FORMAT,
            keys,
        });
        // 1. write a temporary file (0600), 2. fsync it, 3. rename it over
        // api_keys.json, 4. fsync the data directory (the helper numbers the same steps).
        if let Err(source) = write_file_atomic(&*self.storage, &self.data_dir, KEYS_FILE, &bytes) {
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(KeyError::Io {
                context: format!("replacing {}", self.path().display()),
                source,
            });
        }
        *lock(&self.last_write) = Instant::now();
        // 5. only now does the change become visible.
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        // Logins between the snapshot and now keep their times.
        for k in &live_keys {
            if let Some(old) = state.by_id.get(&k.entry.id) {
                let t = old.last_used_ms.load(Ordering::Relaxed);
                k.last_used_ms.fetch_max(t, Ordering::Relaxed);
            }
        }
        state.by_id = live_keys
            .iter()
            .map(|k| (k.entry.id.clone(), Arc::clone(k)))
            .collect();
        state.keys = live_keys;
        self.count.store(state.keys.len(), Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

fn snapshot(k: &LiveKey) -> KeyEntry {
    let mut e = k.entry.clone();
    e.last_used_ms = k.last_used_ms.load(Ordering::Relaxed);
    e
}

#[cfg(test)]
mod tests;
