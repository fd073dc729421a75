//! A client of a cluster: several broker addresses, one connection per broker it
//! talked to, and requests on replicated partitions that follow the leader. A
//! NOT_LEADER refusal names the leader's client address
//! ([`crate::format::wire::parse_not_leader`]); with none named, the next broker of
//! the list is tried. Against a single broker it behaves as [`Client`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::client::{Client, ClientError, Fetched};
use super::tls::ClientTls;
use crate::format::wire::{parse_not_leader, ErrorCode, PartitionBatch, WireRecord};

/// How long a request keeps following leaders before it gives up (an election
/// takes about a second).
pub const FOLLOW_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between attempts while no leader is known.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A connection pool over a cluster's brokers.
#[derive(Debug)]
pub struct ClusterClient {
    brokers: Vec<String>,
    timeout: Duration,
    /// Longest a connection's setup takes ([`Client::connect_within`]).
    connect_timeout: Duration,
    tls: Option<ClientTls>,
    token: Option<String>,
    conns: BTreeMap<String, Client>,
    /// The leader address last learned per (topic, partition).
    leaders: BTreeMap<(String, u32), String>,
    /// The broker tried first when no leader is known.
    next: usize,
}

/// Splits a `--broker` value (`A,B,C`) into its addresses.
pub fn broker_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

impl ClusterClient {
    /// A client of the brokers at `brokers` (at least one); nothing is connected yet.
    pub fn new(
        brokers: Vec<String>,
        timeout: Duration,
        tls: Option<ClientTls>,
        token: Option<String>,
    ) -> ClusterClient {
        ClusterClient {
            brokers,
            timeout,
            connect_timeout: super::client::CONNECT_TIMEOUT_DEFAULT,
            tls,
            token,
            conns: BTreeMap::new(),
            leaders: BTreeMap::new(),
            next: 0,
        }
    }

    /// Each connection's setup (TCP connect, TLS, handshake) takes at most `setup`
    /// (default [`super::client::CONNECT_TIMEOUT_DEFAULT`]).
    pub fn with_connect_timeout(mut self, setup: Duration) -> ClusterClient {
        self.connect_timeout = setup;
        self
    }

    /// A connection to `addr`, made (or remade, after an error closed it) on demand.
    pub fn conn(&mut self, addr: &str) -> Result<&mut Client, ClientError> {
        if !self.conns.contains_key(addr) {
            let c = Client::connect_within(
                addr,
                self.connect_timeout,
                self.timeout,
                self.tls.as_ref(),
                self.token.as_deref(),
            )?;
            self.conns.insert(addr.to_string(), c);
        }
        self.conns.get_mut(addr).ok_or(ClientError::Closed {
            addr: addr.to_string(),
        })
    }

    /// A connection to the first broker of the list that answers.
    pub fn any(&mut self) -> Result<&mut Client, ClientError> {
        let mut errors = Vec::new();
        for i in 0..self.brokers.len() {
            let addr = self.brokers[(self.next + i) % self.brokers.len()].clone();
            match self.conn(&addr) {
                Ok(_) => return self.conn(&addr),
                Err(e) => errors.push(e),
            }
        }
        Err(ClientError::of_all(errors).unwrap_or(ClientError::Closed {
            addr: String::new(),
        }))
    }

    fn target(&self, topic: &str, partition: u32, attempt: usize) -> String {
        match self.leaders.get(&(topic.to_string(), partition)) {
            Some(a) => a.clone(),
            None => self.brokers[(self.next + attempt) % self.brokers.len().max(1)].clone(),
        }
    }

