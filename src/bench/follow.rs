//! The produce workers' connections on a cluster, following leaders: each worker
//! holds one connection per node it sends to and a route per partition. On a
//! cluster (`--broker` naming several nodes) a request refused with NOT_LEADER
//! (or PARTITION_UNAVAILABLE, SHUTTING_DOWN), or lost with its connection, is sent
//! again: to the leader the refusal names, else to the next node of the list, for up
//! to [`FOLLOW_TIMEOUT`] of failing in a row, as the `produce` client does.
//!
//! Invariants:
//! - Every connection has a generation; a request remembers the generation it was
//!   sent on. A failed connection is dropped, and every request still waiting on it
//!   is sent again in the order it was first sent (with its own base sequence when
//!   idempotent, so the broker drops what it already holds), before any new one.
//! - Against one broker nothing is followed: a failure ends the run, as before.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::Conn;
use crate::engine::net::client::ClientError;
use crate::engine::net::cluster_client::FOLLOW_TIMEOUT;
use crate::engine::net::tls::ClientTls;
use crate::format::wire::{parse_not_leader, ErrorCode};

/// Pause once a partition's attempts went round every node without an answer.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A produce request sent and not yet answered.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// The node (index into the worker's addresses) and connection generation it
    /// was sent on.
    pub lane: usize,
    pub generation: u64,
    pub id: u32,
    /// When it was first sent (its latency counts from there, resends included).
    pub sent: Instant,
    pub partition: u32,
    pub records: u64,
    /// Its base sequence (idempotent requests).
    pub sequence: i32,
}

/// What a failed request says about where to go next.
pub(super) enum Failure {
    /// Refused with this code and message.
    Refused(ErrorCode, String),
    /// Its connection failed.
    Lost(ClientError),
}

impl Failure {
    /// Whether following a leader can get past it.
    pub fn retryable(&self) -> bool {
        match self {
            Failure::Refused(code, _) => matches!(
                *code,
                ErrorCode::NOT_LEADER | ErrorCode::PARTITION_UNAVAILABLE | ErrorCode::SHUTTING_DOWN
            ),
            Failure::Lost(e) => e.is_lost_connection(),
        }
    }
}

/// Sends one pending request on a connection: the worker's topic, producer and
/// record value.
pub(super) struct Sender {
    pub topic: String,
    /// (producer id, epoch) of an idempotent run.
    pub producer: Option<(u64, u16)>,
    pub value: Arc<[u8]>,
}

impl Sender {
    async fn send(&self, conn: &mut Conn, p: &Pending) -> Result<u32, ClientError> {
        let batch = super::batch_of(p.partition, p.records, &self.value);
        match self.producer {
            Some(producer) => {
                conn.send_produce_idempotent(&self.topic, producer, p.sequence, batch)
                    .await
            }
            None => conn.send_produce(&self.topic, batch).await,
        }
    }
}

/// One worker's connections and routes.
pub(super) struct Lanes {
    addrs: Vec<String>,
    slots: Vec<Option<(Conn, u64)>>,
    /// Per partition, the index into `addrs` its requests go to.
    route: Vec<usize>,
    generation: u64,
    follow: bool,
    timeout: Duration,
    token: Option<String>,
    tls: Option<ClientTls>,
    /// Per partition, when its failures in a row began (`None`: its last answer
    /// was a success).
    failing_since: Vec<Option<Instant>>,
    /// Per partition, attempts since its last pause: a whole round of the nodes
    /// without an answer pauses (an election under way, or a named leader that is
    /// gone), so that no partition spins on refusals.
    attempts: Vec<usize>,
    /// Requests sent again after a failure.
    pub resent: u64,
}

/// How to connect (again).
pub(super) struct Dial {
    pub timeout: Duration,
    pub token: Option<String>,
    pub tls: Option<ClientTls>,
}

impl Lanes {
    /// `conns` are connected to `addrs` (in order); `route[p]` indexes `addrs`;
    /// `brokers`, the whole `--broker` list, is where a partition goes when its
    /// node fails (following only with two or more).
    pub fn new(
        mut addrs: Vec<String>,
        conns: Vec<Conn>,
        route: Vec<usize>,
        brokers: &[String],
        dial: Dial,
    ) -> Lanes {
        let follow = brokers.len() > 1;
        let route_len = route.len();
        if follow {
            for b in brokers {
                if !addrs.contains(b) {
                    addrs.push(b.clone());
                }
            }
        }
        let mut generation = 0;
        let mut slots: Vec<Option<(Conn, u64)>> = conns
            .into_iter()
            .map(|c| {
                generation += 1;
                Some((c, generation))
            })
            .collect();
        slots.resize_with(addrs.len(), || None);
        Lanes {
            addrs,
            slots,
            route,
            generation,
            follow,
            timeout: dial.timeout,
            token: dial.token,
            tls: dial.tls,
            failing_since: vec![None; route_len],
            attempts: vec![0; route_len],
            resent: 0,
        }
    }

    /// The first connection (the target's), if still up.
    pub fn first(&mut self) -> Option<&mut Conn> {
        self.slots.first_mut()?.as_mut().map(|(c, _)| c)
    }

    /// The address of node `lane`.
    pub fn addr(&self, lane: usize) -> &str {
        self.addrs.get(lane).map_or("", String::as_str)
    }

    /// The connection a request of `pending` waits on, if it is still the one it
    /// was sent on.
    pub fn conn_of(&mut self, pending: &Pending) -> Option<&mut Conn> {
        match self.slots.get_mut(pending.lane) {
            Some(Some((c, g))) if *g == pending.generation => Some(c),
            _ => None,
        }
    }

