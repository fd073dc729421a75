//! The Raft network between nodes: a listener on `--raft-listen`, and one TCP
//! connection to each peer that carries the calls of every partition's group (frames
//! of [`crate::format::wire::raft`]).
//!
//! Invariants:
//! - A connection serves calls only after both hellos agree on the cluster id; a node
//!   with no cluster id yet adopts its peer's ([`Identity::adopt`]); two different
//!   ids refuse the connection and the node says so on stderr, once per peer.
//! - Both hellos list the same node ids (each node's `--peers`), or the connection is
//!   refused before any cluster id is adopted, and both nodes say on stderr which
//!   ids differ ([`members_differ`]).
//! - With a cluster secret (`--cluster-secret-file`), a connection serves calls only
//!   after each side proved it holds the same secret ([`super::secret`]), and a node
//!   adopts no cluster id and records nothing of a peer before its proof is checked.
//!   A node without a secret refuses a peer that has one, and the reverse: the
//!   operator is told on both sides.
//! - Every length read from a peer is checked ([`check_peer_frame_len`]) before the
//!   frame is allocated; the first frames of a connection, before any proof, against
//!   [`HANDSHAKE_BYTES_MAX`].
//! - A call to a peer that is not connected fails at once (openraft retries after its
//!   backoff); the connection is redialled with an exponential backoff.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse};
use openraft::raft::{StreamAppendError, StreamAppendResult};
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory, RaftNetworkV2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::log_store::key::{EntryKey, EntryKind};
use super::log_store::{StoredEntry, StoredLeaderId, ENTRY_VALUE_BYTES_MAX};
use super::peer_tls::{is_tls_failure, tls_text, PeerConn, PeerTls, TLS_FLAGS};
use super::secret::{ClusterSecret, Handshake, Side};
use super::types::{Entry, LogId, TypeConfig, Vote};
use crate::engine::storage::io::{write_file_atomic, StorageRef};
use crate::format::wire::raft::append;
use crate::format::wire::raft::{
    check_peer_frame_len, decode_peer_frame, encode_peer_frame, peer_text, PeerFrame, Rpc,
    HANDSHAKE_BYTES_MAX, HELLO_LOGINS, NONCE_LEN, PEER_VERSION,
};
use crate::format::wire::LEN_FIELD;

/// What a refusal for a different cluster id says (the line on stderr carries it).
const CLUSTER_MISMATCH: &str = "is not this node's cluster id";
/// What a refusal for different `--peers` lists says (the line on stderr carries it).
const PEERS_MISMATCH: &str = "--peers lists differ";
/// What a refusal about the cluster secret names (the line on stderr carries it).
const SECRET_MISMATCH: &str = "--cluster-secret-file";
/// The cluster id's file in the data directory.
pub const CLUSTER_FILE: &str = "cluster.json";
/// Largest `cluster.json` read.
const CLUSTER_FILE_BYTES_MAX: u64 = 4096;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest each frame of the handshake may take to arrive.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Calls queued to one peer's connection at once.
const OUTGOING_QUEUE: usize = 4096;
/// A connected peer that leaves a call unanswered this long, with nothing heard from
/// it meanwhile, is said not to answer ([`Peer::answering`]): a paused process keeps
/// its connections open. Twice the longest election timeout; heartbeats are answered
/// every 100 ms.
const STALLED_AFTER_MS: u64 = 2_000;
/// How often an idle connection to a peer sends a call ([`run_dialled`]).
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Milliseconds since the first call (a monotonic clock for the peers' timestamps).
fn clock_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let ms = EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis();
    // Starts at 1: 0 means "no call waiting".
    u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether this node requires logins from its clients (its hello says so), and what
/// it does when a peer that proved itself says it requires them (the node's
/// [`crate::engine::keys::KeyStore::require_for_cluster`]).
pub struct Logins {
    pub required: Box<dyn Fn() -> bool + Send + Sync>,
    pub peer_requires: Box<dyn Fn(u64) + Send + Sync>,
}

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins")
            .field("required", &(self.required)())
            .finish_non_exhaustive()
    }
}

/// Who this node is: its id, its client address, and the cluster id once known.
#[derive(Debug)]
pub struct Identity {
    pub node_id: u64,
    pub client_addr: String,
    /// Its Kafka listener as clients reach it; empty when it has none.
    pub kafka_addr: String,
    /// The ids of every node of its `--peers`, ascending (a peer's hello must list
    /// the same).
    members: Vec<u64>,
    cluster_id: Mutex<Option<String>>,
    /// The node with the lowest id: it makes the cluster id when it meets a peer
    /// that has none either.
    founder: bool,
    /// The data directory had no `cluster.json` when the node started (a first
    /// start, or a directory that was lost and replaced).
    new_directory: bool,
    /// The cluster secret peers must prove they hold (`None`: no proof asked).
    secret: Option<ClusterSecret>,
    /// Logins, as the hellos carry them (`None`: the hello says none are required,
    /// and peers' hellos change nothing).
    logins: Option<Logins>,
    /// TLS on every Raft connection (`None`: plain TCP).
    tls: Option<PeerTls>,
    data_dir: PathBuf,
    storage: StorageRef,
}

/// The cluster id as `DATA/cluster.json` holds it, with the id of the node whose
/// data directory it is (absent in files written before it was recorded).
#[derive(serde::Serialize, serde::Deserialize)]
struct ClusterFile {
    cluster_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<u64>,
}

/// What `DATA/cluster.json` says, if the directory has one: the cluster id and, when
/// recorded, the node id the directory belongs to.
pub fn read_cluster_file(
    data_dir: &std::path::Path,
) -> Result<Option<(String, Option<u64>)>, ClusterIdError> {
    use std::io::Read;
    let path = data_dir.join(CLUSTER_FILE);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        // Never opened: a FIFO would block the read.
        Ok(_) => {
            return Err(ClusterIdError::Bad {
                path,
                detail: "not a regular file".into(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ClusterIdError::Io { path, source }),
    }
    let file = match crate::engine::storage::noatime::open_read(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ClusterIdError::Io { path, source }),
    };
    // Bounded before anything is allocated: the file is a few dozen bytes.
    let mut bytes = Vec::new();
    if let Err(source) = file
        .take(CLUSTER_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
    {
        return Err(ClusterIdError::Io { path, source });
    }
    if bytes.len() as u64 > CLUSTER_FILE_BYTES_MAX {
        return Err(ClusterIdError::Bad {
            path,
            detail: format!("larger than {CLUSTER_FILE_BYTES_MAX} bytes"),
        });
    }
    let f: ClusterFile = serde_json::from_slice(&bytes).map_err(|e| ClusterIdError::Bad {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    if !valid_cluster_id(&f.cluster_id) {
        return Err(ClusterIdError::Bad {
            path,
            detail: format!("bad cluster id {:?}", f.cluster_id),
        });
    }
    Ok(Some((f.cluster_id, f.node_id)))
}

/// Why a node cannot take part in its cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterIdError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a cluster id file: {detail}")]
    Bad { path: PathBuf, detail: String },
}

impl Identity {
    /// Reads `DATA/cluster.json`. With none, the node waits to adopt its peers' id;
    /// the node with the lowest id of the cluster (`founder`) makes a new one when it
    /// meets a peer that has none either ([`Identity::agree`]), or at once when it is
    /// the only node ([`Identity::found_if_alone`]). So a founder whose directory was
    /// replaced joins its cluster again, as any other node does.
    pub fn load(
        node_id: u64,
        client_addr: String,
        data_dir: PathBuf,
        storage: StorageRef,
        founder: bool,
    ) -> Result<Identity, ClusterIdError> {
        let id = read_cluster_file(&data_dir)?.map(|(id, _)| id);
        Ok(Identity {
            node_id,
            client_addr,
            kafka_addr: String::new(),
            members: Vec::new(),
            new_directory: id.is_none(),
            cluster_id: Mutex::new(id),
            founder,
            secret: None,
            logins: None,
            tls: None,
            data_dir,
            storage,
        })
    }

    /// A founder that is its cluster's only node makes the cluster id now: no peer
    /// will ever ask for it.
    pub fn found_if_alone(&self) -> Result<(), ClusterIdError> {
        if self.founder && self.members.iter().all(|&id| id == self.node_id) {
            self.found().map_err(|source| ClusterIdError::Io {
                path: self.data_dir.join(CLUSTER_FILE),
                source,
            })?;
        }
        Ok(())
    }

    /// Makes a new cluster id and takes it, unless the node has one.
    fn found(&self) -> io::Result<()> {
        if self.cluster_id().is_some() {
            return Ok(());
        }
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| io::Error::other(e.to_string()))?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        self.adopt(&id).map(|_| ())
    }

    /// Whether the data directory had no `cluster.json` when the node started.
    pub fn new_directory(&self) -> bool {
        self.new_directory
    }

    /// The same identity, telling peers its Kafka listener `addr` (`None`: none).
    pub fn with_kafka_addr(mut self, addr: Option<&str>) -> Identity {
        self.kafka_addr = addr.unwrap_or_default().to_string();
        self
    }

    /// The same identity, with `nodes` (its `--peers`: id, Raft address) as the
    /// membership its peers' hellos must list.
    pub fn with_members(mut self, nodes: &[(u64, String)]) -> Identity {
        let mut ids: Vec<u64> = nodes.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        self.members = ids;
        self
    }

    /// The same identity, asking every peer to prove it holds `secret`.
    pub fn with_secret(mut self, secret: Option<ClusterSecret>) -> Identity {
        self.secret = secret;
        self
    }

    /// The same identity, with TLS on every Raft connection (`serve --raft-tls-*`).
    pub fn with_tls(mut self, tls: Option<PeerTls>) -> Identity {
        self.tls = tls;
        self
    }

    /// The same identity, saying in its hellos whether it requires logins and
    /// told when an authenticated peer's hello says the peer does.
    pub fn with_logins(mut self, logins: Logins) -> Identity {
        self.logins = Some(logins);
        self
    }

    /// The flags of this node's hello.
    fn hello_flags(&self) -> u8 {
        match &self.logins {
            Some(l) if (l.required)() => HELLO_LOGINS,
            _ => 0,
        }
    }

    /// Acts on the flags of the hello of `peer`, once it proved itself.
    fn heard_flags(&self, peer: u64, flags: u8) {
        if flags & HELLO_LOGINS != 0 {
            if let Some(l) = &self.logins {
                (l.peer_requires)(peer);
            }
        }
    }

    /// The cluster id, once known.
    pub fn cluster_id(&self) -> Option<String> {
        lock(&self.cluster_id).clone()
    }

    /// Takes `id` as this node's cluster id, durably, unless it has one. Returns
    /// whether `id` is (now) the node's cluster id.
    pub fn adopt(&self, id: &str) -> io::Result<bool> {
        let mut held = lock(&self.cluster_id);
        if let Some(have) = &*held {
            return Ok(have == id);
        }
        if !valid_cluster_id(id) {
            return Ok(false);
        }
        let bytes = serde_json::to_vec(&ClusterFile {
            cluster_id: id.to_string(),
            node_id: Some(self.node_id),
        })
        .map_err(io::Error::other)?;
        write_file_atomic(&*self.storage, &self.data_dir, CLUSTER_FILE, &bytes)?;
        *held = Some(id.to_string());
        Ok(true)
    }

    /// Checks a peer's cluster id before the peer proved anything: a different id
    /// refuses, and the founder of a new cluster makes its id (as [`Identity::agree`]
    /// would), but no id is adopted.
    fn precheck(&self, theirs: &str) -> Result<(), String> {
        if theirs.is_empty() {
            return self.agree(theirs);
        }
        match self.cluster_id() {
            Some(have) if have != theirs => Err(format!(
                "cluster id {} {CLUSTER_MISMATCH} ({have})",
                peer_text(theirs)
            )),
            _ => Ok(()),
        }
    }

    /// Checks a peer's hello once the peer proved itself, adopting its cluster id
    /// when this node has none: `Err` names why the connection is refused.
    fn agree(&self, theirs: &str) -> Result<(), String> {
        if theirs.is_empty() {
            return match self.cluster_id() {
                Some(_) => Ok(()),
                // A new cluster: the founder makes its id; the peer, which saw an
                // empty hello, refuses this once and adopts the id at the redial.
                None if self.founder => self
                    .found()
                    .map_err(|e| format!("cannot record the cluster id: {e}")),
                None => Err("neither node has a cluster id yet".into()),
            };
        }
        match self.adopt(theirs) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "cluster id {} {CLUSTER_MISMATCH} ({})",
                peer_text(theirs),
                self.cluster_id().unwrap_or_default()
            )),
            Err(e) => Err(format!("cannot record the cluster id: {e}")),
        }
    }

    fn hello(&self) -> (String, u64, String, String) {
        (
            self.cluster_id().unwrap_or_default(),
            self.node_id,
            self.client_addr.clone(),
            self.kafka_addr.clone(),
        )
    }
}

