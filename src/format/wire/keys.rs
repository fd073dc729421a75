//! The API-key requests of protocol version 3 (docs/PROTOCOL.md, "Version 3"), and the
//! handshake's token field. `list` = u32 count + that many `string`s.
//!
//! ```text
//! handshake   min_version u16, max_version u16, then, only from a client offering
//!             version 3 or later and only when it has one: token string
//! key_create  name string, role string, topics list, groups list
//!           → id string, token string, created_ms i64
//! key_list    (empty)
//!           → count u32, then per key: id string, name string, role string,
//!             topics list, groups list, created_ms i64, last_used_ms i64
//! key_revoke  id string
//!           → (empty)
//! ```
//! A token is at most [`TOKEN_BYTES_MAX`] bytes; the key-create response is the only
//! message that carries a secret (inside the token).

use super::{put_count, put_str, ApiKey, ProtocolError, Reader, STRING_WIRE_MIN};
pub use crate::format::keys::TOKEN_BYTES_MAX;
use crate::format::keys::{
    KEYS_MAX, KEY_ID_LEN, KEY_NAME_BYTES_MAX, PATTERNS_PER_KEY_MAX, PATTERN_BYTES_MAX,
};

/// The first protocol version with the handshake token and the key requests.
pub const KEYS_VERSION: u16 = 3;
/// Longest role name.
pub const ROLE_BYTES_MAX: usize = 16;

const PATTERNS_MAX: u32 = PATTERNS_PER_KEY_MAX as u32;
const KEYS_LIST_MAX: u32 = KEYS_MAX as u32;
/// Smallest encoded key in a list response: five strings, two lists, two i64.
const KEY_INFO_WIRE_MIN: usize = 3 * STRING_WIRE_MIN + 2 * 4 + 2 * 8;

/// A key request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRequest<'a> {
    Create {
        name: &'a str,
        role: &'a str,
        topics: Vec<&'a str>,
        groups: Vec<&'a str>,
    },
    List,
    Revoke {
        id: &'a str,
    },
}

impl KeyRequest<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            KeyRequest::Create { .. } => ApiKey::KeyCreate,
            KeyRequest::List => ApiKey::KeyList,
            KeyRequest::Revoke { .. } => ApiKey::KeyRevoke,
        }
    }
}

/// One key in a list response (never its secret or hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub role: &'a str,
    pub topics: Vec<&'a str>,
    pub groups: Vec<&'a str>,
    pub created_ms: i64,
    /// -1: never used.
    pub last_used_ms: i64,
}

/// The body of a successful key response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyResponse<'a> {
    Created {
        id: &'a str,
        token: &'a str,
        created_ms: i64,
    },
    List {
        keys: Vec<KeyInfo<'a>>,
    },
    Revoked,
}

impl KeyResponse<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            KeyResponse::Created { .. } => ApiKey::KeyCreate,
            KeyResponse::List { .. } => ApiKey::KeyList,
            KeyResponse::Revoked => ApiKey::KeyRevoke,
        }
    }
}

fn put_list(out: &mut Vec<u8>, field: &'static str, items: &[&str]) -> Result<(), ProtocolError> {
    put_count(out, field, items.len(), PATTERNS_MAX)?;
    for p in items {
        put_str(out, field, p, PATTERN_BYTES_MAX)?;
    }
    Ok(())
}

impl<'a> Reader<'a> {
    fn patterns(&mut self, field: &'static str) -> Result<Vec<&'a str>, ProtocolError> {
        let n = self.count(field, PATTERNS_MAX, STRING_WIRE_MIN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.str(field, PATTERN_BYTES_MAX)?);
        }
        Ok(v)
    }
}

/// The handshake's optional token (after the two versions).
pub(super) fn put_token(out: &mut Vec<u8>, token: Option<&str>) -> Result<(), ProtocolError> {
    match token {
        Some(t) => put_str(out, "token", t, TOKEN_BYTES_MAX),
        None => Ok(()),
    }
}

