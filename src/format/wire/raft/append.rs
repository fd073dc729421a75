//! The binary payload of [`super::Rpc::AppendEntriesBinary`]: openraft's
//! AppendEntries request and its reply, with each entry's payload as raw bytes (the
//! same bytes the Raft log stores as the entry's record value), not JSON.
//!
//! ```text
//! request
//! +------+---------------+-----------------+-------+---------+
//! | vote | prev_log_id   | leader_commit   | count | entries |
//! | 17   | opt_log_id    | opt_log_id      | u32   |         |
//! +------+---------------+-----------------+-------+---------+
//! vote:       term u64, leader node id u64, committed u8 (0 or 1)
//! opt_log_id: present u8 (0: nothing follows; 1: a log_id follows)
//! log_id:     term u64, leader node id u64, index u64
//! entry:      log_id, kind u8 (0 blank, 1 normal, 2 membership), value bytes
//!             (u32 length + bytes; a normal entry's EntryCodec bytes, a membership's
//!             JSON, nothing for a blank one)
//!
//! reply
//! +--------+------+
//! | status | body |
//! | u8     |      |
//! +--------+------+
//! status 0 success; 1 partial success: opt_log_id; 2 conflict; 3 higher vote: vote
//! ```
//!
//! Invariants: the entry count is checked against [`APPEND_ENTRIES_MAX`] and against
//! the bytes remaining before anything is allocated; each value length against the
//! bytes remaining (the whole payload is bounded by the peer frame); values are
//! borrowed from the payload, never copied here; trailing bytes are an error.

use super::super::{ProtocolError, Reader, FRAME_BYTES_MAX};

/// Most entries one request carries.
pub const APPEND_ENTRIES_MAX: u32 = 1 << 16;
/// Bytes of an encoded log id.
pub const LOG_ID_LEN: usize = 8 + 8 + 8;
/// Bytes of an encoded vote.
pub const VOTE_LEN: usize = 8 + 8 + 1;
/// The smallest encoded entry: a log id, its kind and an empty value.
pub const ENTRY_MIN_LEN: usize = LOG_ID_LEN + 1 + 4;
const _: () = assert!(LOG_ID_LEN == 24 && VOTE_LEN == 17 && ENTRY_MIN_LEN == 29);

const KIND_MAX: u8 = 2;
const STATUS_SUCCESS: u8 = 0;
const STATUS_PARTIAL: u8 = 1;
const STATUS_CONFLICT: u8 = 2;
const STATUS_HIGHER_VOTE: u8 = 3;

/// A log id: the (term, node id) leader id that wrote it and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireLogId {
    pub term: u64,
    pub leader: u64,
    pub index: u64,
}

/// A vote: the leader id it is for and whether a quorum granted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireVote {
    pub term: u64,
    pub leader: u64,
    pub committed: bool,
}

/// One entry: its log id, its kind byte and its value (borrowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireEntry<'a> {
    pub log_id: WireLogId,
    pub kind: u8,
    pub value: &'a [u8],
}

/// An AppendEntries request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest<'a> {
    pub vote: WireVote,
    pub prev_log_id: Option<WireLogId>,
    pub leader_commit: Option<WireLogId>,
    pub entries: Vec<WireEntry<'a>>,
}

/// An AppendEntries reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendReply {
    Success,
    PartialSuccess(Option<WireLogId>),
    Conflict,
    HigherVote(WireVote),
}

fn put_log_id(out: &mut Vec<u8>, id: &WireLogId) {
    out.extend_from_slice(&id.term.to_be_bytes());
    out.extend_from_slice(&id.leader.to_be_bytes());
    out.extend_from_slice(&id.index.to_be_bytes());
}

fn put_opt_log_id(out: &mut Vec<u8>, id: Option<&WireLogId>) {
    match id {
        Some(id) => {
            out.push(1);
            put_log_id(out, id);
        }
        None => out.push(0),
    }
}

fn put_vote(out: &mut Vec<u8>, v: &WireVote) {
    out.extend_from_slice(&v.term.to_be_bytes());
    out.extend_from_slice(&v.leader.to_be_bytes());
    out.push(u8::from(v.committed));
}