/// Why two nodes' `--peers` lists do not make one cluster, naming each node's ids
/// and what one has that the other lacks (the same sentence on both sides); `None`
/// when they list the same ids.
pub fn members_differ(a: u64, a_ids: &[u64], b: u64, b_ids: &[u64]) -> Option<String> {
    if a_ids == b_ids {
        return None;
    }
    let list = |ids: &[u64]| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let only = |x: &[u64], y: &[u64]| -> Vec<u64> {
        x.iter().copied().filter(|i| !y.contains(i)).collect()
    };
    let mut lacks = Vec::new();
    for (node, missing) in [(a, only(b_ids, a_ids)), (b, only(a_ids, b_ids))] {
        if !missing.is_empty() {
            lacks.push(format!("node {node}'s lacks {}", list(&missing)));
        }
    }
    Some(format!(
        "{PEERS_MISMATCH}: node {a} lists nodes {}, node {b} lists nodes {} ({}); \
         every node needs the same --peers",
        list(a_ids),
        list(b_ids),
        lacks.join(", ")
    ))
}

fn valid_cluster_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= crate::format::wire::raft::CLUSTER_ID_BYTES_MAX
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Why a call to a peer did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("node {0} is not connected")]
    Unreachable(u64),
    #[error("node {node}: {detail}")]
    Failed { node: u64, detail: String },
}

/// Where the reply of a queued call comes.
pub type Reply = oneshot::Receiver<Result<Vec<u8>, CallError>>;

struct Outgoing {
    topic: String,
    partition: u32,
    rpc: Rpc,
    payload: Vec<u8>,
    reply: oneshot::Sender<Result<Vec<u8>, CallError>>,
}

/// One peer: its address, its connection task's queue and what its hello said.
#[derive(Debug)]
pub struct Peer {
    pub id: u64,
    pub raft_addr: String,
    tx: mpsc::Sender<Outgoing>,
    rx: Mutex<Option<mpsc::Receiver<Outgoing>>>,
    client_addr: Mutex<Option<String>>,
    connected: AtomicBool,
    /// The Kafka address its hello gave (`None`: not connected yet, or no listener).
    kafka_addr: Mutex<Option<String>>,
    /// [`clock_ms`] when a call was sent with none waiting before (0: none waits).
    waiting_since: AtomicU64,
    /// [`clock_ms`] when a reply last came.
    last_heard: AtomicU64,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call {:?} {}/{}", self.rpc, self.topic, self.partition)
    }
}

impl Peer {
    /// The client address its hello gave, once connected once.
    pub fn client_addr(&self) -> Option<String> {
        lock(&self.client_addr).clone()
    }

    /// Whether its connection is up now.
    pub fn reachable(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Whether it is connected and answers: not when a call has waited longer than
    /// [`STALLED_AFTER_MS`] with no reply heard meanwhile (a paused process, a
    /// link that drops everything without closing).
    pub fn answering(&self) -> bool {
        if !self.reachable() {
            return false;
        }
        let since = self.waiting_since.load(Ordering::Relaxed);
        if since == 0 {
            return true;
        }
        let quiet_from = since.max(self.last_heard.load(Ordering::Relaxed));
        clock_ms().saturating_sub(quiet_from) <= STALLED_AFTER_MS
    }

    /// Sends one call and waits for its reply.
    pub async fn call(
        &self,
        topic: &str,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let rx = self.send(topic, partition, rpc, payload)?;
        self.wait(rx, timeout).await
    }

    /// Queues one call on the connection and returns where its reply will come.
    /// Calls queued one after another go out on the wire in that order.
    pub fn send(
        &self,
        topic: &str,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
    ) -> Result<Reply, CallError> {
        if !self.reachable() {
            return Err(CallError::Unreachable(self.id));
        }
        let (reply, rx) = oneshot::channel();
        let out = Outgoing {
            topic: topic.to_string(),
            partition,
            rpc,
            payload,
            reply,
        };
        self.tx
            .try_send(out)
            .map_err(|_| CallError::Unreachable(self.id))?;
        Ok(rx)
    }

    /// Waits up to `timeout` for the reply of a call [`Peer::send`] queued.
    pub async fn wait(&self, rx: Reply, timeout: Duration) -> Result<Vec<u8>, CallError> {
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(CallError::Unreachable(self.id)),
            Err(_) => Err(CallError::Failed {
                node: self.id,
                detail: format!("no reply within {timeout:?}"),
            }),
        }
    }
}

/// Every other node of the cluster, by id.
#[derive(Debug)]
pub struct Peers {
    pub ident: Arc<Identity>,
    pub peers: BTreeMap<u64, Arc<Peer>>,
    /// The peers' client addresses learned from the hellos they sent us.
    heard: Mutex<HashMap<u64, String>>,
    /// The peers' Kafka addresses learned from the hellos they sent us.
    heard_kafka: Mutex<HashMap<u64, String>>,
    /// The refusals of incoming connections already said on stderr (each once).
    told: Mutex<HashSet<String>>,
}

impl Peers {
    /// The peers of `ident` from `(id, raft address)` pairs (this node's own entry is
    /// skipped). Their connection tasks start with [`Peers::start`].
    pub fn new(ident: Arc<Identity>, all: &[(u64, String)]) -> Arc<Peers> {
        let peers = all
            .iter()
            .filter(|(id, _)| *id != ident.node_id)
            .map(|(id, addr)| {
                let (tx, rx) = mpsc::channel(OUTGOING_QUEUE);
                let p = Peer {
                    id: *id,
                    raft_addr: addr.clone(),
                    tx,
                    rx: Mutex::new(Some(rx)),
                    client_addr: Mutex::new(None),
                    connected: AtomicBool::new(false),
                    kafka_addr: Mutex::new(None),
                    waiting_since: AtomicU64::new(0),
                    last_heard: AtomicU64::new(0),
                };
                (*id, Arc::new(p))
            })
            .collect();
        Arc::new(Peers {
            ident,
            peers,
            heard: Mutex::new(HashMap::new()),
            heard_kafka: Mutex::new(HashMap::new()),
            told: Mutex::new(HashSet::new()),
        })
    }

    /// Starts one connection task per peer on the current runtime.
    pub fn start(self: &Arc<Self>) {
        for peer in self.peers.values() {
            if let Some(rx) = lock(&peer.rx).take() {
                tokio::spawn(dial_loop(Arc::clone(&self.ident), Arc::clone(peer), rx));
            }
        }
    }

    /// A node's client address, as it told us (or this node's own).
    pub fn client_addr(&self, node: u64) -> Option<String> {
        if node == self.ident.node_id {
            return Some(self.ident.client_addr.clone());
        }
        let peer = self.peers.get(&node).and_then(|p| p.client_addr());
        peer.or_else(|| lock(&self.heard).get(&node).cloned())
    }

    fn heard(&self, node: u64, client_addr: &str) {
        lock(&self.heard).insert(node, client_addr.to_string());
    }

    /// A node's Kafka address, as it told us (or this node's own); `None` when it has
    /// no Kafka listener or has not been heard from.
    pub fn kafka_addr(&self, node: u64) -> Option<String> {
        let addr = if node == self.ident.node_id {
            Some(self.ident.kafka_addr.clone())
        } else {
            let peer = self
                .peers
                .get(&node)
                .and_then(|p| lock(&p.kafka_addr).clone());
            peer.or_else(|| lock(&self.heard_kafka).get(&node).cloned())
        };
        addr.filter(|a| !a.is_empty())
    }

    fn heard_kafka(&self, node: u64, kafka_addr: &str) {
        lock(&self.heard_kafka).insert(node, kafka_addr.to_string());
    }
}

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Vec<u8>> {
    read_frame_max(r, usize::MAX).await
}

/// [`read_frame`], refusing a frame longer than `max` before it is allocated.
async fn read_frame_max(r: &mut (impl AsyncReadExt + Unpin), max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; LEN_FIELD];
    r.read_exact(&mut len).await?;
    let n = check_peer_frame_len(u32::from_be_bytes(len))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a handshake frame of {n} bytes, more than {max}"),
        ));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

fn encode(frame: &PeerFrame<'_>) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_peer_frame(&mut out, frame)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(out)
}

