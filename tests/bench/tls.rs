//! Produce throughput over TLS and over plaintext, side by side in one run. Ignored
//! by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture tls::
//! ```
//!
//! One broker in this process (fsync before every acknowledgement) served by two
//! listeners: one plaintext, one TLS (a certificate from a CA made here, rcgen). 16
//! connections (blocking clients, a thread each) send requests of 1 or 100 records of
//! 256 bytes to one partition, for `SEGLOG_BENCH_SECS` seconds per run (default 3);
//! runs alternate (plain, tls, tls, plain, plain, tls), three each, and the ratio of
//! the mean records/s is printed. The goal: TLS at least 85 % of plaintext at batch
//! 100. This measures; it asserts only that every run worked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::load::{self, run_seconds, Load, CONNECTIONS};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::net::client::Client;
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::net::tls::{ClientTls, ServerTls};
use seglog::engine::storage::io::RealStorage;
use seglog::format::topic::TopicConfig;

const VALUE_BYTES: usize = 256;
const RUNS: usize = 3;

fn load(addr: &str, tls: Option<&ClientTls>, topic: &str, batch: usize, secs: u64) -> f64 {
    let (addr, tls) = (addr.to_string(), tls.cloned());
    let values = [vec![b'x'; VALUE_BYTES]];
    let shape = Load {
        topic,
        partitions: 1,
        batch,
        values: &values,
        secs,
    };
    load::produce(&shape, move || {
        Client::connect_with(&addr, Duration::from_secs(30), tls.as_ref(), None).unwrap()
    })
}

struct Listener {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<std::io::Result<()>>,
}

fn listen(broker: &Arc<Broker>, tls: Option<ServerTls>) -> Listener {
    let opts = ServerOptions {
        log_errors: false,
        tls,
        ..ServerOptions::default()
    };
    let server = Server::bind("127.0.0.1:0", Arc::clone(broker), opts).unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let thread = thread::spawn(move || server.run(&AtomicBool::new(false)));
    Listener { addr, stop, thread }
}

/// A CA and a certificate for 127.0.0.1 it signed, as PEM files in `dir`:
/// (certificate, key, CA).
fn certificates(dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let paths = [
        dir.join("broker.crt"),
        dir.join("broker.key"),
        dir.join("ca.pem"),
    ];
    std::fs::write(&paths[0], cert.pem()).unwrap();
    std::fs::write(&paths[1], key.serialize_pem()).unwrap();
    std::fs::write(&paths[2], ca_cert.pem()).unwrap();
    paths
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_over_tls_and_plaintext() {
    let secs = run_seconds();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pki = tempfile::tempdir().unwrap();
    let [cert, key, ca] = certificates(pki.path());
    let opts = BrokerOptions {
        flush_every_records: 1,
        ..BrokerOptions::default()
    };
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    let plain = listen(&broker, None);
    let tls = listen(
        &broker,
        Some(ServerTls::from_pem_files(&cert, &key, None, false).unwrap()),
    );
    let client_tls = ClientTls::from_pem_files(&ca, None).unwrap();
    println!();
    println!(
        "{CONNECTIONS} connections, 1 partition, {VALUE_BYTES}-byte values, {secs} s per run, {RUNS} runs each, alternating"
    );
    println!(
        "{:>5} | {:>14} {:>14} | {:>9}",
        "batch", "plain r/s", "tls r/s", "tls/plain"
    );
    for batch in [100usize, 1] {
        let topic = format!("b{batch}");
        broker
            .create_topic(&topic, 1, TopicConfig::default())
            .unwrap();
        let mut off = Vec::new();
        let mut on = Vec::new();
        for run in 0..2 * RUNS {
            // Order plain, tls, tls, plain, plain, tls: neither side always runs first.
            if (run % 4 == 0) || (run % 4 == 3) {
                off.push(load(&plain.addr, None, &topic, batch, secs));
            } else {
                on.push(load(&tls.addr, Some(&client_tls), &topic, batch, secs));
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (a, b) = (mean(&off), mean(&on));
        println!(
            "{batch:>5} | {a:>14.0} {b:>14.0} | {:>8.1}%   (runs: {off:.0?} vs {on:.0?})",
            100.0 * b / a
        );
        assert!(a > 0.0 && b > 0.0);
    }
    for l in [plain, tls] {
        l.stop.store(true, Ordering::SeqCst);
        let _ = l.thread.join();
    }
    broker.shutdown().unwrap();
}
