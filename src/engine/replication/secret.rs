//! The cluster secret (`serve --cluster-secret-file`): the key of the MACs with
//! which two nodes prove to each other, on each Raft connection, that they hold it
//! (the handshake of [`crate::format::wire::raft`]).
//!
//! Invariants:
//! - The file's length is checked ([`SECRET_BYTES_MAX`]) before it is read; trailing
//!   white space (a final newline) is not part of the secret, and what is left has at
//!   least [`SECRET_BYTES_MIN`] bytes.
//! - A proof is HMAC-SHA256 over a label naming the side that proves (dialer or
//!   acceptor) and the peer protocol's version, then both node ids and both nonces.
//!   Fresh nonces on both sides keep a proof from being replayed on another
//!   connection, the labels keep the acceptor's proof from being sent back as the
//!   dialer's, and the ids keep a proof from being relayed between other nodes.
//! - Proofs are checked in constant time (`ring::hmac::verify`).
//! - The secret never reaches a log, an error message or `Debug` output.

use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use ring::hmac;

use crate::format::wire::raft::{NONCE_LEN, PEER_VERSION, PROOF_LEN};

/// Shortest secret (after trailing white space is dropped).
pub const SECRET_BYTES_MIN: usize = 16;
/// Largest secret file read.
pub const SECRET_BYTES_MAX: u64 = 4096;

/// How an operator makes a secret, said where one is refused.
pub const MAKE_ONE: &str = "make one with `head -c 32 /dev/urandom | base64 > FILE`";

/// Why the secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("--cluster-secret-file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("--cluster-secret-file {path}: {len} bytes, more than {SECRET_BYTES_MAX}")]
    TooLong { path: PathBuf, len: u64 },
    #[error(
        "--cluster-secret-file {path}: {len} bytes without trailing white space, fewer \
         than {SECRET_BYTES_MIN}: {MAKE_ONE}"
    )]
    TooShort { path: PathBuf, len: usize },
}

impl SecretError {
    /// Whether the file could not be read (rather than holding no usable secret).
    pub fn is_unreadable(&self) -> bool {
        matches!(self, SecretError::Io { .. })
    }
}

/// Which side of a connection proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Dialer,
    Acceptor,
}

impl Side {
    fn label(self) -> &'static [u8] {
        match self {
            Side::Dialer => b"seglog raft dialer",
            Side::Acceptor => b"seglog raft acceptor",
        }
    }
}

/// What both proofs of one connection cover.
#[derive(Clone, Copy, Debug)]
pub struct Handshake<'a> {
    pub dialer: u64,
    pub acceptor: u64,
    pub dialer_nonce: &'a [u8; NONCE_LEN],
    pub acceptor_nonce: &'a [u8; NONCE_LEN],
}

impl Handshake<'_> {
    fn message(&self, side: Side) -> Vec<u8> {
        let mut m = Vec::with_capacity(32 + 2 + 16 + 2 * NONCE_LEN);
        m.extend_from_slice(side.label());
        m.extend_from_slice(&PEER_VERSION.to_be_bytes());
        m.extend_from_slice(&self.dialer.to_be_bytes());
        m.extend_from_slice(&self.acceptor.to_be_bytes());
        m.extend_from_slice(self.dialer_nonce);
        m.extend_from_slice(self.acceptor_nonce);
        m
    }
}

/// The cluster secret, as an HMAC key.
pub struct ClusterSecret {
    key: hmac::Key,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret `bytes` hold, less trailing white space; `None` when fewer than
    /// [`SECRET_BYTES_MIN`] bytes are left.
    pub fn from_bytes(bytes: &[u8]) -> Option<ClusterSecret> {
        let s = bytes.trim_ascii_end();
        (s.len() >= SECRET_BYTES_MIN).then(|| ClusterSecret {
            key: hmac::Key::new(hmac::HMAC_SHA256, s),
        })
    }

