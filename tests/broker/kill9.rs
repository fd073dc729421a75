//! A kill -9 loop against the real binary on the real file system: producers stream
//! records into several partitions (small segments, so rolls happen; one producer
//! pipelines its requests, several in flight on its connection), the broker is
//! SIGKILLed at a random moment, restarted on the same directory, and every record
//! acknowledged so far must be read back at its offset with its value.
//!
//! A second loop runs with retention deleting segments as the producers go, so the
//! broker's spare pool fills and rolls take reused files (docs/FORMAT.md, Spares):
//! there, acknowledged records below a partition's start offset may have aged out.
//!
//! After every kill `verify` must find no torn tail and nothing corrupt: a kill -9
//! stops the process between system calls, and a reused file's old bytes are a stale
//! tail, not damage.
//!
//! `SEGLOG_KILL9_ITERATIONS` (default 100; 40 for the loop with reuse) and
//! `SEGLOG_SEED` change the run.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use seglog::engine::net::client::{read_frame, Client, ClientError};
use seglog::format::wire::{
    decode_response, encode_request, ErrorCode, PartitionBatch, Request, ResponseBody, WireRecord,
    PROTOCOL_VERSION,
};

use crate::util::rng::{seed_or, Rng};
use crate::util::serve::Serve;

const TOPIC: &str = "k9";
const PARTITIONS: u32 = 3;
/// Kills in a row on one data directory before a fresh one is taken.
const ROUNDS_PER_DIR: u64 = 20;

/// (partition, offset) -> value of every acknowledged record.
type Acks = Arc<Mutex<BTreeMap<(u32, u64), Vec<u8>>>>;

/// Produces until the broker goes away; records every acknowledged record.
fn producer(
    addr: String,
    iteration: u64,
    thread: u64,
    seed: u64,
    acks: Acks,
    stop: Arc<AtomicBool>,
) {
    let Ok(mut c) = Client::connect(&addr, Duration::from_secs(5)) else {
        return;
    };
    let mut rng = Rng::new(seed ^ (iteration << 20) ^ (thread << 8));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // One request: one or two partitions, 1..4 records each.
        let first = rng.below(u64::from(PARTITIONS)) as u32;
        let parts: Vec<u32> = if rng.below(3) == 0 {
            vec![first, (first + 1) % PARTITIONS]
        } else {
            vec![first]
        };
        let mut values: Vec<(u32, Vec<Vec<u8>>)> = Vec::new();
        for &p in &parts {
            let count = 1 + rng.below(4);
            let vs = (0..count)
                .map(|_| {
                    n += 1;
                    let pad = rng.below(200) as usize;
                    let mut v = format!("i{iteration}-t{thread}-n{n}-").into_bytes();
                    v.resize(v.len() + pad, b'x');
                    v
                })
                .collect();
            values.push((p, vs));
        }
        let batches = values
            .iter()
            .map(|(p, vs)| PartitionBatch {
                partition: *p,
                records: vs
                    .iter()
                    .map(|v| WireRecord {
                        timestamp_ms: 1,
                        key: None,
                        value: v,
                    })
                    .collect(),
            })
            .collect();
        let Ok(result) = c.produce(TOPIC, batches) else {
            return;
        };
        let mut a = acks.lock().unwrap();
        for (ack, (p, vs)) in result.iter().zip(&values) {
            if let Ok((base, last)) = ack.result {
                assert_eq!(last - base + 1, vs.len() as u64);
                for (i, v) in vs.iter().enumerate() {
                    let prev = a.insert((*p, base + i as u64), v.clone());
                    assert!(
                        prev.is_none(),
                        "offset {p}/{} acknowledged twice",
                        base + i as u64
                    );
                }
            }
        }
    }
}

/// Requests the pipelining producer sends ahead of the oldest one's answer.
const PIPELINED: usize = 4;