/// Reads the token if bytes remain; a token from a client offering less than
/// version 3 is refused (as trailing bytes).
pub(super) fn read_token<'a>(
    r: &mut Reader<'a>,
    max_version: u16,
) -> Result<Option<&'a str>, ProtocolError> {
    if r.remaining() == 0 {
        return Ok(None);
    }
    // Fewer bytes than a length field are stray bytes, not a token.
    if max_version < KEYS_VERSION || r.remaining() < STRING_WIRE_MIN {
        return Err(ProtocolError::Trailing {
            at: r.at,
            count: r.remaining(),
        });
    }
    Ok(Some(r.str("token", TOKEN_BYTES_MAX)?))
}

pub(super) fn encode_request(out: &mut Vec<u8>, req: &KeyRequest<'_>) -> Result<(), ProtocolError> {
    match req {
        KeyRequest::Create {
            name,
            role,
            topics,
            groups,
        } => {
            put_str(out, "name", name, KEY_NAME_BYTES_MAX)?;
            put_str(out, "role", role, ROLE_BYTES_MAX)?;
            put_list(out, "topics", topics)?;
            put_list(out, "groups", groups)?;
        }
        KeyRequest::List => {}
        KeyRequest::Revoke { id } => put_str(out, "id", id, KEY_ID_LEN)?,
    }
    Ok(())
}

pub(super) fn decode_request<'a>(
    api: ApiKey,
    r: &mut Reader<'a>,
) -> Result<KeyRequest<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::KeyCreate => KeyRequest::Create {
            name: r.str("name", KEY_NAME_BYTES_MAX)?,
            role: r.str("role", ROLE_BYTES_MAX)?,
            topics: r.patterns("topics")?,
            groups: r.patterns("groups")?,
        },
        ApiKey::KeyRevoke => KeyRequest::Revoke {
            id: r.str("id", KEY_ID_LEN)?,
        },
        _ => KeyRequest::List,
    })
}

pub(super) fn encode_response(
    out: &mut Vec<u8>,
    body: &KeyResponse<'_>,
) -> Result<(), ProtocolError> {
    match body {
        KeyResponse::Created {
            id,
            token,
            created_ms,
        } => {
            put_str(out, "id", id, KEY_ID_LEN)?;
            put_str(out, "token", token, TOKEN_BYTES_MAX)?;
            out.extend_from_slice(&created_ms.to_be_bytes());
        }
        KeyResponse::List { keys } => {
            put_count(out, "keys", keys.len(), KEYS_LIST_MAX)?;
            for k in keys {
                put_str(out, "id", k.id, KEY_ID_LEN)?;
                put_str(out, "name", k.name, KEY_NAME_BYTES_MAX)?;
                put_str(out, "role", k.role, ROLE_BYTES_MAX)?;
                put_list(out, "topics", &k.topics)?;
                put_list(out, "groups", &k.groups)?;
                out.extend_from_slice(&k.created_ms.to_be_bytes());
                out.extend_from_slice(&k.last_used_ms.to_be_bytes());
            }
        }
        KeyResponse::Revoked => {}
    }
    Ok(())
}

