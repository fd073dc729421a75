//! TLS on the Raft connections between nodes (`serve --raft-tls-cert`,
//! `--raft-tls-key`, `--raft-tls-ca`): every node presents its certificate both when
//! it dials and when it accepts, and checks its peer's against the one CA the
//! cluster shares (mutual TLS). The handshake of [`super::network`] (hellos, cluster
//! id, secret proofs) then runs inside the TLS session, as does every call.
//!
//! Invariants:
//! - With TLS set up, a node neither serves nor dials a plaintext Raft connection:
//!   a plaintext dialer is refused with a plaintext `Refuse` frame that names the
//!   flags, and a TLS dialer meeting a node without TLS fails its handshake, said
//!   on stderr on both sides ([`TLS_FLAGS`] is in every such line).
//! - A certificate binds a node to its address: the dialer checks that the
//!   acceptor's certificate names the host of the Raft address `--peers` gives for
//!   it (a DNS name or an IP address), and the acceptor, once the dialer's hello says
//!   which node it is, checks that the dialer's certificate names the host of that
//!   node's address in `--peers` ([`check_dialer_name`]). So a certificate issued
//!   for one node's host cannot speak as a node on another host.
//! - A certificate may also bind a node id: a DNS subject alternative name
//!   `seglog-node-ID` ([`node_name`]) beside its host's. A node whose own certificate
//!   names its id requires every peer's to name the peer's id, on both sides
//!   ([`PeerTls::check_peer_node`]), so nodes sharing a host (and so a host name)
//!   cannot speak as each other. A node refuses at start a certificate that names
//!   another node's id.
//! - Every write on a connection is followed by a flush: a TLS session may hold a
//!   written record until flushed.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use rustls::pki_types::{CertificateDer, ServerName};

use crate::engine::net::tls::{load_certs, Accepted, ClientTls, ServerTls, TlsError};

/// What every refusal and failure about Raft TLS names (stderr lines carry it).
pub const TLS_FLAGS: &str = "--raft-tls-cert/--raft-tls-key/--raft-tls-ca";

/// The name (a DNS subject alternative name) that binds a certificate to node `id`.
pub fn node_name(id: u64) -> String {
    format!("seglog-node-{id}")
}

/// Whether `cert` names `name` (a DNS name or an IP address) as rustls checks a
/// server's name; a certificate that cannot be parsed names nothing.
fn names(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(name) = ServerName::try_from(name.to_string()) else {
        return false;
    };
    rustls::server::ParsedCertificate::try_from(cert)
        .is_ok_and(|parsed| rustls::client::verify_server_name(&parsed, &name).is_ok())
}

/// A node's TLS settings for its Raft connections, both sides.
#[derive(Clone, Debug)]
pub struct PeerTls {
    server: ServerTls,
    client: ClientTls,
    /// This node's certificate names its node id ([`node_name`]): peers' must too.
    node_bound: bool,
}

