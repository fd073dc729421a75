//! The Raft peer protocol: the frames nodes of a cluster exchange on their
//! `--raft-listen` connections. One TCP connection per pair of nodes carries the
//! calls of every partition's Raft group; each call names its group.
//!
//! ```text
//! peer frame
//! +-----------+---------+------+------+
//! | frame_len | call_id | kind | body |
//! | u32       | u64     | u8   |      |
//! +-----------+---------+------+------+
//! kind 0 hello:  version u16, cluster_id string, node_id u64, client_addr string,
//!                kafka_addr string (empty: the node has no Kafka listener),
//!                node count u16, then that many node ids u64 (version 4: every
//!                node of the sender's --peers, ascending; a node whose list differs
//!                is refused), nonce [32]u8, proof bytes (version 6 on: empty, or 32
//!                bytes), flags u8 (version 6 on: bit 0, the sender requires logins;
//!                the other bits 0)
//! kind 1 call:   topic string, partition u32, rpc u8, payload bytes
//! kind 2 reply:  status u8 (0 ok: payload bytes; 1 failed: message string)
//! kind 3 refuse: reason string (instead of any handshake frame; the connection
//!                then closes)
//! kind 4 proof:  proof bytes (empty, or 32 bytes)
//! kind 5 welcome: no body
//! ```
//!
//! The handshake (version 6 on): the dialer sends its hello (its proof empty); the
//! acceptor answers with its own hello, whose proof is HMAC-SHA256 under the
//! cluster secret (`serve --cluster-secret-file`) of both nonces and both node ids;
//! the dialer checks it and sends a proof frame, its own HMAC of the same (under
//! another label); the acceptor checks it and sends a welcome. Either side refuses
//! instead, with a reason. Nodes without a secret send empty proofs, and a node
//! with one refuses a peer whose proof is empty or wrong. What each MAC covers is
//! written in `src/engine/replication/secret.rs` and docs/PROTOCOL.md.
//!
//! `frame_len` counts the bytes after itself, at least [`PEER_HEAD_LEN`] and at most
//! [`FRAME_BYTES_MAX`]. A call's payload is the JSON of an openraft message (or of
//! one of our own, see [`Rpc`]), or for [`Rpc::AppendEntriesBinary`] the binary
//! request of [`append`] (its reply likewise; [`Rpc::AppendStream`] too); either is
//! bounded by the frame. The first frame
//! each side sends is its hello (or a refusal); `call_id` is 0 there. The dialer sends
//! calls; the acceptor answers each with a reply of the same `call_id`, in any order,
//! and hands a group's [`Rpc::AppendStream`] calls to it in the order they came.

pub mod append;

use super::{
    put_str, ProtocolError, Reader, FRAME_BYTES_MAX, LEN_FIELD, MESSAGE_BYTES_MAX, TOPIC_BYTES_MAX,
};

/// The version of the peer protocol this build speaks (2: [`Rpc::AppendStream`];
/// 3: normal entries carry their proposal time, which a node of version 2 cannot
/// decode; 4: the hello lists the node ids of the sender's `--peers`; 5:
/// [`Rpc::Replicas`], [`Rpc::Schemas`], [`Rpc::Keys`]; 6: the hello carries a nonce
/// and a proof, and the handshake ends with a proof and a welcome; 7:
/// [`Rpc::Records`], [`Rpc::Checkpoint`]). Nodes of different versions refuse each other's hello.
pub const PEER_VERSION: u16 = 7;
/// `call_id` + `kind`: the smallest peer frame.
pub const PEER_HEAD_LEN: usize = 8 + 1;
/// Longest cluster id.
pub const CLUSTER_ID_BYTES_MAX: usize = 64;
/// Longest address in a hello.
pub const ADDR_BYTES_MAX: usize = 256;
/// Length of a hello's nonce.
pub const NONCE_LEN: usize = 32;
/// Length of a non-empty proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Hello flag: the sender requires logins from its clients.
pub const HELLO_LOGINS: u8 = 1;

/// Largest first frame a node reads from a connection it has not authenticated (a
/// hello listing 32767 nodes fits).
pub const HANDSHAKE_BYTES_MAX: u32 = 512 * 1024;

const KIND_HELLO: u8 = 0;
const KIND_CALL: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_PROOF: u8 = 4;
const KIND_WELCOME: u8 = 5;