    /// `partition` answered: its failures in a row are over.
    pub fn answered(&mut self, partition: u32) {
        if let Some(f) = self.failing_since.get_mut(partition as usize) {
            *f = None;
        }
        if let Some(a) = self.attempts.get_mut(partition as usize) {
            *a = 0;
        }
    }

    /// Counts a failed attempt of `partition`; after a whole round of the nodes,
    /// pauses.
    async fn attempted(&mut self, partition: u32) {
        let round = self.addrs.len().max(1);
        let Some(a) = self.attempts.get_mut(partition as usize) else {
            return;
        };
        *a += 1;
        if *a >= round {
            *a = 0;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Whether a failure of a request of `partition` is followed: on a cluster, a
    /// retryable one, within [`FOLLOW_TIMEOUT`] of the partition's first failure in
    /// a row.
    pub fn follows(&mut self, failure: &Failure, partition: u32) -> bool {
        self.follows_if(failure.retryable(), partition)
    }

    fn follows_if(&mut self, retryable: bool, partition: u32) -> bool {
        if !self.follow || !retryable {
            return false;
        }
        self.failing_since
            .get_mut(partition as usize)
            .is_some_and(|f| f.get_or_insert_with(Instant::now).elapsed() < FOLLOW_TIMEOUT)
    }

    /// The node `partition`'s requests go to, connected (again) when needed; a
    /// node that cannot be reached moves the partition on to the next one (after
    /// a pause once every node was tried).
    pub async fn lane(&mut self, partition: u32) -> Result<(usize, u64), ClientError> {
        loop {
            let lane = self.route.get(partition as usize).copied().unwrap_or(0);
            if let Some(Some((_, g))) = self.slots.get(lane) {
                return Ok((lane, *g));
            }
            let addr = self.addr(lane).to_string();
            match Conn::connect(
                &addr,
                self.timeout,
                self.token.as_deref(),
                self.tls.as_ref(),
            )
            .await
            {
                Ok(c) => {
                    self.generation += 1;
                    if let Some(slot) = self.slots.get_mut(lane) {
                        *slot = Some((c, self.generation));
                    }
                    return Ok((lane, self.generation));
                }
                Err(e) => {
                    if !self.follows_if(e.is_lost_connection(), partition) {
                        return Err(e);
                    }
                    self.move_on(partition, lane);
                    self.attempted(partition).await;
                }
            }
        }
    }

    /// Sends the request of `p` (again) on its partition's connection, and returns it
    /// as now pending there. A send that fails drops that connection and moves on.
    pub async fn send(&mut self, mut p: Pending, sender: &Sender) -> Result<Pending, ClientError> {
        loop {
            let (lane, generation) = self.lane(p.partition).await?;
            let Some(Some((conn, _))) = self.slots.get_mut(lane) else {
                continue;
            };
            match sender.send(conn, &p).await {
                Ok(id) => {
                    p.lane = lane;
                    p.generation = generation;
                    p.id = id;
                    return Ok(p);
                }
                Err(e) => {
                    if !self.follows_if(e.is_lost_connection(), p.partition) {
                        return Err(e);
                    }
                    self.drop_lane(lane);
                    self.move_on(p.partition, lane);
                    self.attempted(p.partition).await;
                }
            }
        }
    }

    /// After `failed` (the oldest pending request) failed: its connection is
    /// dropped, its partition goes to the leader the refusal names (else the next
    /// node), and it and every other request waiting on that connection are sent
    /// again in their order.
    pub async fn recover(
        &mut self,
        failed: Pending,
        failure: &Failure,
        unanswered: &mut VecDeque<Pending>,
        sender: &Sender,
    ) -> Result<(), ClientError> {
        let stale = |q: &Pending| q.lane == failed.lane && q.generation == failed.generation;
        if self.conn_of(&failed).is_some() {
            self.drop_lane(failed.lane);
        }
        match failure {
            Failure::Refused(ErrorCode::NOT_LEADER, message) => match parse_not_leader(message) {
                Some((_, leader)) if leader != self.addr(failed.lane) => {
                    self.route_to(failed.partition, &leader);
                }
                // An election: the next node may know, or this one soon will.
                _ => self.move_on(failed.partition, failed.lane),
            },
            Failure::Refused(..) | Failure::Lost(_) => {
                self.move_on(failed.partition, failed.lane);
            }
        }
        self.attempted(failed.partition).await;
        let mut again = vec![failed];
        let mut kept = VecDeque::with_capacity(unanswered.len());
        for q in unanswered.drain(..) {
            if stale(&q) {
                again.push(q);
            } else {
                kept.push_back(q);
            }
        }
        *unanswered = kept;
        for q in again {
            self.resent += 1;
            let q = self.send(q, sender).await?;
            unanswered.push_back(q);
        }
        Ok(())
    }

    fn drop_lane(&mut self, lane: usize) {
        if let Some(slot) = self.slots.get_mut(lane) {
            *slot = None;
        }
    }

    /// Sends `partition` to the node after `from` in the list.
    fn move_on(&mut self, partition: u32, from: usize) {
        let next = (from + 1) % self.addrs.len().max(1);
        if let Some(r) = self.route.get_mut(partition as usize) {
            *r = next;
        }
    }

    /// Sends `partition` to `addr` (added to the nodes when new).
    fn route_to(&mut self, partition: u32, addr: &str) {
        let lane = match self.addrs.iter().position(|a| a == addr) {
            Some(i) => i,
            None => {
                self.addrs.push(addr.to_string());
                self.slots.push(None);
                self.addrs.len() - 1
            }
        };
        if let Some(r) = self.route.get_mut(partition as usize) {
            *r = lane;
        }
    }
}