    /// Reads the secret file; also returns its permission bits, for the caller to
    /// warn when others may read it.
    pub fn read(path: &Path) -> Result<(ClusterSecret, u32), SecretError> {
        use std::os::unix::fs::PermissionsExt as _;
        let io = |source| SecretError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(io::Error::other("not a regular file")));
        }
        if meta.len() > SECRET_BYTES_MAX {
            return Err(SecretError::TooLong {
                path: path.to_path_buf(),
                len: meta.len(),
            });
        }
        let mut bytes = Vec::new();
        file.take(SECRET_BYTES_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > SECRET_BYTES_MAX {
            return Err(SecretError::TooLong {
                path: path.to_path_buf(),
                len: bytes.len() as u64,
            });
        }
        let len = bytes.trim_ascii_end().len();
        let secret = ClusterSecret::from_bytes(&bytes).ok_or(SecretError::TooShort {
            path: path.to_path_buf(),
            len,
        })?;
        Ok((secret, meta.permissions().mode() & 0o7777))
    }

    /// `side`'s proof for the connection `h`.
    pub fn prove(&self, side: Side, h: &Handshake<'_>) -> [u8; PROOF_LEN] {
        let tag = hmac::sign(&self.key, &h.message(side));
        let mut out = [0u8; PROOF_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Whether `proof` is `side`'s proof for the connection `h` (constant time).
    pub fn verify(&self, side: Side, h: &Handshake<'_>, proof: &[u8]) -> bool {
        hmac::verify(&self.key, &h.message(side), proof).is_ok()
    }
}

/// A fresh random nonce.
pub fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::from_bytes(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_proof_holds_only_for_its_side_ids_nonces_and_secret() {
        let s = secret("correct horse battery staple\n");
        let (a, b) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let h = Handshake {
            dialer: 1,
            acceptor: 2,
            dialer_nonce: &a,
            acceptor_nonce: &b,
        };
        let p = s.prove(Side::Acceptor, &h);
        assert!(s.verify(Side::Acceptor, &h, &p));
        // The trailing newline is not part of the secret.
        assert!(secret("correct horse battery staple").verify(Side::Acceptor, &h, &p));
        assert!(!secret("correct horse battery stapler").verify(Side::Acceptor, &h, &p));
        assert!(!s.verify(Side::Dialer, &h, &p), "reflected");
        let swapped = Handshake {
            dialer: 2,
            acceptor: 1,
            ..h
        };
        assert!(!s.verify(Side::Acceptor, &swapped, &p), "relayed");
        let other_nonce = Handshake {
            acceptor_nonce: &a,
            ..h
        };
        assert!(!s.verify(Side::Acceptor, &other_nonce, &p), "replayed");
        assert!(!s.verify(Side::Acceptor, &h, &p[..31]));
        assert!(!s.verify(Side::Acceptor, &h, b""));
    }

    #[test]
    fn secret_files_are_checked() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let (_, mode) = ClusterSecret::read(&path).unwrap();
        assert_eq!(mode, 0o640);
        std::fs::write(&path, "0123456789abcde \n").unwrap();
        let e = ClusterSecret::read(&path).unwrap_err();
        assert!(matches!(e, SecretError::TooShort { len: 15, .. }), "{e}");
        assert!(e.to_string().contains("head -c 32 /dev/urandom"), "{e}");
        std::fs::write(&path, vec![b'x'; 4097]).unwrap();
        let e = ClusterSecret::read(&path).unwrap_err();
        assert!(matches!(e, SecretError::TooLong { len: 4097, .. }), "{e}");
        let e = ClusterSecret::read(&dir.path().join("none")).unwrap_err();
        assert!(e.is_unreadable(), "{e}");
        let e = ClusterSecret::read(dir.path()).unwrap_err();
        assert!(e.is_unreadable(), "{e}");
        assert_eq!(
            format!("{:?}", secret("0123456789abcdef")),
            "ClusterSecret(..)"
        );
    }
}