/// What a call asks of the peer's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Rpc {
    AppendEntries = 1,
    Vote = 2,
    PreVote = 3,
    /// Create the local replica of a replicated topic (payload: the replica's JSON).
    CreateReplica = 4,
    /// Form a new group (payload: the JSON of its member ids).
    Initialize = 5,
    /// The node's view of its groups, as `cluster status --json` shows it (the topic
    /// is empty); a follower asks each of its groups' leaders every second for their
    /// in-sync replicas, and a node that holds no replica of a partition asks a
    /// holder who leads it. A payload, JSON `[[topic, partition], ...]`, narrows the
    /// answer to those of the node's groups (an empty payload: everything).
    Status = 6,
    /// AppendEntries in binary ([`append`]), the entries' payloads as raw bytes.
    AppendEntriesBinary = 7,
    /// Delete the local replica of a replicated topic: its groups stop, its data and
    /// Raft logs go (no payload; a node without the topic answers success).
    DeleteReplica = 8,
    /// One AppendEntries of a pipelined stream (payload and answer as for
    /// [`Rpc::AppendEntriesBinary`]). Several may be in flight for one group on one
    /// connection: the receiver hands them to its Raft group in the order they arrive
    /// and answers each once its entries are flushed (its answer names the matching
    /// log id); a call after one that failed starts a new stream.
    AppendStream = 9,
    /// A leader starts sending a snapshot (payload: JSON; the answer names where the
    /// follower's data partition ends, so only the missing records are sent).
    SnapshotBegin = 10,
    /// One chunk of a snapshot's records, in offset order (payload: JSON).
    SnapshotChunk = 11,
    /// The snapshot's metadata once every chunk is sent: the follower installs it
    /// (payload: JSON; the answer is openraft's snapshot response).
    SnapshotInstall = 12,
    /// Change settings of the local replica of a replicated topic (payload: the JSON
    /// of its `[key, value]` pairs; the answer: the topic's configuration as JSON).
    AlterReplica = 13,
    /// Where a replicated topic's replicas are (no payload; the answer: the topic's
    /// placement as its `replication.json` holds it, or `null` when this node holds
    /// no replica of it). A node that holds none asks this to act on the topic.
    Placement = 14,
    /// The start and end offsets of a partition the called node leads, as a
    /// ListOffsets answers them (no payload; the answer: JSON `[start, end]`; a node
    /// that does not lead it refuses). A node whose placement leaves the partition
    /// out asks this to answer a client's ListOffsets.
    Offsets = 15,
    /// What a node whose data directory is new needs to create its replicas again
    /// (payload: JSON, the asking node's id; the answer: JSON `{"topics", "keys"}`:
    /// for each replicated topic the called node holds whose placement includes the
    /// asker, the topic's create request, its schemas and, per partition, the called
    /// node's Raft vote or `null`; and the called node's API keys).
    Replicas = 16,
    /// A topic's schemas changed on the calling node (`schemas register` or `delete`):
    /// the called node takes the same entry (payload: JSON `{"topic", "subject"}`, the
    /// subject as `schemas.json` holds it or `null` for none; a node without the topic
    /// changes nothing; the answer: `null`).
    Schemas = 17,
    /// An API key was created or revoked on the calling node (payload: JSON
    /// `{"put": entry}` with the key as `api_keys.json` holds it, or `{"revoke": id}`;
    /// the answer: JSON `true` when it changed the called node's keys).
    Keys = 18,
    /// Records of a partition's data partition, for a replica whose data partition
    /// lost records it had applied (damage cut at its start): payload JSON `{"from",
    /// "to"}`; the answer: JSON `{"start", "records"}`, the called node's first
    /// retained offset and its records from `from` (or `start`, when later) below
    /// `to`, in offset order, about one snapshot chunk of them.
    Records = 19,
    /// The called node's checkpoint of a partition (`applied-P.json` as on its disk;
    /// no payload; the answer: its JSON, or `null` when it has none), for a replica
    /// whose own checkpoint is lost while its Raft log is purged.
    Checkpoint = 20,
}