/// Records the pipelining producers had acknowledged, over every loop of the process.
static PIPELINED_ACKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Produces like [`producer`], one partition a request, but with [`PIPELINED`]
/// requests sent ahead of their answers (the broker appends them at once and
/// answers each, in order, once it is durable); records every acknowledged record.
fn pipelined_producer(addr: String, iteration: u64, seed: u64, acks: Acks, stop: Arc<AtomicBool>) {
    use std::collections::VecDeque;
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut out = Vec::new();
    let hello = Request::Handshake {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        token: None,
    };
    encode_request(&mut out, 1, &hello).unwrap();
    let mut frame = Vec::new();
    if s.write_all(&out).is_err() || read_frame(&mut s, &mut frame).is_err() {
        return;
    }
    let mut rng = Rng::new(seed ^ (iteration << 20) ^ 0xfeed);
    let (mut n, mut id) = (0u64, 1u32);
    // Sent and not yet answered: (request id, partition, values).
    let mut sent: VecDeque<(u32, u32, Vec<Vec<u8>>)> = VecDeque::new();
    loop {
        let go = !stop.load(Ordering::Relaxed);
        if go && sent.len() < PIPELINED {
            let partition = rng.below(u64::from(PARTITIONS)) as u32;
            let values: Vec<Vec<u8>> = (0..1 + rng.below(4))
                .map(|_| {
                    n += 1;
                    let mut v = format!("i{iteration}-p-n{n}-").into_bytes();
                    v.resize(v.len() + rng.below(200) as usize, b'y');
                    v
                })
                .collect();
            let records = values
                .iter()
                .map(|v| WireRecord {
                    timestamp_ms: 1,
                    key: None,
                    value: v,
                })
                .collect();
            let req = Request::Produce {
                topic: TOPIC,
                partitions: vec![PartitionBatch { partition, records }],
            };
            id += 1;
            out.clear();
            encode_request(&mut out, id, &req).unwrap();
            if s.write_all(&out).is_err() {
                return;
            }
            sent.push_back((id, partition, values));
            continue;
        }
        let Some((want, p, values)) = sent.pop_front() else {
            return;
        };
        if read_frame(&mut s, &mut frame).is_err() {
            return;
        }
        let resp = decode_response(&frame).unwrap();
        assert_eq!(resp.request_id, want, "answers come in request order");
        let Some(ResponseBody::Produce { partitions }) = resp.body else {
            continue;
        };
        let Some(ack) = partitions.first().filter(|a| a.code.is_ok()) else {
            continue;
        };
        assert_eq!(ack.last_offset - ack.base_offset + 1, values.len() as u64);
        PIPELINED_ACKS.fetch_add(values.len() as u64, Ordering::Relaxed);
        let mut a = acks.lock().unwrap();
        for (i, v) in values.into_iter().enumerate() {
            let at = ack.base_offset + i as u64;
            let prev = a.insert((p, at), v);
            assert!(prev.is_none(), "offset {p}/{at} acknowledged twice");
        }
    }
}

/// What a restarted broker holds: (partition, offset) -> value, read from each
/// partition's start, and the start offsets.
struct ReadBack {
    records: BTreeMap<(u32, u64), Vec<u8>>,
    starts: Vec<u64>,
}

impl ReadBack {
    fn get(&self, at: &(u32, u64)) -> Option<&Vec<u8>> {
        self.records.get(at)
    }

    /// Below the start offset: aged out by retention.
    fn aged_out(&self, at: &(u32, u64)) -> bool {
        self.starts
            .get(at.0 as usize)
            .is_some_and(|start| at.1 < *start)
    }
}

