//! Offset commits under load: 100 members of one group on one broker, each
//! committing every 100 ms over its own connection; reports commits served per
//! second and the group-file fsyncs per second (shared by the commits that wait
//! together). Run with
//! cargo test --release --test bench -- --ignored --nocapture groups::

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use std::sync::atomic::AtomicBool;

use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::net::client::Client;
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::storage::io::RealStorage;

use crate::util::serve::PATIENCE;

const MEMBERS: usize = 100;
const SECONDS: u64 = 5;

#[test]
#[ignore = "benchmark"]
fn hundred_members_committing_every_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
    broker.create_topic("t", 100, Default::default()).unwrap();
    let server =
        Server::bind("127.0.0.1:0", Arc::clone(&broker), ServerOptions::default()).unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let never = Arc::new(AtomicBool::new(false));
    let serving = {
        let never = Arc::clone(&never);
        thread::spawn(move || server.run(&never))
    };
    // Every member joins first; the first join's leader syncs an empty assignment.
    let barrier = Arc::new(Barrier::new(MEMBERS));
    let started = Arc::new(Barrier::new(MEMBERS + 1));
    let workers: Vec<_> = (0..MEMBERS)
        .map(|i| {
            let addr = addr.clone();
            let barrier = Arc::clone(&barrier);
            let started = Arc::clone(&started);
            thread::spawn(move || {
                let mut c = Client::connect(&addr, PATIENCE).unwrap();
                barrier.wait();
                let (generation, member) = loop {
                    let j = c
                        .join_group(
                            "g",
                            "",
                            "bench",
                            Duration::from_secs(30),
                            Duration::from_secs(10),
                            "consumer",
                            &[("range", b"")],
                        )
                        .unwrap();
                    if c.sync_group(
                        "g",
                        j.generation,
                        &j.member_id,
                        &[],
                        Duration::from_secs(10),
                    )
                    .is_ok()
                    {
                        break (j.generation, j.member_id);
                    }
                };
                started.wait();
                let end = Instant::now() + Duration::from_secs(SECONDS);
                let mut commits = 0u64;
                let mut offset = 0u64;
                let mut generation = generation;
                let mut member = member;
                while Instant::now() < end {
                    offset += 1;
                    match c.commit_offsets("g", generation, &member, "t", &[(i as u32, offset, "")])
                    {
                        Ok(()) => commits += 1,
                        Err(_) => {
                            // Rebalanced meanwhile: rejoin.
                            let j = c
                                .join_group(
                                    "g",
                                    &member,
                                    "bench",
                                    Duration::from_secs(30),
                                    Duration::from_secs(10),
                                    "consumer",
                                    &[("range", b"")],
                                )
                                .unwrap();
                            let _ = c.sync_group(
                                "g",
                                j.generation,
                                &j.member_id,
                                &[],
                                Duration::from_secs(10),
                            );
                            generation = j.generation;
                            member = j.member_id;
                        }
                    }
                    thread::sleep(Duration::from_millis(100));
                }
                commits
            })
        })
        .collect();
    started.wait();
    let before = broker.groups().stats();
    let t = Instant::now();
    let commits: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let secs = t.elapsed().as_secs_f64();
    let after = broker.groups().stats();
    let fsyncs = after.fsyncs - before.fsyncs;
    let files = after.file_writes - before.file_writes;
    println!(
        "groups bench: {MEMBERS} members, {commits} commits in {secs:.1}s = {:.0} commits/s; {files} group-file replaces, {fsyncs} fsyncs = {:.0} fsyncs/s",
        commits as f64 / secs,
        fsyncs as f64 / secs
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    serving.join().unwrap().unwrap();
}