impl Rpc {
    pub fn from_u8(v: u8) -> Option<Rpc> {
        [
            Rpc::AppendEntries,
            Rpc::Vote,
            Rpc::PreVote,
            Rpc::CreateReplica,
            Rpc::Initialize,
            Rpc::Status,
            Rpc::AppendEntriesBinary,
            Rpc::DeleteReplica,
            Rpc::AppendStream,
            Rpc::SnapshotBegin,
            Rpc::SnapshotChunk,
            Rpc::SnapshotInstall,
            Rpc::AlterReplica,
            Rpc::Placement,
            Rpc::Offsets,
            Rpc::Replicas,
            Rpc::Schemas,
            Rpc::Keys,
            Rpc::Records,
            Rpc::Checkpoint,
        ]
        .into_iter()
        .find(|r| *r as u8 == v)
    }
}

/// One peer frame, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerFrame<'a> {
    Hello {
        version: u16,
        cluster_id: &'a str,
        node_id: u64,
        client_addr: &'a str,
        /// The node's Kafka listener as clients reach it (empty: none).
        kafka_addr: &'a str,
        /// The ids of every node of the sender's `--peers`, itself included,
        /// ascending.
        nodes: Vec<u64>,
        /// Random bytes the other side's proof covers.
        nonce: [u8; NONCE_LEN],
        /// The acceptor's proof ([`PROOF_LEN`] bytes, or empty: no secret); the
        /// dialer's is always empty (it sends its own in a [`PeerFrame::Proof`]).
        proof: &'a [u8],
        /// [`HELLO_LOGINS`], or 0.
        flags: u8,
    },
    Call {
        call_id: u64,
        topic: &'a str,
        partition: u32,
        rpc: Rpc,
        payload: &'a [u8],
    },
    Reply {
        call_id: u64,
        result: Result<&'a [u8], &'a str>,
    },
    Refuse {
        reason: &'a str,
    },
    /// The dialer's proof ([`PROOF_LEN`] bytes, or empty: no secret).
    Proof {
        proof: &'a [u8],
    },
    /// The acceptor took the dialer's proof: calls may follow.
    Welcome,
}

/// Longest piece of a peer's text (a refusal's reason, a failed call's message, a
/// topic name) put into this node's messages and logs.
pub const PEER_TEXT_SHOWN_MAX: usize = 300;

/// A peer's text as this node shows it: control characters escaped (a newline in a
/// peer's refusal could otherwise forge a log line) and cut at
/// [`PEER_TEXT_SHOWN_MAX`] characters.
pub fn peer_text(text: &str) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == PEER_TEXT_SHOWN_MAX {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl PeerFrame<'_> {
    /// What the frame is, in a few words and without its payload: for messages about
    /// a frame that came where another was expected.
    pub fn summary(&self) -> String {
        match self {
            PeerFrame::Hello { node_id, .. } => format!("a hello from node {node_id}"),
            PeerFrame::Call {
                call_id,
                topic,
                partition,
                rpc,
                payload,
            } => format!(
                "call {call_id} ({rpc:?} for {}/{partition}, {} payload bytes)",
                peer_text(topic),
                payload.len()
            ),
            PeerFrame::Reply { call_id, result } => match result {
                Ok(b) => format!("the reply to call {call_id} ({} bytes)", b.len()),
                Err(_) => format!("the reply to call {call_id} (failed)"),
            },
            PeerFrame::Refuse { .. } => "a refusal".to_string(),
            PeerFrame::Proof { .. } => "a proof".to_string(),
            PeerFrame::Welcome => "a welcome".to_string(),
        }
    }
}

fn start(out: &mut Vec<u8>, call_id: u64, kind: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; LEN_FIELD]);
    out.extend_from_slice(&call_id.to_be_bytes());
    out.push(kind);
    at
}

fn finish(out: &mut Vec<u8>, at: usize) -> Result<(), ProtocolError> {
    super::finish_frame(out, at)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) -> Result<(), ProtocolError> {
    let max = FRAME_BYTES_MAX as usize - PEER_HEAD_LEN;
    if b.len() > max {
        return Err(ProtocolError::Unencodable {
            field: "payload",
            len: b.len() as u64,
            max: max as u64,
        });
    }
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
    Ok(())
}

fn put_proof(out: &mut Vec<u8>, proof: &[u8]) -> Result<(), ProtocolError> {
    if !proof.is_empty() && proof.len() != PROOF_LEN {
        return Err(ProtocolError::Unencodable {
            field: "proof",
            len: proof.len() as u64,
            max: PROOF_LEN as u64,
        });
    }
    put_bytes(out, proof)
}

