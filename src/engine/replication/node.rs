//! A cluster node as `serve --peers` runs it: its identity (the cluster id in
//! `DATA/cluster.json`), its peers, the manager of its groups, and the Raft logs
//! under `DATA/raft/` ([`super::log_store::RaftLog`]).

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::log_store::RaftLog;
use super::manager::{LogStores, Manager};
use super::network::{Identity, Peers};
use super::types::TypeConfig;
use super::Replicator;
use crate::engine::broker::Broker;

/// The directory of the Raft logs in the data directory.
pub const RAFT_DIR: &str = "raft";
/// How often the stop flags are looked at.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Opens each group's Raft log at `DATA/raft/<topic>/<partition>/`.
#[derive(Debug)]
pub struct RaftLogs;

impl LogStores for RaftLogs {
    type Store = RaftLog<TypeConfig>;

    fn open(&self, broker: &Arc<Broker>, topic: &str, partition: u32) -> io::Result<Self::Store> {
        let dir = broker
            .data_dir()
            .join(RAFT_DIR)
            .join(topic)
            .join(partition.to_string());
        RaftLog::open(&dir, Arc::clone(broker.storage()), broker.log_stats())
            .map_err(|e| io::Error::other(e.to_string()))
    }
}

/// What the node's hellos say of its logins, and what it does when a peer requires
/// them: under `--auth` auto it requires them too, keys or none, and says so once.
fn logins(broker: &Arc<Broker>) -> super::network::Logins {
    let ours = Arc::clone(broker);
    let theirs = Arc::clone(broker);
    super::network::Logins {
        required: Box::new(move || ours.keys().required()),
        peer_requires: Box::new(move |peer| {
            if theirs.keys().require_for_cluster() {
                tracing::warn!(
                    peer,
                    "node {peer} requires logins: this node now requires them too, though it \
                     holds no API key yet (its clients cannot log in until it has the \
                     cluster's keys)"
                );
            }
        }),
    }
}

/// A started cluster node.
pub struct Node {
    pub manager: Arc<Manager<RaftLogs>>,
    /// The same manager, as the request path sees it.
    pub replicator: Arc<dyn Replicator>,
}

/// Loads the node's identity and builds its manager; nothing runs until
/// [`Node::run`]. `nodes` lists every node (id, Raft address), this one included;
/// `kafka_addr` is this node's Kafka listener as clients reach it, if it has one.
pub fn start(
    broker: Arc<Broker>,
    node_id: u64,
    client_addr: &str,
    kafka_addr: Option<&str>,
    nodes: &[(u64, String)],
) -> Result<Node, String> {
    start_with(
        broker,
        node_id,
        client_addr,
        kafka_addr,
        nodes,
        super::manager::SNAPSHOT_ENTRIES_DEFAULT,
        PeerSecurity::default(),
    )
}

/// How the node's Raft connections are secured: the cluster secret every peer must
/// prove it holds (`serve --cluster-secret-file`) and TLS (`serve --raft-tls-*`).
#[derive(Debug, Default)]
pub struct PeerSecurity {
    pub secret: Option<super::secret::ClusterSecret>,
    pub tls: Option<super::peer_tls::PeerTls>,
}

/// [`start`], with a snapshot of each group every `snapshot_entries` applied entries
/// (`serve --raft-snapshot-entries`; 0: never, the Raft logs are kept whole) and its
/// connections secured as `security` says.
pub fn start_with(
    broker: Arc<Broker>,
    node_id: u64,
    client_addr: &str,
    kafka_addr: Option<&str>,
    nodes: &[(u64, String)],
    snapshot_entries: u64,
    security: PeerSecurity,
) -> Result<Node, String> {
    let founder = nodes.iter().map(|(id, _)| *id).min() == Some(node_id);
    let ident = Identity::load(
        node_id,
        client_addr.to_string(),
        broker.data_dir().to_path_buf(),
        Arc::clone(broker.storage()),
        founder,
    )
    .map_err(|e| format!("cannot read the cluster id: {e}"))?
    .with_kafka_addr(kafka_addr)
    .with_members(nodes)
    .with_secret(security.secret)
    .with_tls(security.tls)
    .with_logins(logins(&broker));
    ident
        .found_if_alone()
        .map_err(|e| format!("cannot record the cluster id: {e}"))?;
    broker.producers().reserve_ids_from(node_id << 48);
    // The cluster's groups live in its offsets topic, served by the node leading it.
    broker.groups().replicate();
    let peers = Peers::new(Arc::new(ident), nodes);
    let config = super::manager::raft_config_with(snapshot_entries)
        .map_err(|e| format!("bad Raft settings: {e}"))?;
    let manager = Manager::new_with(broker, peers, RaftLogs, nodes, config)
        .map_err(|e| format!("bad Raft settings: {e}"))?;
    let replicator: Arc<dyn Replicator> = manager.clone();
    Ok(Node {
        manager,
        replicator,
    })
}

impl Node {
    /// Serves Raft on `listener` until `stop` or `also_stop` is set.
    pub async fn run(
        self,
        listener: TcpListener,
        stop: Arc<AtomicBool>,
        also_stop: &AtomicBool,
    ) -> io::Result<()> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let watch = async {
            while !stop.load(Ordering::SeqCst) && !also_stop.load(Ordering::SeqCst) {
                tokio::time::sleep(STOP_POLL).await;
            }
            let _ = tx.send(true);
        };
        let (served, ()) = tokio::join!(self.manager.run(listener, rx), watch);
        served
    }
}
