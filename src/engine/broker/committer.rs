//! The committer: one thread per node that runs the group commits event-loop
//! leaders hand it ([`super::CommitLead::commit_off_loop`]), so the loop goes on
//! reading and appending the next requests while a commit's fsync runs: two batches
//! of a partition in flight, the one being synced and the one being written.
//!
//! Invariants:
//! - A job is one [`PartitionLog::wait_durable_quiet`]: the thread never waits for
//!   the event loop, so a loop thread may block on a partition's commit (the
//!   one-connection path) without a deadlock.
//! - The thread's publish does not wake the partition's async waiters; the leader
//!   does, once, on its loop ([`PartitionLog::wake_waiters`]), so a commit costs the
//!   loop one wake-up, not one per waiting task. A leader that went away before its
//!   answer could be sent leaves that wake to this thread.
//! - Jobs are taken in order; the thread sleeps only with an empty queue, so under
//!   load a submit needs no wake-up (it is queued while the previous fsync runs).
//! - The thread starts with the first job and ends at [`Committer::stop`] after
//!   running every job queued before; a job submitted after the stop is refused and
//!   the leader commits on its own thread.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;

use tokio::sync::oneshot;

use super::*;

/// A group commit for the committer: make every offset of `log` below `target`
/// durable, then answer on `done`.
#[derive(Debug)]
pub(super) struct CommitJob {
    pub(super) log: Arc<PartitionLog>,
    pub(super) target: u64,
    pub(super) done: oneshot::Sender<Result<(), EngineError>>,
}

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<CommitJob>,
    /// The thread waits on the condition variable.
    idle: bool,
    stop: bool,
    thread: Option<JoinHandle<()>>,
}

/// The commit thread and its queue.
#[derive(Debug, Default)]
pub(super) struct Committer {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Group commits claimed on the node and not yet ended ([`LeadCount`]).
    leads: Arc<AtomicUsize>,
}

/// One claimed group commit in [`Committer::leads`], from the claim until the commit
/// ends (dropped with its [`super::CommitLead`]).
#[derive(Debug)]
pub(super) struct LeadCount(Arc<AtomicUsize>);

impl Drop for LeadCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Committer {
    /// Counts a claimed commit until the returned guard is dropped.
    pub(super) fn count_lead(&self) -> LeadCount {
        self.leads.fetch_add(1, Ordering::AcqRel);
        LeadCount(Arc::clone(&self.leads))
    }

    /// Group commits claimed on the node and not yet ended.
    pub(super) fn leads(&self) -> usize {
        self.leads.load(Ordering::Acquire)
    }

    /// Queues `job`, starting the thread with the first one. Gives the job back
    /// when the committer is stopped or its thread cannot start.
    pub(super) fn submit(self: &Arc<Self>, job: CommitJob) -> Result<(), CommitJob> {
        let mut q = lock(&self.queue);
        if q.stop {
            return Err(job);
        }
        if q.thread.is_none() {
            let me = Arc::clone(self);
            match std::thread::Builder::new()
                .name("seglog-committer".into())
                .spawn(move || me.run())
            {
                Ok(handle) => q.thread = Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the commit thread");
                    return Err(job);
                }
            }
        }
        q.jobs.push_back(job);
        if q.idle {
            q.idle = false;
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Runs the jobs queued so far, then ends the thread (waits for it).
    pub(super) fn stop(&self) {
        let handle = {
            let mut q = lock(&self.queue);
            q.stop = true;
            self.wake.notify_one();
            q.thread.take()
        };
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    fn next(&self) -> Option<CommitJob> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                return Some(job);
            }
            if q.stop {
                return None;
            }
            q.idle = true;
            q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
            q.idle = false;
        }
    }

    fn run(&self) {
        while let Some(job) = self.next() {
            let result = job.log.wait_durable_quiet(job.target);
            if job.done.send(result).is_err() {
                // The leader is gone: nobody on its loop will wake the followers.
                job.log.wake_waiters();
            }
        }
    }
}

/// A leader's wait for its job's answer. Dropped before the answer was taken (the
/// request's task ended), it wakes the followers if the answer already came, or
/// leaves that to the committer, whose send then fails.
#[derive(Debug)]
pub(super) struct CommitAnswer {
    pub(super) rx: oneshot::Receiver<Result<(), EngineError>>,
    pub(super) log: Arc<PartitionLog>,
}

impl CommitAnswer {
    /// The job's result; the followers are woken before it returns.
    pub(super) async fn wait(mut self) -> Result<(), EngineError> {
        let result = (&mut self.rx)
            .await
            .unwrap_or(Err(EngineError::ShuttingDown));
        self.log.wake_waiters();
        result
    }
}

impl Drop for CommitAnswer {
    fn drop(&mut self) {
        // After `close` a send fails, so exactly one side wakes: this one when the
        // answer is here and was not taken, else the committer.
        self.rx.close();
        if self.rx.try_recv().is_ok() {
            self.log.wake_waiters();
        }
    }
}
