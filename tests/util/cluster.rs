//! A cluster of `seglog serve` processes on loopback, for the replication tests. Each
//! node has its own data directory (under one temporary root), a fixed client port and
//! a fixed Raft port (chosen free at start, kept across restarts), and a `--peers`
//! list in which its link to every other node j goes through its own [`Proxy`]
//! (link i->j carries the connections node i opens to node j, both ways). Nodes can
//! be killed with SIGKILL, paused with SIGSTOP and resumed, stopped, and restarted
//! from their data directory; links can be cut, black-holed and healed. Everything
//! stops on drop.
//!
//! Questions to the cluster go through `seglog cluster status --json` and are bounded
//! in time, since a paused node accepts connections but never answers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::net::client::{Client, ClientError};
use seglog::format::wire::{parse_not_leader, ErrorCode, PartitionBatch, WireRecord};

use super::bin::{run, BIN};
use super::proxy::Proxy;
use super::replica_check::{check, parse_dump, Acked, Replica, Violation};
use super::serve::{Serve, PATIENCE};

/// How long one status query may take before the node counts as not answering.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

pub use super::port::free_port;

/// Runs `cmd`, killing it after `limit`; `None` if it did not end in time.
pub fn output_within(cmd: Command, limit: Duration) -> Option<Output> {
    output_within_from(cmd, Stdio::null(), limit)
}

/// [`output_within`] with `stdin` as the command's standard input.
pub fn output_within_from(mut cmd: Command, stdin: Stdio, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run seglog");
    let (tx, rx) = mpsc::channel();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_thread = thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut b);
        b
    });
    let err_thread = thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut b);
        let _ = tx.send(());
        b
    });
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if began.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let status = status?;
    let _ = rx.recv_timeout(Duration::from_secs(1));
    Some(Output {
        status,
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
    })
}

/// One node: its fixed addresses and, while it runs, its process.
pub struct Node {
    pub id: u64,
    pub dir: PathBuf,
    pub client_addr: String,
    pub raft_addr: String,
    /// This node's `--peers` value (its links to the others through their proxies);
    /// empty for a standalone broker, which gets no replication flags at all.
    pub peers: String,
    /// Extra environment of the process (e.g. the fsync fault).
    pub env: Vec<(String, String)>,
    /// Extra flags of `seglog serve`.
    pub args: Vec<String>,
    serve: Option<Serve>,
    paused: bool,
}

impl Node {
    /// The `seglog serve` command of this node.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--listen", &self.client_addr]);
        if !self.peers.is_empty() {
            cmd.args(["--node-id", &self.id.to_string()])
                .args(["--raft-listen", &self.raft_addr])
                .args(["--peers", &self.peers]);
        }
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// True while the process runs (paused or not).
    pub fn up(&mut self) -> bool {
        self.serve.as_mut().is_some_and(Serve::running)
    }

    /// True while the process runs and is not paused.
    pub fn answering(&mut self) -> bool {
        !self.paused && self.up()
    }

    /// What the process wrote to stderr (this run).
    pub fn stderr(&self) -> String {
        self.serve.as_ref().map(Serve::stderr).unwrap_or_default()
    }

    /// The running process.
    pub fn serve(&self) -> &Serve {
        self.serve.as_ref().expect("the node runs")
    }
}