fn hello_frame(ident: &Identity, nonce: &[u8; NONCE_LEN], proof: &[u8]) -> io::Result<Vec<u8>> {
    let (cluster_id, node_id, client_addr, kafka_addr) = ident.hello();
    encode(&PeerFrame::Hello {
        version: PEER_VERSION,
        cluster_id: &cluster_id,
        node_id,
        client_addr: &client_addr,
        kafka_addr: &kafka_addr,
        nodes: ident.members.clone(),
        nonce: *nonce,
        proof,
        flags: ident.hello_flags(),
    })
}

/// What a peer's hello said, its version and `--peers` ids checked.
struct TheirHello {
    node_id: u64,
    cluster_id: String,
    client_addr: String,
    kafka_addr: String,
    nonce: [u8; NONCE_LEN],
    proof: Vec<u8>,
    flags: u8,
}

/// Reads one frame of the handshake: at most [`HANDSHAKE_BYTES_MAX`], within
/// [`HELLO_TIMEOUT`].
async fn read_handshake_frame(stream: &mut PeerConn, what: &str) -> Result<Vec<u8>, String> {
    tokio::time::timeout(
        HELLO_TIMEOUT,
        read_frame_max(stream, HANDSHAKE_BYTES_MAX as usize),
    )
    .await
    .map_err(|_| format!("no {what} in time"))?
    .map_err(|e| {
        if is_tls_failure(&e) {
            // A TLS 1.3 peer refuses a certificate after the handshake, at the first
            // read.
            format!(
                "reading the {what}: {} ({TLS_FLAGS}: do both nodes hold certificates \
                 the same CA signed?)",
                tls_text(&e)
            )
        } else {
            format!("reading the {what}: {e}")
        }
    })
}

/// Writes one frame of the handshake and flushes it.
async fn write_handshake_frame(stream: &mut PeerConn, frame: &[u8]) -> io::Result<()> {
    stream.write_all(frame).await?;
    stream.flush().await
}

/// Reads the other side's hello (a refusal instead: `Err` with its reason).
async fn read_hello(stream: &mut PeerConn, ident: &Identity) -> Result<TheirHello, String> {
    let frame = read_handshake_frame(stream, "hello").await?;
    match decode_peer_frame(&frame).map_err(|e| e.to_string())? {
        PeerFrame::Hello {
            version,
            cluster_id,
            node_id,
            client_addr,
            kafka_addr,
            nodes,
            nonce,
            proof,
            flags,
        } => {
            if version != PEER_VERSION {
                return Err(format!(
                    "peer protocol version {version}, not {PEER_VERSION}"
                ));
            }
            // Before the cluster id: a node of another membership adopts nothing.
            if let Some(why) = members_differ(node_id, &nodes, ident.node_id, &ident.members) {
                return Err(why);
            }
            Ok(TheirHello {
                node_id,
                cluster_id: cluster_id.to_string(),
                client_addr: client_addr.to_string(),
                kafka_addr: kafka_addr.to_string(),
                nonce,
                proof: proof.to_vec(),
                flags,
            })
        }
        PeerFrame::Refuse { reason } => Err(format!("refused: {}", peer_text(reason))),
        other => Err(format!("expected a hello, got {}", other.summary())),
    }
}

/// This node's proof as `side` of the connection `h` (empty without a secret).
fn own_proof(ident: &Identity, side: Side, h: &Handshake<'_>) -> Vec<u8> {
    ident
        .secret
        .as_ref()
        .map(|s| s.prove(side, h).to_vec())
        .unwrap_or_default()
}

/// Checks node `peer`'s proof as `side` of the connection `h`: `Err` names why the
/// connection is refused, in words that read the same on both nodes.
fn check_proof(
    ident: &Identity,
    peer: u64,
    side: Side,
    h: &Handshake<'_>,
    proof: &[u8],
) -> Result<(), String> {
    let me = ident.node_id;
    match (&ident.secret, proof.is_empty()) {
        (None, true) => Ok(()),
        (Some(s), false) if s.verify(side, h, proof) => Ok(()),
        (Some(_), false) => Err(format!(
            "nodes {me} and {peer} hold different cluster secrets ({SECRET_MISMATCH})"
        )),
        (Some(_), true) => Err(format!(
            "node {peer} has no cluster secret and node {me} has one: give every node the \
             same {SECRET_MISMATCH}"
        )),
        (None, false) => Err(format!(
            "node {me} has no cluster secret and node {peer} has one: give every node the \
             same {SECRET_MISMATCH}"
        )),
    }
}

/// Whether a refusal is one an operator must fix (another cluster, another
/// `--peers` list): said on stderr, not only logged.
fn for_the_operator(why: &str) -> bool {
    why.contains(CLUSTER_MISMATCH)
        || why.contains(PEERS_MISMATCH)
        || why.contains(SECRET_MISMATCH)
        || why.contains(TLS_FLAGS)
}

/// Says once on stderr why a peer cannot be joined (a different cluster or
/// `--peers` list), and logs every other failure.
fn report_refusal(peer: u64, why: &str, said: &mut Option<String>) {
    if said.as_deref() == Some(why) {
        return;
    }
    if for_the_operator(why) {
        match why.strip_prefix("refused: ") {
            Some(why) => {
                eprintln!("seglog: node {peer} refused the raft connection: {why}; not joining it");
            }
            None => {
                eprintln!(
                    "seglog: refused the raft connection to node {peer}: {why}; not joining it"
                );
            }
        }
    }
    tracing::warn!(peer, "raft connection refused: {why}");
    *said = Some(why.to_string());
}

async fn dial_loop(ident: Arc<Identity>, peer: Arc<Peer>, mut rx: mpsc::Receiver<Outgoing>) {
    let mut backoff = BACKOFF_MIN;
    let mut said = None;
    loop {
        match dial(&ident, &peer).await {
            Ok(stream) => {
                backoff = BACKOFF_MIN;
                said = None;
                peer.connected.store(true, Ordering::Relaxed);
                tracing::info!(peer = peer.id, addr = %peer.raft_addr, "raft connection up");
                let closed = run_dialled(stream, &peer, &mut rx).await;
                peer.connected.store(false, Ordering::Relaxed);
                tracing::info!(peer = peer.id, "raft connection down: {closed}");
                if closed == "stopped" {
                    return;
                }
            }
            Err(why) => report_refusal(peer.id, &why, &mut said),
        }
        // Calls meanwhile fail at once; the peer is redialled after the backoff.
        let wake = tokio::time::sleep(backoff);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                () = &mut wake => break,
                m = rx.recv() => match m {
                    Some(o) => { let _ = o.reply.send(Err(CallError::Unreachable(peer.id))); }
                    None => return,
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn dial(ident: &Identity, peer: &Peer) -> Result<PeerConn, String> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&peer.raft_addr))
        .await
        .map_err(|_| format!("connecting to {} timed out", peer.raft_addr))?
        .map_err(|e| format!("connecting to {}: {e}", peer.raft_addr))?;
    let _ = tcp.set_nodelay(true);
    let mut stream = match &ident.tls {
        Some(tls) => tls.dial(&peer.raft_addr, tcp, HELLO_TIMEOUT).await?,
        None => PeerConn::Plain(tcp),
    };
    let my_nonce = super::secret::nonce().map_err(|e| e.to_string())?;
    let hello = hello_frame(ident, &my_nonce, b"").map_err(|e| e.to_string())?;
    write_handshake_frame(&mut stream, &hello)
        .await
        .map_err(|e| format!("sending the hello: {e}"))?;
    let theirs = read_hello(&mut stream, ident).await?;
    let checked = match &ident.tls {
        Some(tls) => tls.check_peer_node(&stream, peer.id),
        None => Ok(()),
    }
    .and_then(|()| check_accepted(ident, peer, &theirs, &my_nonce));
    let proof = match checked {
        Ok(proof) => proof,
        Err(why) => {
            refuse(&mut stream, &why).await;
            return Err(why);
        }
    };
    let frame = encode(&PeerFrame::Proof { proof: &proof }).map_err(|e| e.to_string())?;
    write_handshake_frame(&mut stream, &frame)
        .await
        .map_err(|e| format!("sending the proof: {e}"))?;
    let frame = read_handshake_frame(&mut stream, "welcome").await?;
    match decode_peer_frame(&frame).map_err(|e| e.to_string())? {
        PeerFrame::Welcome => {}
        PeerFrame::Refuse { reason } => return Err(format!("refused: {}", peer_text(reason))),
        other => return Err(format!("expected a welcome, got {}", other.summary())),
    }
    *lock(&peer.client_addr) = Some(theirs.client_addr);
    *lock(&peer.kafka_addr) = Some(theirs.kafka_addr);
    Ok(stream)
}

/// The dialer's checks of the acceptor's hello: its id, its proof, then its cluster
/// id (adopted when this node has none). Returns the dialer's own proof.
fn check_accepted(
    ident: &Identity,
    peer: &Peer,
    theirs: &TheirHello,
    my_nonce: &[u8; NONCE_LEN],
) -> Result<Vec<u8>, String> {
    if theirs.node_id != peer.id {
        return Err(format!(
            "{} is node {}, not node {} as --peers says",
            peer.raft_addr, theirs.node_id, peer.id
        ));
    }
    let h = Handshake {
        dialer: ident.node_id,
        acceptor: peer.id,
        dialer_nonce: my_nonce,
        acceptor_nonce: &theirs.nonce,
    };
    check_proof(ident, peer.id, Side::Acceptor, &h, &theirs.proof)?;
    ident.agree(&theirs.cluster_id)?;
    ident.heard_flags(peer.id, theirs.flags);
    Ok(own_proof(ident, Side::Dialer, &h))
}