/// A proof: empty or [`PROOF_LEN`] bytes.
fn proof<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], ProtocolError> {
    let at = r.at;
    let p = bytes(r, "proof")?;
    if !p.is_empty() && p.len() != PROOF_LEN {
        return Err(ProtocolError::BadValue {
            field: "proof",
            at,
            value: p.len() as i64,
        });
    }
    Ok(p)
}

/// Appends a whole frame (with `frame_len`) to `out`; on error `out` is as before.
pub fn encode_peer_frame(out: &mut Vec<u8>, frame: &PeerFrame<'_>) -> Result<(), ProtocolError> {
    let before = out.len();
    let r = encode_inner(out, frame);
    if r.is_err() {
        out.truncate(before);
    }
    r
}

fn encode_inner(out: &mut Vec<u8>, frame: &PeerFrame<'_>) -> Result<(), ProtocolError> {
    match frame {
        PeerFrame::Hello {
            version,
            cluster_id,
            node_id,
            client_addr,
            kafka_addr,
            nodes,
            nonce,
            proof,
            flags,
        } => {
            let at = start(out, 0, KIND_HELLO);
            out.extend_from_slice(&version.to_be_bytes());
            put_str(out, "cluster_id", cluster_id, CLUSTER_ID_BYTES_MAX)?;
            out.extend_from_slice(&node_id.to_be_bytes());
            put_str(out, "client_addr", client_addr, ADDR_BYTES_MAX)?;
            put_str(out, "kafka_addr", kafka_addr, ADDR_BYTES_MAX)?;
            let count = u16::try_from(nodes.len()).map_err(|_| ProtocolError::Unencodable {
                field: "nodes",
                len: nodes.len() as u64,
                max: u64::from(u16::MAX),
            })?;
            out.extend_from_slice(&count.to_be_bytes());
            for n in nodes {
                out.extend_from_slice(&n.to_be_bytes());
            }
            out.extend_from_slice(nonce);
            put_proof(out, proof)?;
            out.push(*flags);
            finish(out, at)
        }
        PeerFrame::Proof { proof } => {
            let at = start(out, 0, KIND_PROOF);
            put_proof(out, proof)?;
            finish(out, at)
        }
        PeerFrame::Welcome => {
            let at = start(out, 0, KIND_WELCOME);
            finish(out, at)
        }
        PeerFrame::Call {
            call_id,
            topic,
            partition,
            rpc,
            payload,
        } => {
            let at = start(out, *call_id, KIND_CALL);
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            out.extend_from_slice(&partition.to_be_bytes());
            out.push(*rpc as u8);
            put_bytes(out, payload)?;
            finish(out, at)
        }
        PeerFrame::Reply { call_id, result } => {
            let at = start(out, *call_id, KIND_REPLY);
            match result {
                Ok(payload) => {
                    out.push(0);
                    put_bytes(out, payload)?;
                }
                Err(message) => {
                    out.push(1);
                    put_str(
                        out,
                        "message",
                        super::clip(message, MESSAGE_BYTES_MAX),
                        MESSAGE_BYTES_MAX,
                    )?;
                }
            }
            finish(out, at)
        }
        PeerFrame::Refuse { reason } => {
            let at = start(out, 0, KIND_REFUSE);
            put_str(
                out,
                "reason",
                super::clip(reason, MESSAGE_BYTES_MAX),
                MESSAGE_BYTES_MAX,
            )?;
            finish(out, at)
        }
    }
}

/// Checks a peer frame's `frame_len` before its bytes are read.
pub fn check_peer_frame_len(len: u32) -> Result<usize, ProtocolError> {
    if (len as usize) < PEER_HEAD_LEN || len > FRAME_BYTES_MAX {
        return Err(ProtocolError::FrameLength {
            len: u64::from(len),
            min: PEER_HEAD_LEN,
        });
    }
    Ok(len as usize)
}

fn bytes<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<&'a [u8], ProtocolError> {
    let at = r.at;
    let len = r.u32(field)?;
    if len as usize > r.remaining() {
        return Err(ProtocolError::Truncated {
            field,
            at,
            needed: u64::from(len),
            available: r.remaining(),
        });
    }
    r.take(field, len as usize)
}

