//! TLS for the listeners and the clients, with rustls (ring as the crypto provider;
//! no OpenSSL). The server side: [`ServerTls`] loads a PEM certificate chain and key
//! (and optionally a client CA, to require client certificates) and
//! [`ServerTls::accept`] turns an accepted TCP connection into a [`Stream`], telling a
//! TLS ClientHello (first byte 0x16, a TLS handshake record) from a plaintext frame.
//! The client side: [`ClientTls`] loads the CA to trust (and optionally a client
//! certificate) and wraps a blocking or a tokio TCP stream.
//!
//! Invariants:
//! - While TLS is configured, a plaintext connection is served only when
//!   `allow_plaintext` is set; otherwise [`Accepted::Plaintext`] hands it back to the
//!   caller, which answers in its own protocol and closes.
//! - A native-protocol frame never starts with 0x16: its first byte is the high byte
//!   of `frame_len`, and 0x16 << 24 is far over [`FRAME_BYTES_MAX`], so the first byte
//!   decides without ambiguity.
//! - The TLS handshake is bounded by the caller's timeout, so a peer that opens a
//!   connection and stalls holds it no longer than any other stalled read.
//!
//! [`FRAME_BYTES_MAX`]: crate::format::wire::FRAME_BYTES_MAX

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The first byte of a TLS record carrying a handshake message (a ClientHello).
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

// A plaintext frame cannot be mistaken for a ClientHello.
const _: () = assert!(((TLS_HANDSHAKE_BYTE as u32) << 24) > crate::format::wire::FRAME_BYTES_MAX);

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what} {} holds no PEM {expected}", path.display())]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("invalid {what}: {source}")]
    Config {
        what: &'static str,
        source: rustls::Error,
    },
    #[error("invalid client CA: {0}")]
    ClientCa(String),
    #[error("cannot tell the host name from the broker address {0:?}")]
    ServerName(String),
    /// A certificate that cannot serve as this node's (it names another node).
    #[error("{} {}: {detail}", what, path.display())]
    Unusable {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
}

impl TlsError {
    /// True when a PEM file could not be read at all (missing, unreadable), as
    /// opposed to read and found unusable.
    pub fn is_unreadable_file(&self) -> bool {
        matches!(
            self,
            TlsError::Read {
                source: rustls::pki_types::pem::Error::Io(_),
                ..
            }
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|source| TlsError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "certificate",
        });
    }
    Ok(certs)
}

fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "private key",
        },
        source => TlsError::Read {
            what,
            path: path.to_path_buf(),
            source,
        },
    })
}

fn roots(what: &'static str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for cert in load_certs(what, path)? {
        store
            .add(cert)
            .map_err(|source| TlsError::Config { what, source })?;
    }
    Ok(store)
}

/// A listener's TLS settings.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    allow_plaintext: bool,
    client_auth: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("allow_plaintext", &self.allow_plaintext)
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

/// What [`ServerTls::accept`] made of a connection.
pub enum Accepted {
    /// Serve it (TLS, or plaintext where allowed).
    Stream(Stream),
    /// A plaintext connection where TLS is required: answer it and close.
    Plaintext(TcpStream),
    /// The peer closed or stalled before its first byte, or the TLS handshake failed.
    Failed(io::Error),
}