/// Tells the other side why the connection is refused (best effort).
async fn refuse(stream: &mut PeerConn, why: &str) {
    if let Ok(f) = encode(&PeerFrame::Refuse { reason: why }) {
        let _ = write_handshake_frame(stream, &f).await;
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Vec<u8>, CallError>>>>>;

/// Serves one dialled connection until it fails; returns why it ended.
async fn run_dialled(
    stream: PeerConn,
    peer: &Arc<Peer>,
    rx: &mut mpsc::Receiver<Outgoing>,
) -> String {
    static CALL_IDS: AtomicU64 = AtomicU64::new(1);
    let (mut r, mut w) = stream.into_split();
    let pending: Pending = Arc::default();
    let (dead_tx, mut dead_rx) = oneshot::channel::<String>();
    let reader_pending = Arc::clone(&pending);
    let node = peer.id;
    let heard = Arc::clone(peer);
    let reader = tokio::spawn(async move {
        let why = loop {
            let frame = match read_frame(&mut r).await {
                Ok(f) => f,
                Err(e) => break format!("reading: {e}"),
            };
            heard.last_heard.store(clock_ms(), Ordering::Relaxed);
            match decode_peer_frame(&frame) {
                Ok(PeerFrame::Reply { call_id, result }) => {
                    let waiter = {
                        let mut p = lock(&reader_pending);
                        let w = p.remove(&call_id);
                        if p.is_empty() {
                            heard.waiting_since.store(0, Ordering::Relaxed);
                        }
                        w
                    };
                    if let Some(w) = waiter {
                        let r = result.map(<[u8]>::to_vec).map_err(|m| CallError::Failed {
                            node,
                            detail: peer_text(m),
                        });
                        let _ = w.send(r);
                    }
                }
                Ok(other) => break format!("unexpected frame: {}", other.summary()),
                Err(e) => break format!("bad frame: {e}"),
            }
        };
        let _ = dead_tx.send(why);
    });
    // A call goes out at least every [`PROBE_EVERY`] while the connection is up (an
    // empty `Status`, when nothing else was sent), so [`Peer::answering`] sees a
    // peer that stopped answering even when no group sends it anything.
    let mut probe = tokio::time::interval(PROBE_EVERY);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One probe at a time waits for its answer; a probe also goes out while another
    // call waits, so a call its peer never answers does not make the peer look silent.
    let mut sent_since_probe = false;
    let mut last_probe = None;
    let why = loop {
        tokio::select! {
            why = &mut dead_rx => break why.unwrap_or_else(|_| "reader ended".into()),
            _ = probe.tick() => {
                let probe_waits = last_probe.is_some_and(|id| lock(&pending).contains_key(&id));
                if std::mem::take(&mut sent_since_probe) || probe_waits {
                    continue;
                }
                let call_id = CALL_IDS.fetch_add(1, Ordering::Relaxed);
                last_probe = Some(call_id);
                let Ok(frame) = encode(&PeerFrame::Call {
                    call_id,
                    topic: "",
                    partition: 0,
                    rpc: Rpc::Status,
                    payload: b"[]",
                }) else {
                    continue;
                };
                // Nobody waits for the answer: it only shows the peer answers.
                let (reply, _) = oneshot::channel();
                {
                    let mut p = lock(&pending);
                    if p.is_empty() {
                        peer.waiting_since.store(clock_ms(), Ordering::Relaxed);
                    }
                    p.insert(call_id, reply);
                }
                if let Err(e) = write_flushed(&mut w, &frame).await {
                    break format!("writing: {e}");
                }
            }
            m = rx.recv() => {
                let Some(o) = m else { break "stopped".into() };
                sent_since_probe = true;
                let call_id = CALL_IDS.fetch_add(1, Ordering::Relaxed);
                let frame = encode(&PeerFrame::Call {
                    call_id,
                    topic: &o.topic,
                    partition: o.partition,
                    rpc: o.rpc,
                    payload: &o.payload,
                });
                let frame = match frame {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = o.reply.send(Err(CallError::Failed { node, detail: e.to_string() }));
                        continue;
                    }
                };
                {
                    let mut p = lock(&pending);
                    if p.is_empty() {
                        peer.waiting_since.store(clock_ms(), Ordering::Relaxed);
                    }
                    p.insert(call_id, o.reply);
                }
                if let Err(e) = write_flushed(&mut w, &frame).await {
                    break format!("writing: {e}");
                }
            }
        }
    };
    reader.abort();
    peer.waiting_since.store(0, Ordering::Relaxed);
    for (_, waiter) in lock(&pending).drain() {
        let _ = waiter.send(Err(CallError::Unreachable(node)));
    }
    why
}

/// What answers the calls peers send: the manager of this node's groups.
pub trait CallHandler: Send + Sync + 'static {
    /// Answers one call from node `from`.
    fn handle(
        self: Arc<Self>,
        from: u64,
        topic: String,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
    ) -> impl std::future::Future<Output = Result<Vec<u8>, String>> + Send;

    /// Starts a stream of AppendEntries into this node's Raft group
    /// `topic`/`partition` (`Raft::stream_append`): the answers come in the order of
    /// `input`, the stream ending after a failed one. `None`: there is no such group
    /// here, and peers' [`Rpc::AppendStream`] calls for it are refused.
    fn append_stream(
        &self,
        _topic: &str,
        _partition: u32,
        _input: BoxStream<'static, AppendEntriesRequest<TypeConfig>>,
    ) -> Option<AppendAnswers> {
        None
    }
}

/// The answers of a Raft group to a stream of AppendEntries (an `Err`: the group
/// stopped, and says why).
pub type AppendAnswers = BoxStream<'static, Result<StreamAppendResult<TypeConfig>, String>>;

/// Accepts peers' connections on `listener` and serves their calls until `stop`.
pub async fn serve<H: CallHandler>(
    listener: tokio::net::TcpListener,
    peers: Arc<Peers>,
    handler: Arc<H>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, addr)) = accepted else {
            tokio::time::sleep(BACKOFF_MIN).await;
            continue;
        };
        let peers = Arc::clone(&peers);
        let handler = Arc::clone(&handler);
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Err(why) = serve_peer(stream, &peers, handler, stop).await {
                tracing::info!(%addr, "raft peer connection ended: {why}");
            }
        });
    }
}

async fn serve_peer<H: CallHandler>(
    tcp: TcpStream,
    peers: &Arc<Peers>,
    handler: Arc<H>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let _ = tcp.set_nodelay(true);
    let mut stream = accept_tls(tcp, peers).await?;
    let from = match accept_handshake(&mut stream, peers).await {
        Ok(from) => from,
        Err((why, refused_by_us)) => {
            if refused_by_us {
                tell_refused(peers, &why);
                refuse(&mut stream, &why).await;
            }
            return Err(why);
        }
    };
    let (mut r, mut w) = stream.into_split();
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(OUTGOING_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if write_flushed(&mut w, &frame).await.is_err() {
                return;
            }
        }
    });
    let mut streams: HashMap<(String, u32), Lane> = HashMap::new();
    let result = loop {
        let frame = tokio::select! {
            _ = stop.changed() => break Ok(()),
            f = read_frame(&mut r) => match f {
                Ok(f) => f,
                Err(e) => break Err(format!("reading: {e}")),
            },
        };
        let (call_id, topic, partition, rpc, payload) = match decode_peer_frame(&frame) {
            Ok(PeerFrame::Call {
                call_id,
                topic,
                partition,
                rpc,
                payload,
            }) => (call_id, topic.to_string(), partition, rpc, payload.to_vec()),
            Ok(other) => break Err(format!("unexpected frame: {}", other.summary())),
            Err(e) => break Err(format!("bad frame: {e}")),
        };
        if rpc == Rpc::AppendStream {
            // In order, into the group's stream (one per group on this connection).
            // A lane ends when its group is not (or no longer) here.
            let key = (topic, partition);
            let lane = match streams.get(&key).filter(|l| !l.is_closed()) {
                Some(lane) => lane.clone(),
                None => {
                    streams.retain(|_, l| !l.is_closed());
                    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                    tokio::spawn(append_lane(
                        Arc::clone(&handler),
                        key.clone(),
                        rx,
                        out_tx.clone(),
                    ));
                    streams.insert(key.clone(), tx.clone());
                    tx
                }
            };
            if lane.try_send((call_id, payload)).is_err() {
                let why = format!(
                    "more than {STREAM_QUEUE} appends of {}/{} wait on this connection",
                    key.0, key.1
                );
                answer(&out_tx, call_id, Err(why)).await;
            }
            continue;
        }
        let handler = Arc::clone(&handler);
        let out = out_tx.clone();
        tokio::spawn(async move {
            let result = handler.handle(from, topic, partition, rpc, payload).await;
            answer(&out, call_id, result).await;
        });
    };
    drop(out_tx);
    writer.abort();
    result
}

/// Writes one frame on a connection's writing half and flushes it (TLS holds a
/// written record until flushed).
async fn write_flushed(w: &mut super::peer_tls::WriteHalf, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame).await?;
    w.flush().await
}

/// Says on stderr, once per reason, why this node refused a Raft connection the
/// operator must fix.
fn tell_refused(peers: &Peers, why: &str) {
    if for_the_operator(why) && lock(&peers.told).insert(why.to_string()) {
        eprintln!("seglog: refused a raft connection: {why}");
    }
}

/// The TLS side of an accepted connection: with `--raft-tls-*`, the TLS handshake
/// (a plaintext dialer is refused in plaintext, naming the flags); without, a
/// dialer whose first byte starts a TLS handshake is refused the same way.
async fn accept_tls(tcp: TcpStream, peers: &Peers) -> Result<PeerConn, String> {
    let addr = tcp
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.ip().to_string());
    let Some(tls) = &peers.ident.tls else {
        let mut first = [0u8; 1];
        // The hello's time limit covers its first byte: a dialer that sends nothing
        // holds the connection no longer than before.
        match tokio::time::timeout(HELLO_TIMEOUT, tcp.peek(&mut first)).await {
            Ok(Ok(1..)) => {}
            Ok(Ok(_)) => return Err("closed before its hello".into()),
            Ok(Err(e)) => return Err(format!("reading the hello: {e}")),
            Err(_) => return Err("no hello in time".into()),
        }
        let starts_tls = first[0] == crate::engine::net::tls::TLS_HANDSHAKE_BYTE;
        let mut stream = PeerConn::Plain(tcp);
        if starts_tls {
            let why = format!(
                "{addr} dials with TLS and node {} has no {TLS_FLAGS}: give every node \
                 the same TLS flags",
                peers.ident.node_id
            );
            tell_refused(peers, &why);
            // Not TLS: the dialer's handshake fails on it, and says so.
            refuse(&mut stream, &why).await;
            return Err(why);
        }
        return Ok(stream);
    };
    match tls.accept(tcp, HELLO_TIMEOUT).await {
        crate::engine::net::tls::Accepted::Stream(crate::engine::net::tls::Stream::Tls(s)) => {
            Ok(PeerConn::Accepted(s))
        }
        crate::engine::net::tls::Accepted::Stream(crate::engine::net::tls::Stream::Plain(tcp))
        | crate::engine::net::tls::Accepted::Plaintext(tcp) => {
            let why = format!(
                "{addr} dials without TLS and node {} requires it ({TLS_FLAGS}): give every \
                 node the same TLS flags",
                peers.ident.node_id
            );
            tell_refused(peers, &why);
            refuse(&mut PeerConn::Plain(tcp), &why).await;
            Err(why)
        }
        crate::engine::net::tls::Accepted::Failed(e) => {
            let why = if is_tls_failure(&e) {
                let why = format!(
                    "the TLS handshake with {addr} failed: {} ({TLS_FLAGS}: its certificate \
                     must be signed by this node's --raft-tls-ca)",
                    tls_text(&e)
                );
                tell_refused(peers, &why);
                why
            } else {
                format!("the TLS handshake with {addr} failed: {e}")
            };
            Err(why)
        }
    }
}