pub(super) fn decode_response<'a>(
    api: ApiKey,
    r: &mut Reader<'a>,
) -> Result<KeyResponse<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::KeyCreate => KeyResponse::Created {
            id: r.str("id", KEY_ID_LEN)?,
            token: r.str("token", TOKEN_BYTES_MAX)?,
            created_ms: r.i64("created_ms")?,
        },
        ApiKey::KeyList => {
            let n = r.count("keys", KEYS_LIST_MAX, KEY_INFO_WIRE_MIN)?;
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(KeyInfo {
                    id: r.str("id", KEY_ID_LEN)?,
                    name: r.str("name", KEY_NAME_BYTES_MAX)?,
                    role: r.str("role", ROLE_BYTES_MAX)?,
                    topics: r.patterns("topics")?,
                    groups: r.patterns("groups")?,
                    created_ms: r.i64("created_ms")?,
                    last_used_ms: r.i64("last_used_ms")?,
                });
            }
            KeyResponse::List { keys }
        }
        _ => KeyResponse::Revoked,
    })
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::super::*;
    use super::{KeyInfo, KeyRequest, KeyResponse, PATTERNS_MAX, TOKEN_BYTES_MAX};

    #[test]
    fn golden_handshake_with_token() {
        let mut frame = Vec::new();
        let req = Request::Handshake {
            min_version: 1,
            max_version: 3,
            token: Some("tok"),
        };
        encode_request(&mut frame, 1, &req).unwrap();
        let expected: Vec<u8> = [
            &[0, 0, 0, 15][..],        // frame_len
            &[0, 0, 0, 1],             // request_id
            &[0, 0],                   // api_key handshake
            &[0, 1, 0, 3],             // min_version, max_version
            &[0, 3, b't', b'o', b'k'], // token
        ]
        .concat();
        assert_eq!(frame, expected);
        assert_eq!(decode_request(&frame[4..]).unwrap(), (1, req));
        // Without a token the frame is the version-1 handshake.
        let mut plain = Vec::new();
        let req = Request::Handshake {
            min_version: 1,
            max_version: 3,
            token: None,
        };
        encode_request(&mut plain, 1, &req).unwrap();
        assert_eq!(plain.len(), 4 + 10);
        assert_eq!(decode_request(&plain[4..]).unwrap(), (1, req));
        // A token from a client offering only version 2 is refused.
        let mut old = expected.clone();
        old[13] = 2;
        assert!(matches!(
            decode_request(&old[4..]),
            Err(ProtocolError::Trailing { .. })
        ));
        // A token over the limit is refused before it is read.
        let mut long = expected[4..10].to_vec();
        long.extend_from_slice(&[0, 1, 0, 3]);
        long.extend_from_slice(&((TOKEN_BYTES_MAX + 1) as u16).to_be_bytes());
        assert!(matches!(
            decode_request(&long),
            Err(ProtocolError::TooLong { field: "token", .. })
        ));
    }

    #[test]
    fn key_requests_round_trip() {
        let reqs = [
            Request::Key(KeyRequest::Create {
                name: "app",
                role: "producer",
                topics: vec!["orders.*", "audit"],
                groups: vec![],
            }),
            Request::Key(KeyRequest::List),
            Request::Key(KeyRequest::Revoke {
                id: "0123456789abcdef",
            }),
        ];
        for (i, req) in (1u32..).zip(reqs) {
            let mut frame = Vec::new();
            encode_request(&mut frame, i, &req).unwrap();
            assert_eq!(decode_request(&frame[4..]).unwrap(), (i, req));
        }
        let bodies = [
            KeyResponse::Created {
                id: "0123456789abcdef",
                token: "sgk_x",
                created_ms: 5,
            },
            KeyResponse::List {
                keys: vec![KeyInfo {
                    id: "0123456789abcdef",
                    name: "app",
                    role: "consumer",
                    topics: vec!["t"],
                    groups: vec!["g*"],
                    created_ms: 1,
                    last_used_ms: -1,
                }],
            },
            KeyResponse::Revoked,
        ];
        for body in bodies {
            let body = ResponseBody::Key(body);
            let mut frame = Vec::new();
            let api = body.api_key() as u16;
            encode_response(&mut frame, 9, api, ErrorCode::NONE, "", Some(&body)).unwrap();
            let r = decode_response(&frame[4..]).unwrap();
            assert_eq!(r.body, Some(body));
        }
    }

    #[test]
    fn pattern_count_is_checked() {
        let mut b = vec![0, 0, 0, 1, 0, 60, 0, 1, b'a', 0, 5];
        b.extend_from_slice(b"admin");
        b.extend_from_slice(&(PATTERNS_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooMany {
                field: "topics",
                ..
            })
        ));
    }
}