    /// Runs `op` on the partition's leader, following NOT_LEADER refusals and
    /// moving past brokers that cannot be reached, for up to [`FOLLOW_TIMEOUT`].
    fn on_leader<T>(
        &mut self,
        topic: &str,
        partition: u32,
        mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let began = Instant::now();
        let key = (topic.to_string(), partition);
        let mut attempt = 0;
        // Brokers asked since the last pause: a broker that is down or knows no leader
        // sends the request on to the next one at once; only a whole round of them
        // without an answer pauses (an election is under way).
        let mut unanswered = 0usize;
        loop {
            let addr = self.target(topic, partition, attempt);
            attempt += 1;
            let result = self.conn(&addr).and_then(&mut op);
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let retry = match &err {
                ClientError::Refused {
                    code: ErrorCode::NOT_LEADER,
                    message,
                    ..
                } => {
                    match parse_not_leader(message) {
                        Some((_, leader)) if leader != addr => {
                            self.leaders.insert(key.clone(), leader);
                        }
                        _ => {
                            self.leaders.remove(&key);
                            self.next = (self.next + 1) % self.brokers.len().max(1);
                            self.pause_after_round(&mut unanswered);
                        }
                    }
                    true
                }
                e if e.is_lost_connection()
                    || matches!(
                        e,
                        ClientError::Refused {
                            code: ErrorCode::PARTITION_UNAVAILABLE | ErrorCode::SHUTTING_DOWN,
                            ..
                        }
                    ) =>
                {
                    self.conns.remove(&addr);
                    self.leaders.remove(&key);
                    self.next = (self.next + 1) % self.brokers.len().max(1);
                    self.pause_after_round(&mut unanswered);
                    true
                }
                _ => false,
            };
            if !retry || began.elapsed() >= FOLLOW_TIMEOUT {
                return Err(err);
            }
        }
    }

    /// Runs a group request on the group coordinator: in a cluster, the leader of
    /// the offsets topic's partition, which the other nodes name in their
    /// refusals (followed as NOT_LEADER refusals are, for up to
    /// [`FOLLOW_TIMEOUT`]); a single broker is its own.
    pub fn on_coordinator<T>(
        &mut self,
        op: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        self.on_leader(crate::engine::groups::OFFSETS_TOPIC, 0, op)
    }

    /// Runs `op` on the first broker that answers, moving past brokers that cannot
    /// be reached (for up to [`FOLLOW_TIMEOUT`]); a refusal is returned as is.
    pub fn on_any<T>(
        &mut self,
        mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let began = Instant::now();
        let mut unanswered = 0usize;
        loop {
            let addr = self.brokers[self.next % self.brokers.len().max(1)].clone();
            let err = match self.conn(&addr).and_then(&mut op) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match err {
                e if e.is_lost_connection() && began.elapsed() < FOLLOW_TIMEOUT => {
                    self.conns.remove(&addr);
                    self.next = (self.next + 1) % self.brokers.len().max(1);
                    self.pause_after_round(&mut unanswered);
                }
                e => return Err(e),
            }
        }
    }

    /// Counts one broker that gave no leader; pauses once every broker has.
    fn pause_after_round(&self, unanswered: &mut usize) {
        *unanswered += 1;
        if *unanswered >= self.brokers.len() {
            *unanswered = 0;
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Appends `records` to one partition on its leader; the offsets given.
    ///
    /// A retry after a lost connection may append the records twice (use an
    /// idempotent producer for exactly once).
    pub fn produce(
        &mut self,
        topic: &str,
        partition: u32,
        records: &[WireRecord<'_>],
    ) -> Result<(u64, u64), ClientError> {
        self.on_leader(topic, partition, |c| {
            let acks = c.produce(
                topic,
                vec![PartitionBatch {
                    partition,
                    records: records.to_vec(),
                }],
            )?;
            let addr = c.addr().to_string();
            match acks.into_iter().next().map(|a| a.result) {
                Some(Ok(offsets)) => Ok(offsets),
                Some(Err((code, message))) => Err(ClientError::Refused {
                    addr,
                    code,
                    message,
                }),
                None => Err(ClientError::Protocol {
                    addr,
                    detail: "a produce answered without its partition".into(),
                }),
            }
        })
    }

    /// Fetches from the partition's leader.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<Fetched, ClientError> {
        self.on_leader(topic, partition, |c| {
            c.fetch(topic, partition, offset, max_bytes, max_wait)
        })
    }

    /// The JSON of `cluster status`, from the first broker that answers.
    pub fn cluster_status(&mut self) -> Result<String, ClientError> {
        self.any()?.cluster_status()
    }
}