/// Reads every partition from its start; (partition, offset) -> value.
fn read_back(addr: &str) -> ReadBack {
    let mut c = Client::connect(addr, Duration::from_secs(5)).unwrap();
    let mut out = BTreeMap::new();
    let mut starts: Vec<u64> = c
        .list_offsets(TOPIC)
        .unwrap()
        .iter()
        .map(|p| p.start_offset)
        .collect();
    for p in 0..PARTITIONS {
        let mut offset = starts.get(p as usize).copied().unwrap_or(0);
        loop {
            let f = match c.fetch(TOPIC, p, offset, 1 << 20, Duration::ZERO) {
                Ok(f) => f,
                // Retention (every 20 ms with reuse on) removed the segment between the
                // start offsets and this read: what it held has aged out, read on from
                // the new start.
                Err(ClientError::Refused { code, .. })
                    if code == ErrorCode::OFFSET_OUT_OF_RANGE =>
                {
                    let start = c.list_offsets(TOPIC).unwrap()[p as usize].start_offset;
                    assert!(
                        start > offset,
                        "offset {offset} out of range below start {start}"
                    );
                    if let Some(s) = starts.get_mut(p as usize) {
                        *s = start;
                    }
                    offset = start;
                    continue;
                }
                Err(e) => panic!("fetch {TOPIC}/{p} at {offset}: {e}"),
            };
            let Some(last) = f.records.last() else { break };
            offset = last.offset + 1;
            for r in f.records {
                out.insert((p, r.offset), r.value);
            }
            if offset >= f.end_offset {
                break;
            }
        }
    }
    ReadBack {
        records: out,
        starts,
    }
}

#[test]
fn acknowledged_records_survive_repeated_kill_9() {
    kill9_loop(None, 100);
}

/// Retention by size, checked every 20 ms, keeps each partition near 6 KiB of 2 KiB
/// segments: deleted segments become spares (serve's default pool) and rolls reuse
/// them while the broker is killed at random moments.
#[test]
fn acknowledged_records_survive_repeated_kill_9_with_reused_segments() {
    let reuse = Reuse {
        serve_args: &["--retention-check-interval", "20ms"],
        topic: &[("retention_bytes", "6144"), ("retention_ms", "-1")],
    };
    kill9_loop(Some(&reuse), 40);
}

/// The loop with spares in use: serve flags and topic settings.
struct Reuse {
    serve_args: &'static [&'static str],
    topic: &'static [(&'static str, &'static str)],
}