/// Appends the request's head (everything before the entries) to `out`, with
/// `count` entries to follow (each with [`put_entry`]).
pub fn put_request_head(
    out: &mut Vec<u8>,
    vote: &WireVote,
    prev_log_id: Option<&WireLogId>,
    leader_commit: Option<&WireLogId>,
    count: usize,
) -> Result<(), ProtocolError> {
    if count > APPEND_ENTRIES_MAX as usize {
        return Err(ProtocolError::Unencodable {
            field: "entries",
            len: count as u64,
            max: u64::from(APPEND_ENTRIES_MAX),
        });
    }
    put_vote(out, vote);
    put_opt_log_id(out, prev_log_id);
    put_opt_log_id(out, leader_commit);
    out.extend_from_slice(&(count as u32).to_be_bytes());
    Ok(())
}

/// Appends one entry whose value [`write_value`] appends to `out` (so the value is
/// encoded in place, not copied); returns what `write_value` returned (the kind).
pub fn put_entry<E>(
    out: &mut Vec<u8>,
    log_id: &WireLogId,
    write_value: impl FnOnce(&mut Vec<u8>) -> Result<u8, E>,
) -> Result<Result<u8, E>, ProtocolError> {
    let before = out.len();
    put_log_id(out, log_id);
    let kind_at = out.len();
    out.push(0);
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let kind = match write_value(out) {
        Ok(k) => k,
        Err(e) => {
            out.truncate(before);
            return Ok(Err(e));
        }
    };
    let len = out.len() - len_at - 4;
    if kind > KIND_MAX {
        out.truncate(before);
        return Err(ProtocolError::Unencodable {
            field: "entry kind",
            len: u64::from(kind),
            max: u64::from(KIND_MAX),
        });
    }
    if len > FRAME_BYTES_MAX as usize {
        out.truncate(before);
        return Err(ProtocolError::Unencodable {
            field: "entry value",
            len: len as u64,
            max: u64::from(FRAME_BYTES_MAX),
        });
    }
    if let Some(k) = out.get_mut(kind_at) {
        *k = kind;
    }
    if let Some(l) = out.get_mut(len_at..len_at + 4) {
        l.copy_from_slice(&(len as u32).to_be_bytes());
    }
    Ok(Ok(kind))
}

/// Encodes a whole request (the entries' values already encoded).
pub fn encode_request(out: &mut Vec<u8>, req: &AppendRequest<'_>) -> Result<(), ProtocolError> {
    put_request_head(
        out,
        &req.vote,
        req.prev_log_id.as_ref(),
        req.leader_commit.as_ref(),
        req.entries.len(),
    )?;
    for e in &req.entries {
        let r = put_entry(out, &e.log_id, |o| {
            o.extend_from_slice(e.value);
            Ok::<u8, ()>(e.kind)
        })?;
        if r.is_err() {
            return Err(ProtocolError::Unencodable {
                field: "entry value",
                len: e.value.len() as u64,
                max: u64::from(FRAME_BYTES_MAX),
            });
        }
    }
    Ok(())
}

fn log_id(r: &mut Reader<'_>) -> Result<WireLogId, ProtocolError> {
    Ok(WireLogId {
        term: r.u64("log id term")?,
        leader: r.u64("log id leader")?,
        index: r.u64("log id index")?,
    })
}

fn opt_log_id(r: &mut Reader<'_>, field: &'static str) -> Result<Option<WireLogId>, ProtocolError> {
    let at = r.at;
    match r.array::<1>(field)? {
        [0] => Ok(None),
        [1] => Ok(Some(log_id(r)?)),
        [v] => Err(ProtocolError::BadValue {
            field,
            at,
            value: i64::from(v),
        }),
    }
}

fn vote(r: &mut Reader<'_>) -> Result<WireVote, ProtocolError> {
    let term = r.u64("vote term")?;
    let leader = r.u64("vote leader")?;
    let at = r.at;
    let committed = match r.array::<1>("vote committed")? {
        [0] => false,
        [1] => true,
        [v] => {
            return Err(ProtocolError::BadValue {
                field: "vote committed",
                at,
                value: i64::from(v),
            })
        }
    };
    Ok(WireVote {
        term,
        leader,
        committed,
    })
}