/// The acceptor's side of the handshake: reads the dialer's hello, checks its
/// membership and cluster id (without adopting it), answers with its own hello and
/// proof, then checks the dialer's proof, and only then adopts the dialer's cluster
/// id, records its addresses and welcomes it. Returns the dialer's node id, or why
/// the connection ends and whether this node refused it (else the dialer did, or
/// the connection failed).
async fn accept_handshake(stream: &mut PeerConn, peers: &Peers) -> Result<u64, (String, bool)> {
    let ident = &peers.ident;
    let ours = |why: String| (why, true);
    let theirs = read_hello(stream, ident).await.map_err(ours)?;
    let from = theirs.node_id;
    let Some(peer) = peers.peers.get(&from) else {
        return Err(ours(format!("node {from} is not in this node's --peers")));
    };
    super::peer_tls::check_dialer_name(stream, from, &peer.raft_addr).map_err(ours)?;
    if let Some(tls) = &ident.tls {
        tls.check_peer_node(stream, from).map_err(ours)?;
    }
    ident.precheck(&theirs.cluster_id).map_err(ours)?;
    let my_nonce = super::secret::nonce().map_err(|e| ours(e.to_string()))?;
    let h = Handshake {
        dialer: from,
        acceptor: ident.node_id,
        dialer_nonce: &theirs.nonce,
        acceptor_nonce: &my_nonce,
    };
    let proof = own_proof(ident, Side::Acceptor, &h);
    let hello = hello_frame(ident, &my_nonce, &proof).map_err(|e| ours(e.to_string()))?;
    write_handshake_frame(stream, &hello)
        .await
        .map_err(|e| (format!("sending the hello: {e}"), false))?;
    let frame = read_handshake_frame(stream, "proof")
        .await
        .map_err(|e| (e, false))?;
    match decode_peer_frame(&frame).map_err(|e| ours(e.to_string()))? {
        PeerFrame::Proof { proof } => {
            check_proof(ident, from, Side::Dialer, &h, proof).map_err(ours)?;
        }
        PeerFrame::Refuse { reason } => {
            return Err((format!("refused: {}", peer_text(reason)), false))
        }
        other => return Err(ours(format!("expected a proof, got {}", other.summary()))),
    }
    ident.agree(&theirs.cluster_id).map_err(ours)?;
    ident.heard_flags(from, theirs.flags);
    peers.heard(from, &theirs.client_addr);
    peers.heard_kafka(from, &theirs.kafka_addr);
    let welcome = encode(&PeerFrame::Welcome).map_err(|e| ours(e.to_string()))?;
    write_handshake_frame(stream, &welcome)
        .await
        .map_err(|e| (format!("sending the welcome: {e}"), false))?;
    Ok(from)
}

/// Where a connection queues one group's [`Rpc::AppendStream`] calls (call id,
/// payload) for its [`append_lane`].
type Lane = mpsc::Sender<(u64, Vec<u8>)>;

/// Sends the reply of call `call_id` (a reply that cannot be encoded becomes a
/// failure saying why).
async fn answer(out: &mpsc::Sender<Vec<u8>>, call_id: u64, result: Result<Vec<u8>, String>) {
    let frame = encode(&PeerFrame::Reply {
        call_id,
        result: result.as_deref().map_err(String::as_str),
    });
    let frame = match frame {
        Ok(f) => f,
        Err(e) => match encode(&PeerFrame::Reply {
            call_id,
            result: Err(&e.to_string()),
        }) {
            Ok(f) => f,
            Err(_) => return,
        },
    };
    let _ = out.send(frame).await;
}