fn kill9_loop(reuse: Option<&Reuse>, default_iterations: u64) {
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let seed = seed_or(clock);
    let iterations: u64 = std::env::var("SEGLOG_KILL9_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_iterations);
    println!("kill -9 loop: seed {seed} (SEGLOG_SEED reruns it), {iterations} iterations");
    let mut rng = Rng::new(seed);
    let mut dir = tempfile::tempdir().unwrap();
    let mut acks: Acks = Arc::default();
    let start = Instant::now();
    let mut verified_total = 0u64;
    let mut lost = Vec::new();
    let mut acked_total = 0;
    let mut aged_out = 0u64;
    let serve_args = reuse.map_or(&[][..], |r| r.serve_args);
    let mut settings = vec![("segment_bytes".to_string(), "2048".to_string())];
    for (k, v) in reuse.map_or(&[][..], |r| r.topic) {
        settings.push((k.to_string(), v.to_string()));
    }
    let mut spares_seen = 0;
    let mut spares_taken = 0;
    // What `verify` calls damage right after a kill: a kill -9 tears no write and
    // leaves no corruption, on a reused file neither (its old bytes are a stale
    // tail).
    let mut damage_after_kill = Vec::new();
    for it in 0..iterations {
        if it > 0 && it % ROUNDS_PER_DIR == 0 {
            // A fresh directory now and then keeps each start's fsyncs few.
            acked_total += final_check(
                dir.path(),
                serve_args,
                &acks,
                &mut verified_total,
                &mut lost,
            );
            dir = tempfile::tempdir().unwrap();
            acks = Arc::default();
        }
        let server = Serve::start_with(dir.path(), serve_args);
        let mut c = Client::connect(&server.addr, Duration::from_secs(5)).unwrap();
        if it % ROUNDS_PER_DIR == 0 {
            c.create_topic(TOPIC, PARTITIONS, &settings).unwrap();
        }
        spares_seen += std::fs::read_dir(dir.path().join("spares")).map_or(0, Iterator::count);
        // Everything acknowledged before the earlier kills is still there.
        let got = read_back(&server.addr);
        {
            let a = acks.lock().unwrap();
            for (at, v) in a.iter() {
                match got.get(at) {
                    Some(g) if g == v => verified_total += 1,
                    None if reuse.is_some() && got.aged_out(at) => aged_out += 1,
                    other => lost.push(format!(
                        "iteration {it}: {}/{} acknowledged as {:?}, read back {:?}",
                        at.0,
                        at.1,
                        String::from_utf8_lossy(v),
                        other.map(|g| String::from_utf8_lossy(g).into_owned())
                    )),
                }
            }
        }
        assert!(
            lost.is_empty(),
            "lost acknowledged records (seed {seed}): {lost:?}"
        );
        // Producers, then the kill at a random moment.
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<_> = (0..2)
            .map(|t| {
                let (addr, acks, stop) = (server.addr.clone(), acks.clone(), stop.clone());
                thread::spawn(move || producer(addr, it, t, seed, acks, stop))
            })
            .collect();
        let (addr, acks_p, stop_p) = (server.addr.clone(), acks.clone(), stop.clone());
        threads.push(thread::spawn(move || {
            pipelined_producer(addr, it, seed, acks_p, stop_p);
        }));
        thread::sleep(Duration::from_millis(10 + rng.below(150)));
        if reuse.is_some() {
            if let Ok(st) = c.stats() {
                spares_taken += st.write.map_or(0, |w| w.spares_taken);
            }
        }
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        damage_after_kill.extend(
            damage_reported(dir.path())
                .into_iter()
                .map(|p| format!("iteration {it}: {p}")),
        );
    }
    // A last start checks the acknowledgements of the last iteration.
    acked_total += final_check(
        dir.path(),
        serve_args,
        &acks,
        &mut verified_total,
        &mut lost,
    );
    println!(
        "kill -9 loop: {iterations} iterations, {acked_total} records acknowledged, {verified_total} acknowledgement checks passed, {aged_out} aged out, {spares_seen} spares seen at starts, {spares_taken} taken, {} lost, {:.1}s, seed {seed}",
        lost.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        lost.is_empty(),
        "lost acknowledged records (seed {seed}): {lost:?}"
    );
    assert!(
        damage_after_kill.is_empty(),
        "verify reported damage after a kill -9 (seed {seed}): {damage_after_kill:?}"
    );
    assert!(acked_total > 0, "no record was acknowledged at all");
    assert!(
        PIPELINED_ACKS.load(Ordering::Relaxed) > 0,
        "the pipelining producer never had a record acknowledged"
    );
    if reuse.is_some() {
        assert!(spares_seen > 0, "retention never filled the spare pool");
        assert!(spares_taken > 0, "no roll took a spare");
    }
}

/// The problems `verify` reports in `dir` that a kill -9 must never leave: a torn
/// tail (the process dies between system calls, never inside a write) and anything
/// corrupt. Legal crash states (zero and stale tails, a retention's leftover index,
/// a roll that never became durable) are not among them.
fn damage_reported(dir: &Path) -> Vec<String> {
    let data = dir.to_str().unwrap();
    let (_, out, err) = crate::util::bin::run(&["verify", "--json", data], dir);
    let report: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("verify --json of {data}: {e}: {out}{err}"));
    // The directory's and partitions' problems, then each segment's.
    let segments = report["segments"].as_array().cloned().unwrap_or_default();
    let problems: Vec<serde_json::Value> = std::iter::once(&report)
        .chain(segments.iter())
        .flat_map(|r| r["problems"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(
        report["problems"].is_array(),
        "verify --json of {data}: {out}"
    );
    problems
        .into_iter()
        .filter(|p| p["kind"] == "torn_tail" || p["severity"] == "corrupt")
        .map(|p| p.to_string())
        .collect()
}

/// Starts the broker once more and checks every acknowledgement; returns how many.
fn final_check(
    dir: &Path,
    serve_args: &[&str],
    acks: &Acks,
    verified: &mut u64,
    lost: &mut Vec<String>,
) -> u64 {
    let server = Serve::start_with(dir, serve_args);
    let got = read_back(&server.addr);
    let a = acks.lock().unwrap();
    let aging = !serve_args.is_empty();
    for (at, v) in a.iter() {
        if got.get(at) == Some(v) {
            *verified += 1;
        } else if aging && got.get(at).is_none() && got.aged_out(at) {
            // Retention took it.
        } else {
            lost.push(format!("{}: {}/{} lost", dir.display(), at.0, at.1));
        }
    }
    a.len() as u64
}