/// The nodes and the links between them.
pub struct Cluster {
    root: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// Link (from, to) -> its proxy, for every ordered pair of distinct nodes.
    links: BTreeMap<(u64, u64), Proxy>,
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) and waits until each listens.
    pub fn start(n: u64) -> Cluster {
        Cluster::start_with(n, |_| Vec::new())
    }

    /// Starts `n` nodes, node `id` with the extra environment `env(id)`.
    pub fn start_with(n: u64, env: impl Fn(u64) -> Vec<(String, String)>) -> Cluster {
        let mut c = Cluster::prepare(n);
        for node in &mut c.nodes {
            node.env = env(node.id);
        }
        c.start_all();
        c
    }

    /// Starts `n` nodes, node `id` with the extra `seglog serve` flags `args(id)`.
    pub fn start_with_args(n: u64, args: impl Fn(u64) -> Vec<String>) -> Cluster {
        let mut c = Cluster::prepare(n);
        for node in &mut c.nodes {
            node.args = args(node.id);
        }
        c.start_all();
        c
    }

    /// Starts `n` nodes whose Raft traffic goes straight to each other, without the
    /// fault-injecting proxies (for measurements: a proxy adds a copy and a hop).
    pub fn start_direct(n: u64) -> Cluster {
        let mut c = Cluster::prepare(n);
        c.links.clear();
        let peers = c
            .nodes
            .iter()
            .map(|node| format!("{}={}", node.id, node.raft_addr))
            .collect::<Vec<_>>()
            .join(",");
        for node in &mut c.nodes {
            node.peers = peers.clone();
        }
        c.start_all();
        c
    }

    /// Starts every node at once (a node may wait for its peers before it listens).
    pub fn start_all(&mut self) {
        let cmds: Vec<Command> = self.nodes.iter().map(Node::command).collect();
        let started: Vec<Serve> = thread::scope(|s| {
            let handles: Vec<_> = cmds
                .into_iter()
                .map(|cmd| s.spawn(move || Serve::spawn(cmd)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a node did not start"))
                .collect()
        });
        for (node, serve) in self.nodes.iter_mut().zip(started) {
            node.serve = Some(serve);
            node.paused = false;
        }
    }

    /// `n` standalone brokers (no replication flags, no proxies), each with its own
    /// data directory and fixed client port, started: the harness without Raft.
    pub fn standalone(n: u64) -> Cluster {
        let mut c = Cluster::prepare(n);
        c.links.clear();
        for node in &mut c.nodes {
            node.peers.clear();
        }
        c.start_all();
        c
    }

    /// The nodes, ports and proxies, nothing started.
    pub fn prepare(n: u64) -> Cluster {
        let root = tempfile::tempdir().expect("temp dir");
        let ids: Vec<u64> = (1..=n).collect();
        let raft: BTreeMap<u64, String> = ids
            .iter()
            .map(|&i| (i, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut links = BTreeMap::new();
        for &i in &ids {
            for &j in &ids {
                if i != j {
                    links.insert((i, j), Proxy::start(&raft[&j]));
                }
            }
        }
        let nodes = ids
            .iter()
            .map(|&i| {
                let peers: Vec<String> = ids
                    .iter()
                    .map(|&j| {
                        let addr = if i == j {
                            raft[&j].clone()
                        } else {
                            links[&(i, j)].addr.clone()
                        };
                        format!("{j}={addr}")
                    })
                    .collect();
                Node {
                    id: i,
                    dir: root.path().join(format!("node{i}")),
                    client_addr: format!("127.0.0.1:{}", free_port()),
                    raft_addr: raft[&i].clone(),
                    peers: peers.join(","),
                    env: Vec::new(),
                    args: Vec::new(),
                    serve: None,
                    paused: false,
                }
            })
            .collect();
        Cluster { root, nodes, links }
    }

    /// The temporary root holding every node's data directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[self.index(id)]
    }

    pub fn node_mut(&mut self, id: u64) -> &mut Node {
        let i = self.index(id);
        &mut self.nodes[i]
    }

    fn index(&self, id: u64) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// Every node's client address, comma-separated (for `--broker`).
    pub fn brokers(&self) -> String {
        let addrs: Vec<&str> = self.nodes.iter().map(|n| n.client_addr.as_str()).collect();
        addrs.join(",")
    }

    /// The proxy of link `from` -> `to`.
    pub fn link(&self, from: u64, to: u64) -> &Proxy {
        &self.links[&(from, to)]
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_between(&self, a: u64, b: u64) {
        self.link(a, b).cut();
        self.link(b, a).cut();
    }

    /// Black-holes both directions between `a` and `b`.
    pub fn drop_between(&self, a: u64, b: u64) {
        self.link(a, b).drop_traffic();
        self.link(b, a).drop_traffic();
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&self, id: u64) {
        for ((from, to), p) in &self.links {
            if *from == id || *to == id {
                p.cut();
            }
        }
    }

    /// Every link back to passing traffic.
    pub fn heal_all(&self) {
        for p in self.links.values() {
            p.heal();
        }
    }

    /// (Re)starts node `id` from its data directory; returns once it listens.
    pub fn restart(&mut self, id: u64) {
        let node = self.node_mut(id);
        assert!(!node.up(), "node {id} already runs");
        node.serve = Some(Serve::spawn(node.command()));
        node.paused = false;
    }

    /// SIGKILL, as a crash would; the data directory stays.
    pub fn kill9(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(s) = node.serve.take() {
            s.kill9();
        }
        node.paused = false;
    }

    /// SIGTERM; the node must exit 0.
    pub fn stop(&mut self, id: u64) {
        let node = self.node_mut(id);
        if node.paused {
            node.serve().signal(rustix::process::Signal::CONT);
            node.paused = false;
        }
        if let Some(s) = node.serve.take() {
            s.stop();
        }
    }

    /// Stops every running node (SIGTERM, exit 0 each).
    pub fn stop_all(&mut self) {
        for id in self.ids() {
            self.stop(id);
        }
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: u64) {
        let node = self.node_mut(id);
        node.serve().signal(rustix::process::Signal::STOP);
        node.paused = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) {
        let node = self.node_mut(id);
        if node.paused {
            node.serve().signal(rustix::process::Signal::CONT);
            node.paused = false;
        }
    }

    /// Resumes the paused nodes, restarts the dead ones and heals every link.
    pub fn heal_everything(&mut self) {
        self.heal_all();
        for id in self.ids() {
            self.resume(id);
            if !self.node_mut(id).up() {
                self.node_mut(id).serve = None;
                self.restart(id);
            }
        }
    }

    /// Runs a client command against node `id` alone, bounded by [`QUERY_TIMEOUT`];
    /// `None` if the node did not answer in time.
    pub fn run_on(&self, id: u64, args: &[&str]) -> Option<Output> {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .args(["--broker", &self.node(id).client_addr]);
        output_within(cmd, QUERY_TIMEOUT)
    }

    /// Runs a client command with `--broker` naming every node; must succeed within
    /// [`PATIENCE`]; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_from(args, Stdio::null())
    }

    /// [`Cluster::ok`] with `input` as the command's standard input.
    pub fn ok_with_stdin(&self, args: &[&str], input: &str) -> String {
        let file = tempfile::tempfile().expect("a temp file");
        std::io::Write::write_all(&mut &file, input.as_bytes()).expect("write stdin");
        std::io::Seek::rewind(&mut &file).expect("rewind stdin");
        self.ok_from(args, Stdio::from(file))
    }

    fn ok_from(&self, args: &[&str], stdin: Stdio) -> String {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--broker", &self.brokers()]);
        let out = output_within_from(cmd, stdin, PATIENCE)
            .unwrap_or_else(|| panic!("seglog {args:?} did not end in time"));
        assert!(
            out.status.success(),
            "seglog {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// `cluster status --json` of node `id`, if it answers.
    pub fn status(&mut self, id: u64) -> Option<serde_json::Value> {
        if !self.node_mut(id).answering() {
            return None;
        }
        let out = self.run_on(id, &["cluster", "status", "--json"])?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits (at most [`PATIENCE`]) until node `id` answers its status with a
    /// cluster id; returns the id.
    pub fn wait_cluster_id(&mut self, id: u64) -> String {
        let began = Instant::now();
        loop {
            if let Some(cid) = self
                .status(id)
                .and_then(|s| s["cluster_id"].as_str().map(str::to_string))
                .filter(|c| !c.is_empty())
            {
                return cid;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "node {id} has no cluster id: {}",
                self.node(id).stderr()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The leader of `topic`/`partition` as a node that answers says it is itself
    /// (the highest term wins if two do, as an old leader may not know yet).
    pub fn leader(&mut self, topic: &str, partition: u32) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.ids() {
            let Some(s) = self.status(id) else { continue };
            let Some(p) = partition_status(&s, topic, partition) else {
                continue;
            };
            if p["leader"].as_u64() == Some(id) {
                let term = p["term"].as_u64().unwrap_or(0);
                if best.is_none_or(|(t, _)| term > t) {
                    best = Some((term, id));
                }
            }
        }
        best.map(|(_, id)| id)
    }

    /// Creates `topic` with `partitions` partitions and replication factor `rf`
    /// (`topics create` through every node's address).
    pub fn create_topic(&self, topic: &str, partitions: u32, rf: u32) {
        self.ok(&[
            "topics",
            "create",
            topic,
            "--partitions",
            &partitions.to_string(),
            "--replication-factor",
            &rf.to_string(),
        ]);
    }

    /// Waits (at most [`PATIENCE`]) for a leader of `topic`/`partition`.
    pub fn wait_leader(&mut self, topic: &str, partition: u32) -> u64 {
        let began = Instant::now();
        loop {
            if let Some(id) = self.leader(topic, partition) {
                return id;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "no leader of {topic}/{partition}: {}",
                self.describe()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// True when, for each partition, the leader reports every replica at lag 0 with
    /// its match index at the commit index, and every node has applied that index.
    pub fn caught_up(&mut self, topic: &str, partitions: u32) -> bool {
        for p in 0..partitions {
            let Some(leader) = self.leader(topic, p) else {
                return false;
            };
            let Some(s) = self.status(leader) else {
                return false;
            };
            let Some(ps) = partition_status(&s, topic, p) else {
                return false;
            };
            let Some(commit) = ps["commit_index"].as_u64() else {
                return false;
            };
            let Some(replicas) = ps["replicas"].as_array() else {
                return false;
            };
            if replicas.len() != self.nodes.len()
                || !replicas.iter().all(|r| {
                    r["lag"].as_u64() == Some(0) && r["match_index"].as_u64() == Some(commit)
                })
            {
                return false;
            }
            for id in self.ids() {
                let applied = self
                    .status(id)
                    .and_then(|s| partition_status(&s, topic, p).cloned())
                    .and_then(|ps| ps["applied_index"].as_u64());
                if applied != Some(commit) {
                    return false;
                }
            }
        }
        true
    }

    /// Waits (at most [`PATIENCE`]) until [`Cluster::caught_up`].
    pub fn wait_caught_up(&mut self, topic: &str, partitions: u32) {
        let began = Instant::now();
        while !self.caught_up(topic, partitions) {
            assert!(
                began.elapsed() < PATIENCE,
                "{topic} did not catch up: {}",
                self.describe()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every answering node's status, for failure messages.
    pub fn describe(&mut self) -> String {
        let mut out = String::new();
        for id in self.ids() {
            let s = self
                .status(id)
                .map_or_else(|| "no answer".to_string(), |s| s.to_string());
            let _ = write!(out, "\nnode {id}: {s}");
        }
        out
    }

    /// What node `id` holds of `topic`'s data partitions, read offline with `seglog
    /// dump` (the node must be stopped).
    pub fn dump(&mut self, id: u64, topic: &str, partitions: u32) -> Replica {
        assert!(
            !self.node_mut(id).up(),
            "dump node {id} only once it stopped"
        );
        let mut records = Vec::new();
        for p in 0..partitions {
            let dir = self
                .node(id)
                .dir
                .join("topics")
                .join(topic)
                .join(p.to_string());
            let out = Command::new(BIN)
                .arg("dump")
                .arg(&dir)
                .args(["--json", "--bytes", "hex"])
                .output()
                .expect("run seglog dump");
            let text = String::from_utf8(out.stdout).expect("utf-8 dump");
            assert!(
                out.status.success(),
                "dump of node {id} {topic}/{p} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            records
                .extend(parse_dump(&text).unwrap_or_else(|e| panic!("node {id} {topic}/{p}: {e}")));
        }
        Replica { node: id, records }
    }

    /// Every node (stopped) holds every acknowledged record of `topic` at its
    /// offset, and nothing else: the same offset → record mapping, no duplicate;
    /// and `seglog verify` of each node's directory is clean.
    pub fn assert_every_replica_holds(&mut self, topic: &str, partitions: u32, acked: &[Acked]) {
        let replicas: Vec<Replica> = self
            .ids()
            .into_iter()
            .map(|id| self.dump(id, topic, partitions))
            .collect();
        assert_eq!(check(acked, &replicas), Vec::<Violation>::new());
        for r in &replicas {
            assert_eq!(r.records.len(), acked.len(), "node {}", r.node);
        }
        for id in self.ids() {
            let dir = self.node(id).dir.clone();
            let (code, out, err) = run(&["verify", dir.to_str().unwrap()], self.root());
            assert_eq!(code, 0, "verify of node {id}: {out}{err}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if n.paused {
                if let Some(s) = &n.serve {
                    s.signal(rustix::process::Signal::CONT);
                }
            }
            // Serve's drop sends SIGKILL.
            n.serve = None;
        }
    }
}

/// The entry of `topic`/`partition` in a `cluster status --json` object.
pub fn partition_status<'a>(
    status: &'a serde_json::Value,
    topic: &str,
    partition: u32,
) -> Option<&'a serde_json::Value> {
    status["partitions"].as_array()?.iter().find(|p| {
        p["topic"].as_str() == Some(topic) && p["partition"].as_u64() == Some(partition.into())
    })
}

/// Reads `child`'s stderr lines into a channel (for a process started outside
/// [`Serve`], such as one expected to refuse to start).
pub fn stderr_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("piped stderr");
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// How one batch of a [`ClusterProducer`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Acknowledged: the offset of the first record.
    Acked(u64),
    /// The broker no longer knows this producer's id, epoch or sequence; the batch
    /// may or may not be stored. The producer must be initialised again.
    ProducerLost(ErrorCode, String),
    /// Not acknowledged before `keep_trying` said stop; may or may not be stored.
    GaveUp,
}

/// An idempotent producer over the whole cluster: sends each batch to the node it
/// believes leads, follows not-leader answers, moves to the next node on any other
/// failure, and retries the same batch (same sequence) until it is acknowledged, so
/// a retry across a leader change must be recognised as a duplicate.
pub struct ClusterProducer {
    addrs: Vec<String>,
    at: usize,
    client: Option<Client>,
    timeout: Duration,
    /// (producer id, epoch) once initialised.
    pub id: Option<(u64, u16)>,
    /// Next base sequence, per partition.
    seqs: BTreeMap<u32, i32>,
    /// Attempts that failed and were retried, over the producer's life.
    pub retries: u64,
}

impl ClusterProducer {
    pub fn new(addrs: Vec<String>, timeout: Duration) -> ClusterProducer {
        assert!(!addrs.is_empty());
        ClusterProducer {
            addrs,
            at: 0,
            client: None,
            timeout,
            id: None,
            seqs: BTreeMap::new(),
            retries: 0,
        }
    }

    fn next_node(&mut self) {
        self.client = None;
        self.at = (self.at + 1) % self.addrs.len();
    }

    fn follow(&mut self, message: &str) {
        self.client = None;
        match parse_not_leader(message).and_then(|(_, a)| self.addrs.iter().position(|x| *x == a)) {
            Some(i) => self.at = i,
            None => self.at = (self.at + 1) % self.addrs.len(),
        }
    }

    fn connected(&mut self) -> Option<&mut Client> {
        if self.client.is_none() {
            match Client::connect(&self.addrs[self.at], self.timeout) {
                Ok(c) => self.client = Some(c),
                Err(_) => {
                    self.next_node();
                    return None;
                }
            }
        }
        self.client.as_mut()
    }

    fn pause(&mut self) {
        self.retries += 1;
        thread::sleep(Duration::from_millis(20));
    }

    /// Gets a (new) producer id; false if `keep_trying` said stop first.
    pub fn init(&mut self, keep_trying: &dyn Fn() -> bool) -> bool {
        self.id = None;
        self.seqs.clear();
        while keep_trying() {
            let Some(c) = self.connected() else {
                self.pause();
                continue;
            };
            match c.init_producer(None) {
                Ok(id) => {
                    self.id = Some(id);
                    return true;
                }
                Err(ClientError::Refused { code, message, .. })
                    if code == ErrorCode::NOT_LEADER =>
                {
                    self.follow(&message);
                }
                Err(_) => self.next_node(),
            }
            self.pause();
        }
        false
    }

    /// Sends `values` to `topic`/`partition` as one batch until it is acknowledged.
    pub fn send(
        &mut self,
        topic: &str,
        partition: u32,
        values: &[Vec<u8>],
        keep_trying: &dyn Fn() -> bool,
    ) -> Sent {
        let Some((pid, epoch)) = self.id else {
            return Sent::ProducerLost(ErrorCode::UNKNOWN_PRODUCER, "not initialised".into());
        };
        let seq = *self.seqs.get(&partition).unwrap_or(&0);
        while keep_trying() {
            let Some(c) = self.connected() else {
                self.pause();
                continue;
            };
            let batch = PartitionBatch {
                partition,
                records: values
                    .iter()
                    .map(|v| WireRecord {
                        timestamp_ms: 1,
                        key: None,
                        value: v,
                    })
                    .collect(),
            };
            let result = c.produce_idempotent(topic, pid, epoch, vec![(seq, batch)]);
            match result.map(|acks| acks.into_iter().next().map(|a| a.result)) {
                Ok(Some(Ok((base, last)))) => {
                    assert_eq!(
                        last + 1 - base,
                        values.len() as u64,
                        "{topic}/{partition}: {} records acknowledged as {base}..={last}",
                        values.len()
                    );
                    let n = i32::try_from(values.len()).expect("batch size");
                    self.seqs.insert(partition, seq + n);
                    return Sent::Acked(base);
                }
                Ok(Some(Err((code, message)))) => {
                    if [
                        ErrorCode::OUT_OF_ORDER_SEQUENCE,
                        ErrorCode::INVALID_PRODUCER_EPOCH,
                        ErrorCode::UNKNOWN_PRODUCER,
                    ]
                    .contains(&code)
                    {
                        return Sent::ProducerLost(code, message);
                    }
                    if code == ErrorCode::NOT_LEADER {
                        self.follow(&message);
                    } else if code != ErrorCode::PRODUCER_BUSY {
                        self.next_node();
                    }
                }
                Err(ClientError::Refused { code, message, .. })
                    if code == ErrorCode::NOT_LEADER =>
                {
                    self.follow(&message);
                }
                Ok(None) | Err(_) => self.next_node(),
            }
            self.pause();
        }
        Sent::GaveUp
    }
}
