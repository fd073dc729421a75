//! A fault-injecting TCP proxy on 127.0.0.1 for one link (one direction of traffic
//! between two processes: the connections one side opens to the other). Threads, no
//! privileges. Modes:
//! - [`Mode::Pass`]: bytes go through both ways;
//! - [`Mode::Drop`]: connections are accepted but black-holed: nothing is forwarded,
//!   in either direction, on new or existing connections (the bytes read wait in the
//!   proxy, and once its buffers are full the sender stalls, as behind a dead switch);
//! - [`Mode::Cut`]: every current connection is closed and new ones are closed as soon
//!   as they are accepted, before any byte;
//!
//! and [`Proxy::heal`] goes back to `Pass` (stalled bytes are then delivered in order:
//! TCP never loses bytes in the middle of a stream, it stalls or closes).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Drop,
    Cut,
}

struct State {
    mode: Mode,
    stopped: bool,
    /// Both sockets of every open connection, by id, to close them on a cut.
    conns: HashMap<u64, Vec<TcpStream>>,
    next_id: u64,
    accepted: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    target: String,
    /// Bytes watched for in the traffic, and whether they went through.
    watch: Mutex<(Vec<u8>, bool)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits while the link drops traffic; true if bytes may go through now.
    fn wait_pass(&self) -> bool {
        let mut s = self.lock();
        while s.mode == Mode::Drop && !s.stopped {
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.mode == Mode::Pass && !s.stopped
    }

    /// Closes every open connection (the pipe threads then end).
    fn close_all(state: &mut State) {
        for (_, socks) in state.conns.drain() {
            for s in socks {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// One link: listens on `addr`, forwards to the target.
pub struct Proxy {
    /// Where to connect instead of the target.
    pub addr: String,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy to `target` on a free port of 127.0.0.1, in [`Mode::Pass`].
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Pass,
                stopped: false,
                conns: HashMap::new(),
                next_id: 0,
                accepted: 0,
            }),
            changed: Condvar::new(),
            target: target.to_string(),
            watch: Mutex::new((Vec::new(), false)),
        });
        let s = Arc::clone(&shared);
        thread::spawn(move || accept_loop(&listener, &s));
        Proxy { addr, shared }
    }

    /// Watches the traffic of both directions for `needle` from now on
    /// ([`Proxy::saw`]).
    pub fn watch_for(&self, needle: &[u8]) {
        *self.shared.watch.lock().unwrap() = (needle.to_vec(), false);
    }

    /// Whether the bytes of [`Proxy::watch_for`] went through the link since.
    pub fn saw(&self) -> bool {
        self.shared.watch.lock().unwrap().1
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.lock().mode
    }

    /// Switches the mode; a cut closes every open connection at once.
    pub fn set(&self, mode: Mode) {
        let mut s = self.shared.lock();
        s.mode = mode;
        if mode == Mode::Cut {
            Shared::close_all(&mut s);
        }
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Black-holes the link.
    pub fn drop_traffic(&self) {
        self.set(Mode::Drop);
    }

    /// Closes all connections and refuses new ones.
    pub fn cut(&self) {
        self.set(Mode::Cut);
    }

    /// Back to passing traffic.
    pub fn heal(&self) {
        self.set(Mode::Pass);
    }

    /// Connections accepted so far (refused ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.lock().accepted
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.lock().conns.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.stopped = true;
        Shared::close_all(&mut s);
        drop(s);
        self.shared.changed.notify_all();
        // Wakes the accept loop so that it sees `stopped` and ends.
        let _ = TcpStream::connect(&self.addr);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let mut s = shared.lock();
        if s.stopped {
            return;
        }
        s.accepted += 1;
        if s.mode == Mode::Cut {
            drop(s);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let id = s.next_id;
        s.next_id += 1;
        if let Ok(c) = client.try_clone() {
            s.conns.insert(id, vec![c]);
        }
        drop(s);
        let sh = Arc::clone(shared);
        thread::spawn(move || connection(&sh, id, client));
    }
}

/// One proxied connection: waits out a drop before connecting to the target, then
/// pipes both ways until either side closes or the link is cut.
fn connection(shared: &Arc<Shared>, id: u64, client: TcpStream) {
    let finish = |shared: &Shared| {
        if let Some(socks) = shared.lock().conns.remove(&id) {
            for s in socks {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    };
    if !shared.wait_pass() {
        finish(shared);
        return;
    }
    let Ok(upstream) = TcpStream::connect(&shared.target) else {
        finish(shared);
        return;
    };
    {
        let mut s = shared.lock();
        // A cut between the accept and here removed the entry: close and end.
        let Some(socks) = s.conns.get_mut(&id) else {
            drop(s);
            let _ = upstream.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        if let Ok(u) = upstream.try_clone() {
            socks.push(u);
        }
    }
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
        finish(shared);
        return;
    };
    let sh = Arc::clone(shared);
    let back = thread::spawn(move || pipe(&sh, upstream2, client2));
    pipe(shared, client, upstream);
    let _ = back.join();
    finish(shared);
}

/// Copies `from` to `to`, holding each chunk while the link drops traffic; on the end
/// of either side closes both, so the other direction ends too.
fn pipe(shared: &Shared, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    // The end of the last chunk, so that watched bytes split across two are seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.wait_pass() {
            break;
        }
        {
            let mut w = shared.watch.lock().unwrap();
            if !w.0.is_empty() {
                tail.extend_from_slice(&buf[..n]);
                if tail.windows(w.0.len()).any(|x| x == w.0.as_slice()) {
                    w.1 = true;
                }
                let keep = w.0.len().saturating_sub(1).min(tail.len());
                tail.drain(..tail.len() - keep);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
