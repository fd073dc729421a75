//! Ports for processes the tests start on a fixed address (a cluster node keeps its
//! client and Raft ports across restarts, and its peers are told them before it
//! starts).
//!
//! A port found by binding port 0 comes from the kernel's ephemeral range, the same
//! range every outgoing connection takes its local port from: between "bound and
//! released" and the node's own bind, a connection of another test in the same run
//! can take it ("Address already in use"). So the ports here come from below that
//! range (or above it, if nothing is free below), where the kernel never hands out a
//! port on its own; a counter keeps the tests of one process from picking the same
//! port twice, and each candidate is checked with a bind before it is handed out.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The kernel's ephemeral range, from procfs; Linux's default if it cannot be read.
fn ephemeral() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// Where the ports are taken from: below the ephemeral range when there is room
/// there (above 10000, clear of well-known services), otherwise above it.
fn pool() -> &'static Range<u32> {
    static POOL: OnceLock<Range<u32>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (lo, hi) = ephemeral();
        if lo >= 12000 {
            10000..u32::from(lo)
        } else if hi <= 63000 {
            u32::from(hi) + 1..65536
        } else {
            // The whole space is ephemeral: nothing better than asking the kernel.
            0..0
        }
    })
}

/// A port on 127.0.0.1 that nothing listens on now and that no outgoing connection
/// will take in the meantime.
pub fn free_port() -> u16 {
    let pool = pool();
    let span = pool.end - pool.start;
    if span == 0 {
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
    }
    // Start each process at a different place, so two test binaries run at once (or a
    // port left in use by a crashed run) rarely meet.
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(7919) % span));
    for _ in 0..span {
        let port = (pool.start + next.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {pool:?}");
}