/// Feeds one group's [`Rpc::AppendStream`] calls from one connection into its Raft
/// group ([`CallHandler::append_stream`]), in the order they came, and answers each
/// once the group answers it (in order: its entries are flushed to this node's Raft
/// log). When the stream fails (a conflict, a higher vote) the calls fed after the
/// failed one are refused and the next call starts a new stream; when the group is
/// not here (never was, deleted, stopped) the lane refuses what it holds and ends.
async fn append_lane<H: CallHandler>(
    handler: Arc<H>,
    (topic, partition): (String, u32),
    mut calls: mpsc::Receiver<(u64, Vec<u8>)>,
    out: mpsc::Sender<Vec<u8>>,
) {
    use futures_util::StreamExt;
    const ENDED: &str = "the group's append stream ended";
    loop {
        let Some(first) = calls.recv().await else {
            return;
        };
        // Unbounded: the calls it carries are bounded by `calls`; a bounded one could
        // stall here while the group waits for its answers to be taken.
        let (feed, fed) = mpsc::unbounded_channel();
        let input =
            futures_util::stream::unfold(
                fed,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let Some(mut results) = handler.append_stream(&topic, partition, Box::pin(input)) else {
            let why = format!("no Raft group {topic}/{partition} on this node");
            answer(&out, first.0, Err(why.clone())).await;
            calls.close();
            while let Ok((call_id, _)) = calls.try_recv() {
                answer(&out, call_id, Err(why.clone())).await;
            }
            return;
        };
        let mut waiting = std::collections::VecDeque::new();
        let mut next = Some(first);
        loop {
            if let Some((call_id, payload)) = next.take() {
                match decode_append_request(&payload).map(|req| feed.send(req)) {
                    Ok(Ok(())) => waiting.push_back(call_id),
                    Ok(Err(_)) => answer(&out, call_id, Err(ENDED.into())).await,
                    Err(e) => answer(&out, call_id, Err(e.to_string())).await,
                }
            }
            tokio::select! {
                m = calls.recv() => match m {
                    Some(c) => next = Some(c),
                    None => return,
                },
                r = results.next(), if !waiting.is_empty() => {
                    let Some(call_id) = waiting.pop_front() else { continue };
                    let (reply, go_on) = match r {
                        Some(Ok(Ok(matching))) => {
                            let resp = AppendEntriesResponse::PartialSuccess(matching);
                            (Ok(encode_append_reply(&resp)), true)
                        }
                        Some(Ok(Err(StreamAppendError::Conflict(_)))) => {
                            (Ok(encode_append_reply(&AppendEntriesResponse::Conflict)), false)
                        }
                        Some(Ok(Err(StreamAppendError::HigherVote(v)))) => {
                            let resp = AppendEntriesResponse::HigherVote(v);
                            (Ok(encode_append_reply(&resp)), false)
                        }
                        Some(Err(stopped)) => (Err(stopped), false),
                        None => (Err(ENDED.into()), false),
                    };
                    answer(&out, call_id, reply).await;
                    if !go_on {
                        for call_id in waiting.drain(..) {
                            answer(&out, call_id, Err(ENDED.into())).await;
                        }
                        break;
                    }
                }
            }
        }
    }
}

/// openraft's network for one group: a client per target node, over the shared
/// peer connections.
#[derive(Clone, Debug)]
pub struct GroupNetwork {
    pub peers: Arc<Peers>,
    pub topic: String,
    pub partition: u32,
}

/// One group's view of one peer.
#[derive(Debug)]
pub struct GroupClient {
    peer: Option<Arc<Peer>>,
    target: u64,
    topic: String,
    partition: u32,
    /// Replication's client pipelines its AppendEntries ([`Rpc::AppendStream`]); the
    /// heartbeats' sends one at a time on calls of their own, so that a heartbeat never
    /// waits behind the entries in flight.
    pipelined: bool,
}

impl GroupNetwork {
    fn client(&self, target: u64, pipelined: bool) -> GroupClient {
        GroupClient {
            peer: self.peers.peers.get(&target).cloned(),
            target,
            topic: self.topic.clone(),
            partition: self.partition,
            pipelined,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = GroupClient;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> GroupClient {
        self.client(target, true)
    }

    async fn new_heartbeat_client(&mut self, target: u64, _node: &BasicNode) -> GroupClient {
        self.client(target, false)
    }
}

fn rpc_error(e: CallError) -> RPCError<TypeConfig> {
    match e {
        CallError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&e)),
        CallError::Failed { .. } => RPCError::Network(NetworkError::new(&e)),
    }
}

impl GroupClient {
    async fn call<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let Some(peer) = &self.peer else {
            return Err(rpc_error(CallError::Unreachable(self.target)));
        };
        let payload =
            serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = peer
            .call(&self.topic, self.partition, rpc, payload, option.hard_ttl())
            .await
            .map_err(rpc_error)?;
        serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetworkV2<TypeConfig> for GroupClient {
    type SnapshotData = super::snapshot::PartitionSnapshot;

    /// Replication's stream of AppendEntries, pipelined: each request is queued on the
    /// peer connection as soon as openraft makes it (up to [`PIPELINE_DEPTH`] awaiting
    /// their answers), and the answers are yielded in the requests' order. The
    /// connection keeps the calls in order and the follower hands one group's calls to
    /// its Raft group in that order ([`serve_peer`]), so the follower's log takes them
    /// as one stream and one fsync covers many.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, StreamAnswer>, RPCError<TypeConfig>>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        if !self.pipelined {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        let peer = self.peer.clone();
        let target = self.target;
        let topic = self.topic.clone();
        let partition = self.partition;
        Box::pin(async move {
            let Some(peer) = peer else {
                return Err(rpc_error(CallError::Unreachable(target)));
            };
            let (sent_tx, sent_rx) = mpsc::channel(PIPELINE_DEPTH);
            tokio::spawn(feed_stream(
                Arc::clone(&peer),
                topic,
                partition,
                input,
                sent_tx,
            ));
            let answers = answer_stream(peer, sent_rx, option.hard_ttl());
            let answers: BoxStream<'s, StreamAnswer> = Box::pin(answers);
            Ok(answers)
        })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let Some(peer) = &self.peer else {
            return Err(rpc_error(CallError::Unreachable(self.target)));
        };
        let payload =
            encode_append_request(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        drop(rpc);
        let rpc = Rpc::AppendEntriesBinary;
        let reply = peer
            .call(&self.topic, self.partition, rpc, payload, option.hard_ttl())
            .await
            .map_err(rpc_error)?;
        decode_append_reply(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Rpc::PreVote, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: super::snapshot::Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let cancel = Box::pin(cancel);
        let sent = Box::pin(self.send_snapshot(vote, snapshot, &option));
        match futures_util::future::select(cancel, sent).await {
            futures_util::future::Either::Left((closed, _)) => Err(StreamingError::Closed(closed)),
            futures_util::future::Either::Right((r, _)) => r,
        }
    }
}

/// How many AppendEntries of one replication stream await their answers at most.
const PIPELINE_DEPTH: usize = 64;
/// How many [`Rpc::AppendStream`] calls of one group a connection holds before its
/// Raft group takes them; past it a call is refused (the leader starts over).
const STREAM_QUEUE: usize = 256;

/// One item of a replication stream's answers.
type StreamAnswer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// A request of a pipelined stream on its way: the log ids it spans (`prev`, `last`)
/// and its queued call (or why it could not be queued).
struct InFlight {
    prev: Option<LogId>,
    last: Option<LogId>,
    call: Result<Reply, CallError>,
}

/// Queues each request of `input` on the peer connection, in order, until the answer
/// side goes away or a request cannot be queued.
async fn feed_stream<S>(
    peer: Arc<Peer>,
    topic: String,
    partition: u32,
    mut input: S,
    sent: mpsc::Sender<InFlight>,
) where
    S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    use futures_util::StreamExt;
    loop {
        let req = tokio::select! {
            () = sent.closed() => return,
            r = input.next() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let prev = req.prev_log_id;
        let last = req.entries.last().map(|e| e.log_id).or(prev);
        let call = encode_append_request(&req)
            .map_err(|e| CallError::Failed {
                node: peer.id,
                detail: e.to_string(),
            })
            .and_then(|payload| peer.send(&topic, partition, Rpc::AppendStream, payload));
        drop(req);
        let failed = call.is_err();
        if sent.send(InFlight { prev, last, call }).await.is_err() || failed {
            return;
        }
    }
}

/// The answers of the requests [`feed_stream`] queued, in their order; it ends after
/// an error, a refusal, or an answer that took only part of its request (as
/// openraft's sequential stream does).
fn answer_stream(
    peer: Arc<Peer>,
    sent: mpsc::Receiver<InFlight>,
    ttl: Duration,
) -> impl futures_util::Stream<Item = StreamAnswer> + Send {
    futures_util::stream::unfold(Some(sent), move |state| {
        let peer = Arc::clone(&peer);
        async move {
            let mut sent = state?;
            let InFlight { prev, last, call } = sent.recv().await?;
            let reply = match call {
                Ok(rx) => peer.wait(rx, ttl).await,
                Err(e) => Err(e),
            };
            let resp = reply.map_err(rpc_error).and_then(|b| {
                decode_append_reply(&b).map_err(|e| RPCError::Network(NetworkError::new(&e)))
            });
            let resp = match resp {
                Ok(AppendEntriesResponse::Conflict) if prev.is_none() => {
                    let e = CallError::Failed {
                        node: peer.id,
                        detail: "a conflict answered to entries from the log's start".into(),
                    };
                    return Some((Err(rpc_error(e)), None));
                }
                Ok(r) => r,
                Err(e) => return Some((Err(e), None)),
            };
            let whole = match &resp {
                AppendEntriesResponse::PartialSuccess(m) => *m == last,
                _ => true,
            };
            let result = resp.into_stream_result(prev, last);
            let go_on = result.is_ok() && whole;
            Some((Ok(result), go_on.then_some(sent)))
        }
    })
}

fn streaming_error(e: RPCError<TypeConfig>) -> StreamingError<TypeConfig> {
    match e {
        RPCError::Unreachable(u) => StreamingError::Unreachable(u),
        RPCError::Timeout(t) => StreamingError::Timeout(t),
        RPCError::Network(n) => StreamingError::Network(n),
        other => StreamingError::Network(NetworkError::new(&other)),
    }
}

impl GroupClient {
    /// Sends a snapshot ([`super::snapshot`]): asks where the follower's data
    /// partition ends, streams the records from there (one chunk call at a time, so
    /// they arrive in order) up to the snapshot's next offset, then asks it to install.
    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: super::snapshot::Snapshot,
        option: &RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        use super::snapshot::{
            read_chunk, BeginRequest, BeginResponse, ChunkRequest, InstallRequest, SnapshotSource,
        };
        let network = |e: &dyn std::fmt::Display| {
            StreamingError::Network(NetworkError::from_string(e.to_string()))
        };
        let super::snapshot::PartitionSnapshot { applied, source } = snapshot.snapshot;
        let SnapshotSource::Local {
            broker,
            topic,
            partition,
        } = source
        else {
            return Err(network(
                &"only a snapshot of this node's own partition is sent",
            ));
        };
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).map_err(|e| network(&e))?;
        let transfer = u64::from_be_bytes(raw);
        let begin: BeginResponse = self
            .call(
                Rpc::SnapshotBegin,
                &BeginRequest {
                    transfer,
                    last_log_id: applied.last_applied,
                },
                option,
            )
            .await
            .map_err(streaming_error)?;
        let next = applied.next_offset;
        let (start, _) = broker.offsets(&topic, partition).map_err(|e| network(&e))?;
        let first = begin.data_end.max(start).min(next);
        let mut at = first;
        while at < next {
            let (b, t) = (Arc::clone(&broker), topic.clone());
            let records =
                tokio::task::spawn_blocking(move || read_chunk(&b, &t, partition, at, next))
                    .await
                    .map_err(|e| network(&e))?
                    .map_err(|e| network(&e))?;
            let Some(last) = records.last().map(|(o, _)| *o) else {
                break;
            };
            at = last + 1;
            let _: serde_json::Value = self
                .call(
                    Rpc::SnapshotChunk,
                    &ChunkRequest { transfer, records },
                    option,
                )
                .await
                .map_err(streaming_error)?;
        }
        self.call(
            Rpc::SnapshotInstall,
            &InstallRequest {
                transfer,
                vote,
                applied,
                first_offset: first,
            },
            option,
        )
        .await
        .map_err(streaming_error)
    }
}

/// Why a binary AppendEntries could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum AppendCodecError {
    #[error("AppendEntries: {0}")]
    Wire(#[from] crate::format::wire::ProtocolError),
    #[error("AppendEntries entry {index}: {detail}")]
    Entry { index: u64, detail: String },
}

fn wire_log_id(id: &LogId) -> append::WireLogId {
    append::WireLogId {
        term: id.leader_id.term,
        leader: id.leader_id.node_id,
        index: id.index,
    }
}

fn log_id_of(id: &append::WireLogId) -> LogId {
    LogId::new(
        StoredLeaderId {
            term: id.term,
            node_id: id.leader,
        },
        id.index,
    )
}

fn wire_vote(v: &Vote) -> append::WireVote {
    append::WireVote {
        term: v.leader_id.term,
        leader: v.leader_id.node_id,
        committed: v.committed,
    }
}

fn vote_of(v: &append::WireVote) -> Vote {
    Vote {
        leader_id: StoredLeaderId {
            term: v.term,
            node_id: v.leader,
        },
        committed: v.committed,
    }
}

/// The binary payload of an AppendEntries call ([`append`]): each entry's value is
/// encoded in place with the Raft log's own entry encoding.
pub fn encode_append_request(
    rpc: &AppendEntriesRequest<TypeConfig>,
) -> Result<Vec<u8>, AppendCodecError> {
    let values: usize = rpc
        .entries
        .iter()
        .map(|e| match &e.payload {
            openraft::EntryPayload::Normal(p) => p.encoded_len() + 32,
            _ => 64,
        })
        .sum();
    let mut out = Vec::with_capacity(128 + rpc.entries.len() * append::ENTRY_MIN_LEN + values);
    append::put_request_head(
        &mut out,
        &wire_vote(&rpc.vote),
        rpc.prev_log_id.as_ref().map(wire_log_id).as_ref(),
        rpc.leader_commit.as_ref().map(wire_log_id).as_ref(),
        rpc.entries.len(),
    )?;
    for e in &rpc.entries {
        let written = append::put_entry(&mut out, &wire_log_id(&e.log_id), |o| {
            e.encode_value(o).map(EntryKind::byte)
        })?;
        written.map_err(|err| AppendCodecError::Entry {
            index: e.log_id.index,
            detail: err.0,
        })?;
    }
    Ok(out)
}

/// Rebuilds an AppendEntries request from its binary payload.
pub fn decode_append_request(
    payload: &[u8],
) -> Result<AppendEntriesRequest<TypeConfig>, AppendCodecError> {
    let req = append::decode_request(payload)?;
    let mut entries = Vec::with_capacity(req.entries.len());
    for e in &req.entries {
        let index = e.log_id.index;
        let bad = |detail: String| AppendCodecError::Entry { index, detail };
        if e.value.len() > ENTRY_VALUE_BYTES_MAX as usize {
            return Err(bad(format!(
                "value of {} bytes, more than {ENTRY_VALUE_BYTES_MAX}",
                e.value.len()
            )));
        }
        let kind = EntryKind::from_byte(e.kind).ok_or_else(|| bad(format!("kind {}", e.kind)))?;
        let key = EntryKey {
            term: e.log_id.term,
            leader: e.log_id.leader,
            kind,
        };
        let entry = <Entry as StoredEntry>::decode(index, &key, e.value).map_err(|x| bad(x.0))?;
        entries.push(entry);
    }
    Ok(AppendEntriesRequest {
        vote: vote_of(&req.vote),
        prev_log_id: req.prev_log_id.as_ref().map(log_id_of),
        leader_commit: req.leader_commit.as_ref().map(log_id_of),
        entries,
    })
}

/// The binary reply to an AppendEntries call.
pub fn encode_append_reply(resp: &AppendEntriesResponse<TypeConfig>) -> Vec<u8> {
    let reply = match resp {
        AppendEntriesResponse::Success => append::AppendReply::Success,
        AppendEntriesResponse::PartialSuccess(id) => {
            append::AppendReply::PartialSuccess(id.as_ref().map(wire_log_id))
        }
        AppendEntriesResponse::Conflict => append::AppendReply::Conflict,
        AppendEntriesResponse::HigherVote(v) => append::AppendReply::HigherVote(wire_vote(v)),
    };
    let mut out = Vec::with_capacity(1 + append::VOTE_LEN + append::LOG_ID_LEN);
    append::encode_reply(&mut out, &reply);
    out
}

/// Rebuilds an AppendEntries reply from its binary payload.
pub fn decode_append_reply(
    payload: &[u8],
) -> Result<AppendEntriesResponse<TypeConfig>, AppendCodecError> {
    Ok(match append::decode_reply(payload)? {
        append::AppendReply::Success => AppendEntriesResponse::Success,
        append::AppendReply::PartialSuccess(id) => {
            AppendEntriesResponse::PartialSuccess(id.as_ref().map(log_id_of))
        }
        append::AppendReply::Conflict => AppendEntriesResponse::Conflict,
        append::AppendReply::HigherVote(v) => AppendEntriesResponse::HigherVote(vote_of(&v)),
    })
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::storage::io::RealStorage;

    /// A node's identity with no `--peers` list to check (a founder makes its id at
    /// once, as the only node of its cluster does).
    fn ident(dir: &std::path::Path, id: u64, founder: bool) -> Arc<Identity> {
        let ident = load_ident(dir, id, founder, &[]);
        ident.found_if_alone().unwrap();
        Arc::new(ident)
    }

    fn load_ident(dir: &std::path::Path, id: u64, founder: bool, members: &[u64]) -> Identity {
        let storage: StorageRef = Arc::new(RealStorage);
        let nodes: Vec<(u64, String)> = members.iter().map(|&m| (m, String::new())).collect();
        Identity::load(
            id,
            format!("client-{id}"),
            dir.to_path_buf(),
            storage,
            founder,
        )
        .unwrap()
        .with_members(&nodes)
    }

    #[test]
    fn a_founder_with_a_new_directory_adopts_its_peers_id_and_makes_one_only_with_peers_that_have_none(
    ) {
        // The founder of a cluster whose other nodes hold an id (its own directory
        // was replaced): it makes none at start and takes theirs.
        let a = tempfile::tempdir().unwrap();
        let replaced = load_ident(a.path(), 1, true, &[1, 2, 3]);
        replaced.found_if_alone().unwrap();
        assert_eq!(replaced.cluster_id(), None);
        assert!(replaced.new_directory());
        replaced.agree("0123456789abcdef").unwrap();
        assert_eq!(
            read_cluster_file(a.path()).unwrap(),
            Some(("0123456789abcdef".to_string(), Some(1)))
        );
        // A new cluster: the founder makes the id when a peer has none either; a
        // node that is not the founder never does.
        let b = tempfile::tempdir().unwrap();
        let founder = load_ident(b.path(), 1, true, &[1, 2]);
        founder.agree("").unwrap();
        let made = founder.cluster_id().unwrap();
        assert_eq!(made.len(), 32);
        assert!(founder.agree("0123456789abcdef").is_err());
        let c = tempfile::tempdir().unwrap();
        let other = load_ident(c.path(), 2, false, &[1, 2]);
        assert!(other.agree("").is_err());
        assert_eq!(other.cluster_id(), None);
        other.agree(&made).unwrap();
        // Started again: the directory is no longer new.
        assert!(!load_ident(c.path(), 2, false, &[1, 2]).new_directory());
    }

    #[test]
    fn cluster_ids_are_made_once_adopted_once_and_checked() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let founder = ident(a.path(), 1, true);
        let id = founder.cluster_id().unwrap();
        assert_eq!(id.len(), 32);
        // Read back, not made again.
        assert_eq!(ident(a.path(), 1, true).cluster_id(), Some(id.clone()));
        let joiner = ident(b.path(), 2, false);
        assert_eq!(joiner.cluster_id(), None);
        assert!(joiner.agree("").is_err());
        joiner.agree(&id).unwrap();
        assert_eq!(ident(b.path(), 2, false).cluster_id(), Some(id.clone()));
        let e = joiner.agree("0123abcd").unwrap_err();
        assert!(e.contains(CLUSTER_MISMATCH), "{e}");
        assert!(!valid_cluster_id("bad id"));
        std::fs::write(b.path().join(CLUSTER_FILE), b"{\"cluster_id\":\"a b\"}").unwrap();
        let storage: StorageRef = Arc::new(RealStorage);
        assert!(matches!(
            Identity::load(2, String::new(), b.path().to_path_buf(), storage, false),
            Err(ClusterIdError::Bad { .. })
        ));
    }

    #[test]
    fn cluster_files_name_the_node_they_belong_to() {
        let a = tempfile::tempdir().unwrap();
        let id = ident(a.path(), 3, true).cluster_id().unwrap();
        assert_eq!(read_cluster_file(a.path()).unwrap(), Some((id, Some(3))));
        // A file written before the node id was recorded.
        std::fs::write(a.path().join(CLUSTER_FILE), br#"{"cluster_id":"c0ffee"}"#).unwrap();
        assert_eq!(
            read_cluster_file(a.path()).unwrap(),
            Some(("c0ffee".to_string(), None))
        );
        let none = tempfile::tempdir().unwrap();
        assert_eq!(read_cluster_file(none.path()).unwrap(), None);
    }

    #[test]
    fn different_peers_lists_are_named() {
        assert_eq!(members_differ(1, &[1, 2, 3], 2, &[1, 2, 3]), None);
        let why = members_differ(2, &[1, 2], 1, &[1, 2, 3]).unwrap();
        assert_eq!(
            why,
            "--peers lists differ: node 2 lists nodes 1,2, node 1 lists nodes 1,2,3 \
             (node 2's lacks 3); every node needs the same --peers"
        );
        let why = members_differ(2, &[1, 2, 4], 1, &[1, 2, 3]).unwrap();
        assert!(
            why.contains("(node 2's lacks 3, node 1's lacks 4)"),
            "{why}"
        );
    }

    fn sample_request() -> AppendEntriesRequest<TypeConfig> {
        use crate::engine::partition::NewRecord;
        use crate::engine::replication::types::{ProduceEntry, ProducerStamp};
        let lid = |term, node_id, index| LogId::new(StoredLeaderId { term, node_id }, index);
        let membership = openraft::Membership::<u64, BasicNode>::new_with_defaults(
            vec![std::collections::BTreeSet::from([1, 2, 3])],
            [1u64, 2, 3],
        );
        AppendEntriesRequest {
            vote: Vote::new_committed(4, 2),
            prev_log_id: Some(lid(3, 1, 9)),
            leader_commit: Some(lid(4, 2, 8)),
            entries: vec![
                Entry {
                    log_id: lid(4, 2, 10),
                    payload: openraft::EntryPayload::Blank,
                },
                Entry {
                    log_id: lid(4, 2, 11),
                    payload: openraft::EntryPayload::Normal(ProduceEntry::new(
                        Some(ProducerStamp {
                            producer_id: 5,
                            epoch: 1,
                            first_sequence: 7,
                        }),
                        [NewRecord {
                            key: Some(b"k"),
                            value: &[0, 1, 2, 255],
                            timestamp_ms: 1_700_000_000_000,
                        }],
                        0,
                    )),
                },
                Entry {
                    log_id: lid(4, 2, 12),
                    payload: openraft::EntryPayload::Membership(membership),
                },
            ],
        }
    }

    #[test]
    fn append_entries_cross_in_binary_and_back() {
        let req = sample_request();
        let bytes = encode_append_request(&req).unwrap();
        let back = decode_append_request(&bytes).unwrap();
        assert_eq!(back.vote, req.vote);
        assert_eq!(back.prev_log_id, req.prev_log_id);
        assert_eq!(back.leader_commit, req.leader_commit);
        assert_eq!(back.entries, req.entries);
        // The normal entry's value is the Raft log's own encoding, not JSON.
        let mut value = Vec::new();
        req.entries[1].encode_value(&mut value).unwrap();
        assert!(bytes.windows(value.len()).any(|w| w == value));
        assert!(!bytes.windows(4).any(|w| w == b"AAEC"), "no base64");
        let heartbeat = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        };
        let back = decode_append_request(&encode_append_request(&heartbeat).unwrap()).unwrap();
        assert_eq!(back.vote, heartbeat.vote);
        assert!(back.entries.is_empty() && back.prev_log_id.is_none());

        for resp in [
            AppendEntriesResponse::<TypeConfig>::Success,
            AppendEntriesResponse::PartialSuccess(None),
            AppendEntriesResponse::PartialSuccess(req.prev_log_id),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(Vote::new(9, 3)),
        ] {
            assert_eq!(
                decode_append_reply(&encode_append_reply(&resp)).unwrap(),
                resp
            );
        }
    }

    #[test]
    fn bad_binary_entries_are_refused() {
        // A normal entry whose payload does not decode.
        let mut out = Vec::new();
        let head = append::WireVote {
            term: 1,
            leader: 1,
            committed: true,
        };
        append::put_request_head(&mut out, &head, None, None, 1).unwrap();
        let id = append::WireLogId {
            term: 1,
            leader: 1,
            index: 1,
        };
        append::put_entry(&mut out, &id, |o| {
            o.extend_from_slice(b"not an entry");
            Ok::<u8, ()>(1)
        })
        .unwrap()
        .unwrap();
        let e = decode_append_request(&out).unwrap_err();
        assert!(matches!(e, AppendCodecError::Entry { index: 1, .. }), "{e}");
        // A blank entry that carries bytes.
        let mut out = Vec::new();
        append::put_request_head(&mut out, &head, None, None, 1).unwrap();
        append::put_entry(&mut out, &id, |o| {
            o.push(0);
            Ok::<u8, ()>(0)
        })
        .unwrap()
        .unwrap();
        assert!(matches!(
            decode_append_request(&out),
            Err(AppendCodecError::Entry { .. })
        ));
        // Cut frames are wire errors.
        let bytes = encode_append_request(&sample_request()).unwrap();
        for cut in [0, 1, 17, bytes.len() - 1] {
            assert!(matches!(
                decode_append_request(&bytes[..cut]),
                Err(AppendCodecError::Wire(_))
            ));
        }
        assert!(matches!(
            decode_append_reply(&[9]),
            Err(AppendCodecError::Wire(_))
        ));
    }

    struct Echo;

    impl CallHandler for Echo {
        async fn handle(
            self: Arc<Self>,
            from: u64,
            topic: String,
            partition: u32,
            rpc: Rpc,
            payload: Vec<u8>,
        ) -> Result<Vec<u8>, String> {
            if topic == "fail" {
                return Err(format!("refused for node {from}"));
            }
            if topic == "lines" {
                return Err("line one\nline two".to_string());
            }
            let mut out = format!("{from} {topic}/{partition} {rpc:?} ").into_bytes();
            out.extend_from_slice(&payload);
            Ok(out)
        }
    }

    async fn wait_reachable(peer: &Peer) {
        for _ in 0..500 {
            if peer.reachable() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("node {} never connected", peer.id);
    }

    #[tokio::test]
    async fn calls_cross_one_connection_and_other_clusters_are_refused() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = Arc::new(
            Arc::into_inner(ident(dirs[0].path(), 1, true))
                .unwrap()
                .with_kafka_addr(Some("kafka-1")),
        );
        let all = vec![(1, addr.clone()), (2, "unused".to_string())];
        let server_peers = Peers::new(Arc::clone(&server), &all);
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(
            listener,
            Arc::clone(&server_peers),
            Arc::new(Echo),
            stop_rx,
        ));

        let client = Peers::new(ident(dirs[1].path(), 2, false), &all);
        client.start();
        let peer = Arc::clone(client.peers.get(&1).unwrap());
        wait_reachable(&peer).await;
        assert_eq!(client.ident.cluster_id(), server.cluster_id());
        assert_eq!(peer.client_addr().as_deref(), Some("client-1"));
        assert_eq!(server_peers.client_addr(2).as_deref(), Some("client-2"));
        // Kafka addresses travel the same way; none is none.
        assert_eq!(client.kafka_addr(1).as_deref(), Some("kafka-1"));
        assert_eq!(server_peers.kafka_addr(1).as_deref(), Some("kafka-1"));
        assert_eq!(server_peers.kafka_addr(2), None);
        assert_eq!(client.kafka_addr(2), None);
        let t = Duration::from_secs(5);
        let r = peer
            .call("t", 3, Rpc::Vote, b"x".to_vec(), t)
            .await
            .unwrap();
        assert_eq!(r, b"2 t/3 Vote x");
        let e = peer
            .call("fail", 0, Rpc::Vote, Vec::new(), t)
            .await
            .unwrap_err();
        assert!(matches!(e, CallError::Failed { .. }), "{e}");
        // A peer's message is shown on one line.
        let e = peer
            .call("lines", 0, Rpc::Vote, Vec::new(), t)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains('\n') && e.contains("line one\\nline two"),
            "{e}"
        );

        // A node of another cluster never connects.
        std::fs::write(
            dirs[2].path().join(CLUSTER_FILE),
            br#"{"cluster_id":"feedface"}"#,
        )
        .unwrap();
        let stranger = Peers::new(ident(dirs[2].path(), 2, false), &all);
        stranger.start();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = stranger.peers.get(&1).unwrap();
        assert!(!p.reachable());
        let e = p.call("t", 0, Rpc::Vote, Vec::new(), t).await.unwrap_err();
        assert!(matches!(e, CallError::Unreachable(1)), "{e}");
    }

    /// A connection whose first frame is not a hello ends with a short reason that
    /// names the frame, not its payload (a call may carry up to the handshake limit).
    #[tokio::test]
    async fn a_call_before_the_hello_is_named_without_its_payload() {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let all = vec![(1, addr.to_string()), (2, "unused".to_string())];
        let peers = Peers::new(ident(dir.path(), 1, true), &all);
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            serve_peer(stream, &peers, Arc::new(Echo), stop_rx).await
        });
        let frame = encode(&PeerFrame::Call {
            call_id: 7,
            topic: "t\nforged",
            partition: 0,
            rpc: Rpc::AppendStream,
            payload: &[0u8; 100_000],
        })
        .unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&frame).await.unwrap();
        let why = server.await.unwrap().unwrap_err();
        assert_eq!(
            why,
            "expected a hello, got call 7 (AppendStream for t\\nforged/0, 100000 payload bytes)"
        );
    }

    #[tokio::test]
    async fn a_node_with_another_peers_list_is_refused_and_adopts_nothing() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let three = vec![
            (1, addr.clone()),
            (2, "unused-2".to_string()),
            (3, "unused-3".to_string()),
        ];
        let server = Arc::new(
            Arc::into_inner(ident(dirs[0].path(), 1, true))
                .unwrap()
                .with_members(&three),
        );
        let server_peers = Peers::new(Arc::clone(&server), &three);
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(
            listener,
            Arc::clone(&server_peers),
            Arc::new(Echo),
            stop_rx,
        ));
        let with = |dir: &std::path::Path, nodes: &[(u64, String)]| {
            let id = Arc::into_inner(ident(dir, 2, false))
                .unwrap()
                .with_members(nodes);
            Peers::new(Arc::new(id), nodes)
        };
        // Node 2 started with only nodes 1 and 2: refused, no cluster id taken.
        let two = &three[..2];
        let short = with(dirs[1].path(), two);
        short.start();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!short.peers.get(&1).unwrap().reachable());
        assert_eq!(short.ident.cluster_id(), None);
        assert!(!dirs[1].path().join(CLUSTER_FILE).exists());
        // The same list, in another order: joins.
        let reordered: Vec<(u64, String)> = three.iter().rev().cloned().collect();
        let same = with(dirs[2].path(), &reordered);
        same.start();
        wait_reachable(same.peers.get(&1).unwrap()).await;
        assert_eq!(same.ident.cluster_id(), server.cluster_id());
    }

    /// A follower whose group answers nothing until [`HELD`] requests have come, then
    /// each in order (the matching id is the request's last), except that a request
    /// whose `prev_log_id` has index [`CONFLICT_AT`] conflicts. A sender that waits
    /// for each answer before the next request never gets one.
    struct Holding;
    const HELD: usize = 4;
    const CONFLICT_AT: u64 = 105;

    impl CallHandler for Holding {
        async fn handle(
            self: Arc<Self>,
            _from: u64,
            _topic: String,
            _partition: u32,
            _rpc: Rpc,
            _payload: Vec<u8>,
        ) -> Result<Vec<u8>, String> {
            Err("only streams here".into())
        }

        fn append_stream(
            &self,
            topic: &str,
            _partition: u32,
            input: BoxStream<'static, AppendEntriesRequest<TypeConfig>>,
        ) -> Option<AppendAnswers> {
            use futures_util::StreamExt;
            if topic != "t" {
                return None;
            }
            let answers = futures_util::stream::unfold(
                (input, std::collections::VecDeque::new(), false),
                |(mut input, mut held, mut open)| async move {
                    while !open && held.len() < HELD {
                        held.push_back(input.next().await?);
                    }
                    open = true;
                    let req = match held.pop_front() {
                        Some(r) => r,
                        None => input.next().await?,
                    };
                    let r: StreamAppendResult<TypeConfig> = match req.prev_log_id {
                        Some(p) if p.index == CONFLICT_AT => Err(StreamAppendError::Conflict(p)),
                        prev => Ok(req.entries.last().map(|e| e.log_id).or(prev)),
                    };
                    Some((Ok(r), (input, held, open)))
                },
            );
            Some(Box::pin(answers))
        }
    }

    /// Requests of one entry each, at indexes `from..to` (term 2, leader 1).
    fn requests(from: u64, to: u64) -> Vec<AppendEntriesRequest<TypeConfig>> {
        let lid = |index| {
            LogId::new(
                StoredLeaderId {
                    term: 2,
                    node_id: 1,
                },
                index,
            )
        };
        (from..to)
            .map(|i| AppendEntriesRequest {
                vote: Vote::new_committed(2, 1),
                prev_log_id: Some(lid(i - 1)),
                leader_commit: None,
                entries: vec![Entry {
                    log_id: lid(i),
                    payload: openraft::EntryPayload::Blank,
                }],
            })
            .collect()
    }

    /// Every answer of one `stream_append` of `input` through `client`.
    async fn answers(
        client: &mut GroupClient,
        input: impl futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + Send
            + Unpin
            + 'static,
        option: &RPCOption,
    ) -> Vec<StreamAnswer> {
        use futures_util::StreamExt;
        let stream = client.stream_append(input, option.clone()).await.unwrap();
        stream.collect().await
    }

    #[tokio::test]
    async fn append_streams_are_pipelined_answered_in_order_and_restart_after_a_conflict() {
        let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let all = vec![(1, addr), (2, "unused".to_string())];
        let server_peers = Peers::new(ident(dirs[0].path(), 1, true), &all);
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(listener, server_peers, Arc::new(Holding), stop_rx));
        let client = Peers::new(ident(dirs[1].path(), 2, false), &all);
        client.start();
        wait_reachable(client.peers.get(&1).unwrap()).await;
        let mut network = GroupNetwork {
            peers: Arc::clone(&client),
            topic: "t".into(),
            partition: 0,
        };
        let node = BasicNode::default();
        let option = RPCOption::new(Duration::from_secs(2));
        let index = |r: &StreamAnswer| match r {
            Ok(Ok(Some(id))) => Ok(id.index),
            other => Err(format!("{other:?}")),
        };

        // Pipelined: five requests, every answer in order (with one request in flight
        // at a time the follower would never answer, and the first would time out).
        let mut c = network.new_client(1, &node).await;
        let input = futures_util::stream::iter(requests(100, 105));
        let got = answers(&mut c, input, &option).await;
        let got: Vec<_> = got.iter().map(index).collect();
        assert_eq!(got, (100..105).map(Ok).collect::<Vec<_>>());

        // A conflict ends the stream at it; the next stream on the same connection is
        // answered by a new stream of the group.
        let input = futures_util::stream::iter(requests(105, 110));
        let got = answers(&mut c, input, &option).await;
        // (Request 105 follows 104; request 106, after 105, conflicts.)
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(index(&got[0]), Ok(105));
        assert!(
            matches!(&got[1], Ok(Err(StreamAppendError::Conflict(p))) if p.index == CONFLICT_AT),
            "{got:?}"
        );
        let input = futures_util::stream::iter(requests(200, 208));
        let got = answers(&mut c, input, &option).await;
        let got: Vec<_> = got.iter().map(index).collect();
        assert_eq!(got, (200..208).map(Ok).collect::<Vec<_>>());

        // The heartbeats' client sends one call at a time, outside the stream: this
        // follower refuses those.
        let mut h = network.new_heartbeat_client(1, &node).await;
        let input = futures_util::stream::iter(requests(300, 301));
        let got = answers(&mut h, input, &option).await;
        assert!(
            matches!(got.as_slice(), [Err(RPCError::Network(_))]),
            "{got:?}"
        );

        // A group that is not on the follower: refused, the stream ends.
        network.topic = "other".into();
        let mut o = network.new_client(1, &node).await;
        let input = futures_util::stream::iter(requests(100, 104));
        let got = answers(&mut o, input, &option).await;
        assert!(
            matches!(got.as_slice(), [Err(RPCError::Network(_))]),
            "{got:?}"
        );
    }
}