impl PeerTls {
    /// Loads node `node`'s certificate chain and key and the cluster's CA (PEM
    /// files). A certificate that names another node's id (of `others`, the other
    /// nodes of `--peers`) is refused.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        ca: &Path,
        node: u64,
        others: &[u64],
    ) -> Result<PeerTls, TlsError> {
        let server = ServerTls::from_pem_files(cert, key, Some(ca), false)?;
        let client = ClientTls::from_pem_files(ca, Some((cert, key)))?;
        let chain = load_certs("TLS certificate", cert)?;
        let names_node = |id: u64| chain.first().is_some_and(|c| names(c, &node_name(id)));
        let node_bound = names_node(node);
        if let Some(other) = others.iter().copied().find(|&o| o != node && names_node(o)) {
            return Err(TlsError::Unusable {
                what: "TLS certificate",
                path: cert.to_path_buf(),
                detail: format!(
                    "names {}, the id of node {other}{}: give each node a certificate of its \
                     own, naming {} for this node",
                    node_name(other),
                    if node_bound {
                        ", besides this node's"
                    } else {
                        ""
                    },
                    node_name(node)
                ),
            });
        }
        Ok(PeerTls {
            server,
            client,
            node_bound,
        })
    }

    /// Whether this node's certificate names its node id (then every peer's must).
    pub fn node_bound(&self) -> bool {
        self.node_bound
    }

    /// With a node-bound certificate of this node's, checks that the certificate
    /// the peer on `conn` presented (either side) names `node`'s id, the node its
    /// hello claims to be or `--peers` dials. Without, or on a plain connection,
    /// nothing is checked.
    pub fn check_peer_node(&self, conn: &PeerConn, node: u64) -> Result<(), String> {
        if !self.node_bound {
            return Ok(());
        }
        let certs = match conn {
            PeerConn::Plain(_) => return Ok(()),
            PeerConn::Dialled(s) => s.get_ref().1.peer_certificates(),
            PeerConn::Accepted(s) => s.get_ref().1.peer_certificates(),
        };
        let name = node_name(node);
        if certs
            .and_then(<[_]>::first)
            .is_some_and(|c| names(c, &name))
        {
            return Ok(());
        }
        Err(format!(
            "node {node}'s TLS certificate does not name {name}, its node id, and this \
             node's names its own ({TLS_FLAGS}: give every node a certificate naming \
             seglog-node-ID for its id, or none of them)"
        ))
    }

    /// Wraps a dialled connection to `addr` and completes the handshake within
    /// `timeout`; `Err` says why, naming [`TLS_FLAGS`] when TLS itself failed.
    pub async fn dial(
        &self,
        addr: &str,
        tcp: TcpStream,
        timeout: Duration,
    ) -> Result<PeerConn, String> {
        match tokio::time::timeout(timeout, self.client.wrap_async(addr, tcp)).await {
            Ok(Ok(s)) => Ok(PeerConn::Dialled(Box::new(s))),
            // TLS refused (said on stderr), or the connection ended (only logged: a
            // node stopping does that too).
            Ok(Err(e)) if is_tls_failure(&e) => Err(format!(
                "the TLS handshake with {addr} failed: {} ({TLS_FLAGS}: does that node run \
                 with them, with a certificate for {addr} that the same CA signed?)",
                tls_text(&e)
            )),
            Ok(Err(e)) => Err(format!("the TLS handshake with {addr} failed: {e}")),
            Err(_) => Err(format!("the TLS handshake with {addr} timed out")),
        }
    }

    /// Completes the acceptor's handshake of an accepted connection within `timeout`.
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> Accepted {
        self.server.accept(tcp, timeout).await
    }
}

/// Checks that the certificate the dialer of an accepted TLS connection presented
/// names the host of `raft_addr`, node `node`'s Raft address in `--peers` (the
/// node its hello claims to be). A plain connection has no certificate to check.
pub fn check_dialer_name(conn: &PeerConn, node: u64, raft_addr: &str) -> Result<(), String> {
    let PeerConn::Accepted(s) = conn else {
        return Ok(());
    };
    let name = ClientTls::server_name(raft_addr).map_err(|e| e.to_string())?;
    let host = name.to_str();
    let refused = |why: &str| {
        format!(
            "node {node}'s TLS certificate {why} {host}, the host of its address in \
             --peers ({TLS_FLAGS}: give each node a certificate naming its own host)"
        )
    };
    let Some(cert) = s.get_ref().1.peer_certificates().and_then(<[_]>::first) else {
        return Err(refused("is missing: it cannot name"));
    };
    let parsed = rustls::server::ParsedCertificate::try_from(cert)
        .map_err(|e| refused(&format!("cannot be read ({e}) to check that it names")))?;
    rustls::client::verify_server_name(&parsed, &name).map_err(|_| refused("does not name"))
}

/// An I/O error's text, with rustls's own error when it carries one.
pub fn tls_text(e: &io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(t) => format!("TLS: {t}"),
        None => e.to_string(),
    }
}

/// Whether an I/O error is a TLS failure (a refused certificate, an alert).
pub fn is_tls_failure(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(<dyn std::error::Error + Send + Sync>::is::<rustls::Error>)
}

/// One Raft connection: plain TCP, or TLS over it on either side.
pub enum PeerConn {
    Plain(TcpStream),
    Dialled(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Accepted(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// The reading half of a [`PeerConn`].
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a [`PeerConn`].
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

impl PeerConn {
    /// Splits the connection for a reader and a writer task (plain TCP without a
    /// lock between them).
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            PeerConn::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            tls => {
                let (r, w) = tokio::io::split(tls);
                (Box::new(r), Box::new(w))
            }
        }
    }
}

impl AsyncRead for PeerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerConn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerConn::Dialled(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            PeerConn::Accepted(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerConn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerConn::Dialled(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            PeerConn::Accepted(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerConn::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerConn::Dialled(s) => Pin::new(s.as_mut()).poll_flush(cx),
            PeerConn::Accepted(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerConn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerConn::Dialled(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            PeerConn::Accepted(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