/// Decodes a request; the entries' values borrow from `payload`.
pub fn decode_request(payload: &[u8]) -> Result<AppendRequest<'_>, ProtocolError> {
    let mut r = Reader::new(payload, 0);
    let vote = vote(&mut r)?;
    let prev_log_id = opt_log_id(&mut r, "prev_log_id")?;
    let leader_commit = opt_log_id(&mut r, "leader_commit")?;
    let n = r.count("entries", APPEND_ENTRIES_MAX, ENTRY_MIN_LEN)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let log_id = log_id(&mut r)?;
        let at = r.at;
        let [kind] = r.array::<1>("entry kind")?;
        if kind > KIND_MAX {
            return Err(ProtocolError::BadValue {
                field: "entry kind",
                at,
                value: i64::from(kind),
            });
        }
        let at = r.at;
        let len = r.u32("entry value")? as usize;
        if len > r.remaining() {
            return Err(ProtocolError::Truncated {
                field: "entry value",
                at,
                needed: len as u64,
                available: r.remaining(),
            });
        }
        let value = r.take("entry value", len)?;
        entries.push(WireEntry {
            log_id,
            kind,
            value,
        });
    }
    r.finish()?;
    Ok(AppendRequest {
        vote,
        prev_log_id,
        leader_commit,
        entries,
    })
}

/// Appends an encoded reply to `out`.
pub fn encode_reply(out: &mut Vec<u8>, reply: &AppendReply) {
    match reply {
        AppendReply::Success => out.push(STATUS_SUCCESS),
        AppendReply::PartialSuccess(id) => {
            out.push(STATUS_PARTIAL);
            put_opt_log_id(out, id.as_ref());
        }
        AppendReply::Conflict => out.push(STATUS_CONFLICT),
        AppendReply::HigherVote(v) => {
            out.push(STATUS_HIGHER_VOTE);
            put_vote(out, v);
        }
    }
}

