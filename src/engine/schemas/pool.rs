//! The node's schema checkers: long-lived threads that check the values of produce
//! requests while the event loop that received them serves other connections.
//!
//! Why: a listener is one event-loop thread, so a check made there adds to every
//! request's time on that thread; at batch 100 with 256-byte values the check costs
//! about as much as the rest of the request. Handed to a checker, it runs on another
//! core beside the loop. The threads live as long as the registry, so a hand-off is
//! one queue push, one wake-up of a sleeping checker (none while it is busy) and one
//! of the loop when the answer is ready. tokio's blocking pool, used before, cost
//! more per request than it freed.
//!
//! Invariants:
//! - Every part submitted gets its answer ([`Pending::answer`]): from its checker,
//!   or, when no checker took it (none started, or all gone) or its checker panicked
//!   in the schema crate, from the caller, which then checks the values itself.
//! - `queued` counts the parts submitted and not yet checked; the caller checks on
//!   its own thread while it is at least the number of checkers ([`CheckPool::busy`]).
//! - Parts are taken in submission order and answered in any order; the caller
//!   reports the first failure in request order.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Compiled, SchemaError};

/// The values of one request, or of one part of it, copied out of the request: one
/// buffer, and per value (partition, index in its batch, range in the buffer).
#[derive(Debug, Default)]
pub(super) struct Values {
    pub bytes: Vec<u8>,
    pub spans: Vec<(u32, u64, std::ops::Range<usize>)>,
}

type Answer = tokio::sync::oneshot::Sender<Result<(), SchemaError>>;

struct Job {
    compiled: Arc<Compiled>,
    values: Arc<Values>,
    /// The part of `values.spans` this job checks.
    part: std::ops::Range<usize>,
    answer: Answer,
}

/// The checker threads of one registry; they end when it is dropped.
#[derive(Debug)]
pub(super) struct CheckPool {
    jobs: Mutex<Option<Sender<Job>>>,
    threads: usize,
    /// Parts submitted and not yet checked.
    queued: Arc<AtomicUsize>,
}

impl CheckPool {
    /// Starts one checker per core but one (the event loop's), at least one and at
    /// most 8.
    pub fn start() -> CheckPool {
        CheckPool::with_threads(
            std::thread::available_parallelism()
                .map_or(1, std::num::NonZero::get)
                .saturating_sub(1)
                .clamp(1, 8),
        )
    }

    /// Starts `want` checkers (none: every part is checked by its caller).
    pub fn with_threads(want: usize) -> CheckPool {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        let mut threads = 0;
        for i in 0..want {
            let (rx, queued) = (Arc::clone(&rx), Arc::clone(&queued));
            let started = std::thread::Builder::new()
                .name(format!("seglog-schemas-{i}"))
                .spawn(move || serve(&rx, &queued));
            match started {
                Ok(_) => threads += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a schema checker thread; checking on the event loop");
                    break;
                }
            }
        }
        CheckPool {
            jobs: Mutex::new((threads > 0).then_some(tx)),
            threads,
            queued,
        }
    }

    /// Whether every checker has a job already.
    pub fn busy(&self) -> bool {
        self.queued.load(Ordering::Relaxed) >= self.threads
    }

    /// How many parts a request is best split into.
    pub fn threads(&self) -> usize {
        self.threads.max(1)
    }

    /// Hands `values.spans[part]` to a checker; [`Pending::answer`] waits for its
    /// answer. Submitting every part before waiting for any lets them run side by side.
    pub fn submit(
        &self,
        compiled: &Arc<Compiled>,
        values: &Arc<Values>,
        part: std::ops::Range<usize>,
    ) -> Pending {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = Job {
            compiled: Arc::clone(compiled),
            values: Arc::clone(values),
            part: part.clone(),
            answer,
        };
        let sent = {
            let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            self.queued.fetch_add(1, Ordering::Relaxed);
            let sent = jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok());
            if !sent {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            sent
        };
        Pending {
            compiled: Arc::clone(compiled),
            values: Arc::clone(values),
            part,
            answered: sent.then_some(answered),
        }
    }
}

/// A part handed to a checker, or kept when none took it.
pub(super) struct Pending {
    compiled: Arc<Compiled>,
    values: Arc<Values>,
    part: std::ops::Range<usize>,
    answered: Option<tokio::sync::oneshot::Receiver<Result<(), SchemaError>>>,
}

impl Pending {
    /// The part's answer, waited for without holding the calling thread.
    pub async fn answer(self) -> Result<(), SchemaError> {
        if let Some(answered) = self.answered {
            if let Ok(r) = answered.await {
                return r;
            }
        }
        // No checker took the part, or its checker ended without answering (a panic
        // in the schema crate): check it here.
        self.compiled
            .check_spans(&self.values.bytes, &self.values.spans[self.part])
    }
}

impl Drop for CheckPool {
    fn drop(&mut self) {
        // Closing the queue ends each checker once it has answered what it holds.
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// A checker: answers jobs until the queue is closed.
fn serve(jobs: &Mutex<Receiver<Job>>, queued: &AtomicUsize) {
    loop {
        let job = {
            let rx = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let checked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            job.compiled
                .check_spans(&job.values.bytes, &job.values.spans[job.part.clone()])
        }));
        queued.fetch_sub(1, Ordering::Relaxed);
        // Dropped unanswered after a panic: the caller checks the part itself. The
        // caller may also have gone (its connection closed): nothing to tell.
        if let Ok(r) = checked {
            let _ = job.answer.send(r);
        }
    }
}