impl ServerTls {
    /// Loads the certificate chain and key (PEM), and `client_ca` to require and
    /// verify client certificates.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        allow_plaintext: bool,
    ) -> Result<ServerTls, TlsError> {
        let certs = load_certs("TLS certificate", cert)?;
        let key = load_key("TLS key", key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Config {
                what: "TLS protocol versions",
                source,
            })?;
        let builder = match client_ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots("client CA", ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(certs, key)
            .map_err(|source| TlsError::Config {
                what: "TLS certificate or key",
                source,
            })?;
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            allow_plaintext,
            client_auth: client_ca.is_some(),
        })
    }

    /// True when plaintext connections are served too.
    pub fn allows_plaintext(&self) -> bool {
        self.allow_plaintext
    }

    /// True when clients must present a certificate the client CA signed.
    pub fn requires_client_certs(&self) -> bool {
        self.client_auth
    }

    /// Waits (at most `timeout`) for the peer's first byte; a ClientHello gets the
    /// TLS handshake (within `timeout` too), anything else is plaintext.
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> Accepted {
        let mut first = [0u8; 1];
        match tokio::time::timeout(timeout, tcp.peek(&mut first)).await {
            Ok(Ok(1..)) => {}
            Ok(Ok(_)) => return Accepted::Failed(io::ErrorKind::UnexpectedEof.into()),
            Ok(Err(e)) => return Accepted::Failed(e),
            Err(_) => return Accepted::Failed(io::ErrorKind::TimedOut.into()),
        }
        if first[0] != TLS_HANDSHAKE_BYTE {
            return if self.allow_plaintext {
                Accepted::Stream(Stream::Plain(tcp))
            } else {
                Accepted::Plaintext(tcp)
            };
        }
        match tokio::time::timeout(timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Accepted::Stream(Stream::Tls(Box::new(s))),
            Ok(Err(e)) => Accepted::Failed(e),
            Err(_) => Accepted::Failed(io::ErrorKind::TimedOut.into()),
        }
    }
}

/// A served connection: plain TCP or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// Writes without waiting, on plain TCP only (`None` over TLS, where a write goes
    /// through the session's buffer and a flush).
    pub fn try_write_plain(&self, buf: &[u8]) -> Option<io::Result<usize>> {
        match self {
            Stream::Plain(s) => Some(s.try_write(buf)),
            Stream::Tls(_) => None,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A client's TLS settings: the CA that signed the broker's certificate, and the
/// client's own certificate when the broker asks for one.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the certificates in `ca` (PEM); presents `client` (certificate chain,
    /// key) when given.
    pub fn from_pem_files(
        ca: &Path,
        client: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Config {
                what: "TLS protocol versions",
                source,
            })?
            .with_root_certificates(roots("TLS CA", ca)?);
        let config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    load_certs("client certificate", cert)?,
                    load_key("client key", key)?,
                )
                .map_err(|source| TlsError::Config {
                    what: "client certificate or key",
                    source,
                })?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls {
            config: Arc::new(config),
        })
    }

    /// The name the broker's certificate must carry: the host part of `addr`
    /// (`host:port`, `[v6]:port`), a DNS name or an IP address.
    pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName(addr.to_string()))
    }

    /// Wraps a blocking TCP stream and completes the handshake on it (within the
    /// stream's read and write timeouts).
    pub fn wrap_blocking(
        &self,
        addr: &str,
        mut tcp: std::net::TcpStream,
    ) -> Result<BlockingTls, io::Error> {
        let name = Self::server_name(addr).map_err(io::Error::other)?;
        let mut conn = rustls::ClientConnection::new(Arc::clone(&self.config), name)
            .map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        // A refused client certificate shows at the first read after a TLS 1.3
        // handshake; the caller's handshake request reads it.
        Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
    }

    /// Wraps a tokio TCP stream and completes the handshake on it.
    pub async fn wrap_async(
        &self,
        addr: &str,
        tcp: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, io::Error> {
        let name = Self::server_name(addr).map_err(io::Error::other)?;
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
            .connect(name, tcp)
            .await
    }
}

/// A blocking client's TLS stream.
pub type BlockingTls = Box<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert!(matches!(
            ClientTls::server_name("127.0.0.1:9494").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            ClientTls::server_name("[::1]:9494").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            ClientTls::server_name("localhost:1").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(ClientTls::server_name("bad name:1").is_err());
    }

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = ClientTls::from_pem_files(&empty, None).unwrap_err();
        assert!(e.to_string().contains("empty.pem"), "{e}");
        let e = ClientTls::from_pem_files(&dir.path().join("missing.pem"), None).unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
    }
}