/// Decodes one peer frame (the bytes after `frame_len`).
pub fn decode_peer_frame(frame: &[u8]) -> Result<PeerFrame<'_>, ProtocolError> {
    let mut r = Reader::new(frame, 0);
    let call_id = r.u64("call_id")?;
    let kind = r.array::<1>("kind")?[0];
    let f = match kind {
        KIND_HELLO => PeerFrame::Hello {
            version: r.u16("version")?,
            cluster_id: r.str("cluster_id", CLUSTER_ID_BYTES_MAX)?,
            node_id: r.u64("node_id")?,
            client_addr: r.str("client_addr", ADDR_BYTES_MAX)?,
            kafka_addr: r.str("kafka_addr", ADDR_BYTES_MAX)?,
            nodes: {
                let count = r.u16("nodes")?;
                (0..count)
                    .map(|_| r.u64("node"))
                    .collect::<Result<Vec<u64>, ProtocolError>>()?
            },
            nonce: r.array::<NONCE_LEN>("nonce")?,
            proof: proof(&mut r)?,
            flags: {
                let at = r.at;
                let f = r.array::<1>("flags")?[0];
                if f & !HELLO_LOGINS != 0 {
                    return Err(ProtocolError::BadValue {
                        field: "flags",
                        at,
                        value: i64::from(f),
                    });
                }
                f
            },
        },
        KIND_PROOF => PeerFrame::Proof {
            proof: proof(&mut r)?,
        },
        KIND_WELCOME => PeerFrame::Welcome,
        KIND_CALL => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let partition = r.u32("partition")?;
            let at = r.at;
            let v = r.array::<1>("rpc")?[0];
            let rpc = Rpc::from_u8(v).ok_or(ProtocolError::BadValue {
                field: "rpc",
                at,
                value: i64::from(v),
            })?;
            PeerFrame::Call {
                call_id,
                topic,
                partition,
                rpc,
                payload: bytes(&mut r, "payload")?,
            }
        }
        KIND_REPLY => {
            let at = r.at;
            let result = match r.array::<1>("status")?[0] {
                0 => Ok(bytes(&mut r, "payload")?),
                1 => Err(r.str("message", MESSAGE_BYTES_MAX)?),
                v => {
                    return Err(ProtocolError::BadValue {
                        field: "status",
                        at,
                        value: i64::from(v),
                    })
                }
            };
            PeerFrame::Reply { call_id, result }
        }
        KIND_REFUSE => PeerFrame::Refuse {
            reason: r.str("reason", MESSAGE_BYTES_MAX)?,
        },
        v => {
            return Err(ProtocolError::BadValue {
                field: "kind",
                at: 8,
                value: i64::from(v),
            })
        }
    };
    r.finish()?;
    Ok(f)
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn a_peers_text_is_shown_on_one_line_and_bounded() {
        assert_eq!(peer_text("plain words"), "plain words");
        assert_eq!(peer_text("a\nb\r\tc\u{1b}[31m"), "a\\nb\\r\\tc\\u{1b}[31m");
        let long = "é".repeat(PEER_TEXT_SHOWN_MAX + 50);
        let shown = peer_text(&long);
        assert_eq!(shown.chars().count(), PEER_TEXT_SHOWN_MAX + 1);
        assert!(shown.ends_with('…'));
    }

    /// The encoded frame of a Vote call with an empty payload.
    fn empty_vote_call() -> Vec<u8> {
        let mut out = Vec::new();
        encode_peer_frame(
            &mut out,
            &PeerFrame::Call {
                call_id: 1,
                topic: "t",
                partition: 0,
                rpc: Rpc::Vote,
                payload: b"",
            },
        )
        .unwrap();
        out
    }

    fn samples() -> Vec<PeerFrame<'static>> {
        vec![
            PeerFrame::Hello {
                version: PEER_VERSION,
                cluster_id: "c0ffee",
                node_id: 3,
                client_addr: "127.0.0.1:7000",
                kafka_addr: "127.0.0.1:9092",
                nodes: vec![1, 2, 3],
                nonce: [7; NONCE_LEN],
                proof: &[9; PROOF_LEN],
                flags: HELLO_LOGINS,
            },
            PeerFrame::Hello {
                version: PEER_VERSION,
                cluster_id: "",
                node_id: 1,
                client_addr: "127.0.0.1:7001",
                kafka_addr: "",
                nodes: Vec::new(),
                nonce: [0; NONCE_LEN],
                proof: b"",
                flags: 0,
            },
            PeerFrame::Proof {
                proof: &[1; PROOF_LEN],
            },
            PeerFrame::Proof { proof: b"" },
            PeerFrame::Welcome,
            PeerFrame::Call {
                call_id: 9,
                topic: "orders",
                partition: 2,
                rpc: Rpc::AppendEntries,
                payload: b"{\"x\":1}",
            },
            PeerFrame::Reply {
                call_id: 9,
                result: Ok(b"{}"),
            },
            PeerFrame::Reply {
                call_id: 10,
                result: Err("no such group"),
            },
            PeerFrame::Refuse {
                reason: "cluster id differs",
            },
        ]
    }

    #[test]
    fn frames_round_trip_and_every_cut_is_refused() {
        for f in samples() {
            let mut out = Vec::new();
            encode_peer_frame(&mut out, &f).unwrap();
            let len = u32::from_be_bytes(out[..4].try_into().unwrap());
            assert_eq!(len as usize, out.len() - 4);
            check_peer_frame_len(len).unwrap();
            let body = &out[4..];
            assert_eq!(decode_peer_frame(body).unwrap(), f);
            for cut in 0..body.len() {
                assert!(
                    decode_peer_frame(&body[..cut]).is_err(),
                    "{f:?} cut at {cut}"
                );
            }
            let mut long = body.to_vec();
            long.push(0);
            assert!(matches!(
                decode_peer_frame(&long),
                Err(ProtocolError::Trailing { .. })
            ));
        }
    }

    #[test]
    fn golden_hello() {
        let mut out = Vec::new();
        let f = PeerFrame::Hello {
            version: 1,
            cluster_id: "ab",
            node_id: 2,
            client_addr: "h:1",
            kafka_addr: "k:2",
            nodes: vec![1, 2],
            nonce: [0xab; NONCE_LEN],
            proof: b"",
            flags: 1,
        };
        encode_peer_frame(&mut out, &f).unwrap();
        let want: Vec<u8> = [
            &[0, 0, 0, 88][..],
            &[0; 8],
            &[0],
            &[0, 1],
            &[0, 2, b'a', b'b'],
            &[0, 0, 0, 0, 0, 0, 0, 2],
            &[0, 3, b'h', b':', b'1'],
            &[0, 3, b'k', b':', b'2'],
            &[0, 2],
            &[0, 0, 0, 0, 0, 0, 0, 1],
            &[0, 0, 0, 0, 0, 0, 0, 2],
            &[0xab; NONCE_LEN],
            &[0, 0, 0, 0],
            &[1],
        ]
        .concat();
        assert_eq!(out, want);
    }

    #[test]
    fn bad_values_and_lengths_are_refused() {
        assert!(check_peer_frame_len(3).is_err());
        assert!(check_peer_frame_len(FRAME_BYTES_MAX + 1).is_err());
        let mut f = vec![0; 8];
        f.push(7);
        assert!(matches!(
            decode_peer_frame(&f),
            Err(ProtocolError::BadValue { field: "kind", .. })
        ));
        // A call whose payload claims more bytes than the frame has.
        let mut out = empty_vote_call();
        let n = out.len();
        out[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode_peer_frame(&out[4..]),
            Err(ProtocolError::Truncated {
                field: "payload",
                ..
            })
        ));
        // A proof of another length than an HMAC-SHA256's.
        let mut out = Vec::new();
        encode_peer_frame(&mut out, &PeerFrame::Proof { proof: b"" }).unwrap();
        let mut body = out[4..].to_vec();
        body.truncate(body.len() - 4);
        body.extend_from_slice(&[0, 0, 0, 3, 1, 2, 3]);
        assert!(matches!(
            decode_peer_frame(&body),
            Err(ProtocolError::BadValue { field: "proof", .. })
        ));
        assert!(encode_peer_frame(&mut Vec::new(), &PeerFrame::Proof { proof: b"abc" }).is_err());
        // A hello flag this version does not know.
        let mut out = Vec::new();
        encode_peer_frame(&mut out, &samples()[0]).unwrap();
        let n = out.len();
        out[n - 1] = 2;
        assert!(matches!(
            decode_peer_frame(&out[4..]),
            Err(ProtocolError::BadValue { field: "flags", .. })
        ));
        // An unknown rpc.
        let mut out = empty_vote_call();
        let rpc_at = 4 + 9 + 3 + 4;
        out[rpc_at] = 99;
        assert!(matches!(
            decode_peer_frame(&out[4..]),
            Err(ProtocolError::BadValue { field: "rpc", .. })
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = decode_peer_frame(&bytes);
        }
    }
}