/// Decodes a reply.
pub fn decode_reply(payload: &[u8]) -> Result<AppendReply, ProtocolError> {
    let mut r = Reader::new(payload, 0);
    let [status] = r.array::<1>("status")?;
    let reply = match status {
        STATUS_SUCCESS => AppendReply::Success,
        STATUS_PARTIAL => AppendReply::PartialSuccess(opt_log_id(&mut r, "matched log id")?),
        STATUS_CONFLICT => AppendReply::Conflict,
        STATUS_HIGHER_VOTE => AppendReply::HigherVote(vote(&mut r)?),
        v => {
            return Err(ProtocolError::BadValue {
                field: "status",
                at: 0,
                value: i64::from(v),
            })
        }
    };
    r.finish()?;
    Ok(reply)
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(term: u64, leader: u64, index: u64) -> WireLogId {
        WireLogId {
            term,
            leader,
            index,
        }
    }

    fn sample() -> AppendRequest<'static> {
        AppendRequest {
            vote: WireVote {
                term: 3,
                leader: 2,
                committed: true,
            },
            prev_log_id: Some(id(2, 1, 9)),
            leader_commit: Some(id(3, 2, 8)),
            entries: vec![
                WireEntry {
                    log_id: id(3, 2, 10),
                    kind: 0,
                    value: b"",
                },
                WireEntry {
                    log_id: id(3, 2, 11),
                    kind: 1,
                    value: b"\x01\x00records",
                },
                WireEntry {
                    log_id: id(3, 2, 12),
                    kind: 2,
                    value: b"{}",
                },
            ],
        }
    }

    fn encoded(req: &AppendRequest<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_request(&mut out, req).unwrap();
        out
    }

    #[test]
    fn requests_round_trip_and_every_cut_is_refused() {
        let heartbeat = AppendRequest {
            vote: WireVote {
                term: 1,
                leader: 1,
                committed: false,
            },
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        };
        for req in [sample(), heartbeat] {
            let out = encoded(&req);
            assert_eq!(decode_request(&out).unwrap(), req);
            for cut in 0..out.len() {
                assert!(decode_request(&out[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = out.clone();
            long.push(0);
            assert!(matches!(
                decode_request(&long),
                Err(ProtocolError::Trailing { .. })
            ));
        }
    }

    #[test]
    fn golden_request() {
        let req = AppendRequest {
            vote: WireVote {
                term: 1,
                leader: 2,
                committed: true,
            },
            prev_log_id: None,
            leader_commit: Some(id(1, 2, 3)),
            entries: vec![WireEntry {
                log_id: id(1, 2, 4),
                kind: 1,
                value: b"v",
            }],
        };
        let be = |v: u64| v.to_be_bytes();
        let want: Vec<u8> = [
            &be(1)[..],
            &be(2),
            &[1],
            &[0],
            &[1],
            &be(1),
            &be(2),
            &be(3),
            &[0, 0, 0, 1],
            &be(1),
            &be(2),
            &be(4),
            &[1],
            &[0, 0, 0, 1, b'v'],
        ]
        .concat();
        assert_eq!(encoded(&req), want);
    }

    #[test]
    fn each_malformed_request_is_its_own_error() {
        let good = encoded(&sample());
        // The vote's committed flag.
        let mut b = good.clone();
        b[16] = 2;
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::BadValue {
                field: "vote committed",
                ..
            })
        ));
        // The presence byte of prev_log_id.
        let mut b = good.clone();
        b[VOTE_LEN] = 7;
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::BadValue {
                field: "prev_log_id",
                ..
            })
        ));
        let count_at = VOTE_LEN + 2 * (1 + LOG_ID_LEN);
        // A count over the limit.
        let mut b = good.clone();
        b[count_at..count_at + 4].copy_from_slice(&(APPEND_ENTRIES_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooMany {
                field: "entries",
                ..
            })
        ));
        // A count the remaining bytes cannot hold, refused before allocating.
        let mut b = good.clone();
        b[count_at..count_at + 4].copy_from_slice(&APPEND_ENTRIES_MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Truncated {
                field: "entries",
                ..
            })
        ));
        // An unknown entry kind.
        let first = count_at + 4;
        let mut b = good.clone();
        b[first + LOG_ID_LEN] = 3;
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::BadValue {
                field: "entry kind",
                ..
            })
        ));
        // A value length past the end.
        let mut b = good.clone();
        let len_at = first + LOG_ID_LEN + 1;
        b[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Truncated {
                field: "entry value",
                ..
            })
        ));
        // More entries encoded than the limit.
        let mut out = Vec::new();
        let v = WireVote {
            term: 0,
            leader: 0,
            committed: false,
        };
        assert!(matches!(
            put_request_head(&mut out, &v, None, None, APPEND_ENTRIES_MAX as usize + 1),
            Err(ProtocolError::Unencodable { .. })
        ));
    }

    #[test]
    fn replies_round_trip_and_bad_ones_are_refused() {
        let replies = [
            AppendReply::Success,
            AppendReply::PartialSuccess(None),
            AppendReply::PartialSuccess(Some(id(4, 1, 77))),
            AppendReply::Conflict,
            AppendReply::HigherVote(WireVote {
                term: 9,
                leader: 3,
                committed: false,
            }),
        ];
        for rep in replies {
            let mut out = Vec::new();
            encode_reply(&mut out, &rep);
            assert_eq!(decode_reply(&out).unwrap(), rep);
            for cut in 0..out.len() {
                assert!(decode_reply(&out[..cut]).is_err(), "{rep:?} cut at {cut}");
            }
            out.push(0);
            assert!(matches!(
                decode_reply(&out),
                Err(ProtocolError::Trailing { .. })
            ));
        }
        assert!(matches!(
            decode_reply(&[4]),
            Err(ProtocolError::BadValue {
                field: "status",
                ..
            })
        ));
        assert!(matches!(
            decode_reply(&[1, 2]),
            Err(ProtocolError::BadValue {
                field: "matched log id",
                ..
            })
        ));
    }

    #[test]
    fn a_failed_value_leaves_nothing_behind() {
        let mut out = vec![9];
        let r = put_entry(&mut out, &id(1, 1, 1), |o| {
            o.extend_from_slice(b"partial");
            Err::<u8, &str>("no")
        })
        .unwrap();
        assert_eq!(r, Err("no"));
        assert_eq!(out, [9]);
    }

    fn arb_id() -> impl Strategy<Value = WireLogId> {
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(term, leader, index)| WireLogId {
            term,
            leader,
            index,
        })
    }

    proptest! {
        #[test]
        fn any_request_round_trips(
            term in any::<u64>(),
            leader in any::<u64>(),
            committed in any::<bool>(),
            prev in proptest::option::of(arb_id()),
            commit in proptest::option::of(arb_id()),
            entries in proptest::collection::vec(
                (arb_id(), 0u8..=2, proptest::collection::vec(any::<u8>(), 0..64)),
                0..8,
            ),
        ) {
            let req = AppendRequest {
                vote: WireVote { term, leader, committed },
                prev_log_id: prev,
                leader_commit: commit,
                entries: entries
                    .iter()
                    .map(|(log_id, kind, value)| WireEntry { log_id: *log_id, kind: *kind, value })
                    .collect(),
            };
            let out = encoded(&req);
            prop_assert_eq!(decode_request(&out).unwrap(), req);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_request(&bytes);
            let _ = decode_reply(&bytes);
        }
    }
}
