//! The fault-injecting proxy of the cluster tests ([`crate::util::proxy`]) against a
//! real echo server: pass, drop (stall), cut (close and refuse), heal.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use crate::util::proxy::{Mode, Proxy};

/// An echo server on a free port; returns its address.
fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn connect(addr: &str) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c
}

/// Sends `msg` and reads the echo back.
fn round_trip(c: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    c.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    c.read_exact(&mut got).unwrap();
    got
}

/// True if nothing arrives on `c` for a while (the connection stays open).
fn silent(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    let r = c.read(&mut b);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    matches!(r, Err(ref e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// True if the proxy closed `c` (end of stream or a reset).
fn closed(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    let _ = c.write_all(b"?");
    matches!(c.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn pass_forwards_both_ways() {
    let p = Proxy::start(&echo_server());
    let mut c = connect(&p.addr);
    assert_eq!(round_trip(&mut c, b"hello"), b"hello");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut c, &big), big);
    assert_eq!(p.accepted(), 1);
    assert_eq!(p.open_connections(), 1);
    drop(c);
}

#[test]
fn drop_stalls_old_and_new_connections_until_healed() {
    let p = Proxy::start(&echo_server());
    let mut old = connect(&p.addr);
    assert_eq!(round_trip(&mut old, b"a"), b"a");
    p.drop_traffic();
    assert_eq!(p.mode(), Mode::Drop);
    old.write_all(b"held").unwrap();
    assert!(
        silent(&mut old),
        "an existing connection got bytes while dropped"
    );
    let mut new = connect(&p.addr);
    new.write_all(b"new").unwrap();
    assert!(silent(&mut new), "a new connection got bytes while dropped");
    p.heal();
    // The stalled bytes arrive, in order, and both connections work again.
    let mut got = [0u8; 4];
    old.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"held");
    let mut got = [0u8; 3];
    new.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"new");
    assert_eq!(round_trip(&mut old, b"b"), b"b");
    assert_eq!(round_trip(&mut new, b"c"), b"c");
}

#[test]
fn cut_closes_connections_and_refuses_new_ones_until_healed() {
    let p = Proxy::start(&echo_server());
    let mut old = connect(&p.addr);
    assert_eq!(round_trip(&mut old, b"a"), b"a");
    p.cut();
    assert!(closed(&mut old), "an open connection survived the cut");
    let mut refused = connect(&p.addr);
    assert!(
        closed(&mut refused),
        "a new connection was served while cut"
    );
    assert_eq!(p.open_connections(), 0);
    p.heal();
    let mut again = connect(&p.addr);
    assert_eq!(round_trip(&mut again, b"back"), b"back");
    assert_eq!(p.accepted(), 3);
}

#[test]
fn cut_during_drop_closes_the_stalled_connections() {
    let p = Proxy::start(&echo_server());
    let mut c = connect(&p.addr);
    p.drop_traffic();
    let mut stalled = connect(&p.addr);
    c.write_all(b"x").unwrap();
    assert!(silent(&mut c));
    p.cut();
    assert!(closed(&mut c));
    assert!(closed(&mut stalled));
}

#[test]
fn links_are_independent() {
    let target = echo_server();
    let a = Proxy::start(&target);
    let b = Proxy::start(&target);
    a.cut();
    let mut cb = connect(&b.addr);
    assert_eq!(round_trip(&mut cb, b"still"), b"still");
    let mut ca = connect(&a.addr);
    assert!(closed(&mut ca));
}
