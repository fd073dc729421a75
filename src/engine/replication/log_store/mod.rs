//! The Raft log of one replicated partition, kept on disk in the segment format.

/// How a Raft entry's application payload is turned into the bytes of a record value
/// and back. Decoding reads bytes from disk or the network: it checks every length
/// against a limit before it allocates, and refuses what it cannot read with an error,
/// never a panic.
pub trait EntryCodec: Sized {
    /// Appends the payload's encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes a payload that [`EntryCodec::encode`] wrote.
    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError>;
}

/// A payload that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("bad Raft entry payload: {0}")]
pub struct EntryCodecError(pub String);
