//! `DATA/api_keys.json`: the broker's API keys, and the token a client presents.
//!
//! ```text
//! {"format": 1,
//!  "keys": [{"id": "3f9a0c1d2e4b5a69", "name": "billing", "role": "producer",
//!            "topics": ["orders.*"], "groups": [],
//!            "created_ms": 1764590000000, "last_used_ms": -1,
//!            "secret_sha256": "<64 lowercase hex digits>"}]}
//! ```
//!
//! A token is `sgk_<id>_<secret>`: `id` is [`KEY_ID_LEN`] lowercase hex digits,
//! `secret` is [`SECRET_BYTES`] random bytes from the operating system, base64url
//! without padding (43 characters). The file holds only the SHA-256 of the secret,
//! never the secret. A fast hash is right here, unlike for passwords: a secret is 256
//! random bits, so no dictionary helps and an exhaustive search of 2^256 values is out
//! of reach whatever a hash costs; a slow hash (bcrypt, Argon2) only guards low-entropy
//! input, and would make every login cost milliseconds of broker CPU.
//!
//! Invariants checked by [`decode_keys`]: `format` is 1; at most [`KEYS_MAX`] keys;
//! ids are well-formed and unique; names are 1..=[`KEY_NAME_BYTES_MAX`] bytes of
//! `[A-Za-z0-9._-]`; `role` is one of [`Role`]; each key has at most
//! [`PATTERNS_PER_KEY_MAX`] topic and group patterns, each a valid glob of at most
//! [`PATTERN_BYTES_MAX`] bytes; `secret_sha256` is 64 lowercase hex digits;
//! `last_used_ms` is -1 (never) or a time. Unknown keys are refused.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The file's name in the data directory.
pub const KEYS_FILE: &str = "api_keys.json";
/// The `format` this build reads and writes.
pub const KEYS_FORMAT: u32 = 1;
/// Largest `api_keys.json` any reader accepts (16 MiB).
pub const KEYS_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Most keys in the file.
pub const KEYS_MAX: usize = 10_000;
/// Most topic patterns, and most group patterns, of one key.
pub const PATTERNS_PER_KEY_MAX: usize = 64;
/// Longest pattern.
pub const PATTERN_BYTES_MAX: usize = 256;
/// Longest key name.
pub const KEY_NAME_BYTES_MAX: usize = 128;
/// Random bytes in a key id.
pub const KEY_ID_BYTES: usize = 8;
/// Characters of a key id (hex).
pub const KEY_ID_LEN: usize = KEY_ID_BYTES * 2;
/// Random bytes in a secret.
pub const SECRET_BYTES: usize = 32;
/// Characters of a secret in a token (base64url, no padding).
pub const SECRET_TEXT_LEN: usize = 43;
/// What every token starts with.
pub const TOKEN_PREFIX: &str = "sgk_";
/// Length of a well-formed token.
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + KEY_ID_LEN + 1 + SECRET_TEXT_LEN;
/// Longest token accepted anywhere (the wire's limit; longer ones are refused unread).
pub const TOKEN_BYTES_MAX: usize = 256;
/// Characters of a SHA-256 in hex.
pub const HASH_HEX_LEN: usize = 64;

const _: () = assert!(TOKEN_LEN <= TOKEN_BYTES_MAX);
const _: () = assert!(SECRET_TEXT_LEN == (SECRET_BYTES * 8).div_ceil(6));

/// What a key may do (docs/PROTOCOL.md, "Authentication"): a producer produces to
/// and reads the metadata of its topics; a consumer fetches, lists offsets and uses
/// the consumer groups of its topics and groups; an admin may do everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Producer,
    Consumer,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Producer, Role::Consumer, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One key as the file holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub topics: Vec<String>,
    pub groups: Vec<String>,
    pub created_ms: i64,
    /// -1: never used.
    pub last_used_ms: i64,
    /// SHA-256 of the secret's raw bytes, lowercase hex.
    pub secret_sha256: String,
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysDoc {
    pub format: u32,
    pub keys: Vec<KeyEntry>,
}

impl Default for KeysDoc {
    fn default() -> Self {
        KeysDoc {
            format: KEYS_FORMAT,
            keys: Vec::new(),
        }
    }
}

/// Why `api_keys.json` bytes, or a field of a new key, are not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeysFileError {
    #[error("{len} bytes is over the limit of {KEYS_FILE_BYTES_MAX}")]
    TooLarge { len: u64 },
    #[error("not valid JSON of the keys file: {0}")]
    Json(String),
    #[error("format {0} is not {KEYS_FORMAT}")]
    Format(u32),
    #[error("{count} keys is over the limit of {KEYS_MAX}")]
    TooManyKeys { count: usize },
    #[error("key id {id:?} appears twice")]
    DuplicateId { id: String },
    #[error("key {id:?}: {detail}")]
    BadKey { id: String, detail: String },
}

/// Why a token is not well-formed (said without revealing which part is wrong to a
/// peer: the broker answers every one of these as a failed login).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("a token is {TOKEN_LEN} characters: sgk_<id>_<secret>")]
    Malformed,
}

/// Parses and checks the file's bytes.
pub fn decode_keys(bytes: &[u8]) -> Result<KeysDoc, KeysFileError> {
    if bytes.len() as u64 > KEYS_FILE_BYTES_MAX {
        return Err(KeysFileError::TooLarge {
            len: bytes.len() as u64,
        });
    }
    let doc: KeysDoc =
        serde_json::from_slice(bytes).map_err(|e| KeysFileError::Json(e.to_string()))?;
    if doc.format != KEYS_FORMAT {
        return Err(KeysFileError::Format(doc.format));
    }
    if doc.keys.len() > KEYS_MAX {
        return Err(KeysFileError::TooManyKeys {
            count: doc.keys.len(),
        });
    }
    let mut ids = std::collections::HashSet::with_capacity(doc.keys.len());
    for k in &doc.keys {
        check_entry(k).map_err(|detail| KeysFileError::BadKey {
            id: k.id.clone(),
            detail,
        })?;
        if !ids.insert(k.id.as_str()) {
            return Err(KeysFileError::DuplicateId { id: k.id.clone() });
        }
    }
    Ok(doc)
}

/// The file's bytes: pretty JSON and a final newline.
pub fn encode_keys(doc: &KeysDoc) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(doc).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Checks one key as the file decoder does (id, name, patterns, hash).
pub fn check_entry(k: &KeyEntry) -> Result<(), String> {
    if !is_key_id(&k.id) {
        return Err(format!("the id is not {KEY_ID_LEN} lowercase hex digits"));
    }
    check_key_name(&k.name)?;
    check_patterns("topic", &k.topics)?;
    check_patterns("group", &k.groups)?;
    if k.last_used_ms < -1 {
        return Err(format!("last_used_ms {} is below -1", k.last_used_ms));
    }
    if decode_hash(&k.secret_sha256).is_none() {
        return Err(format!(
            "secret_sha256 is not {HASH_HEX_LEN} lowercase hex digits"
        ));
    }
    Ok(())
}

/// Whether `id` is [`KEY_ID_LEN`] lowercase hex digits.
pub fn is_key_id(id: &str) -> bool {
    id.len() == KEY_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A key name: 1..=[`KEY_NAME_BYTES_MAX`] bytes of `[A-Za-z0-9._-]`.
pub fn check_key_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > KEY_NAME_BYTES_MAX {
        return Err(format!(
            "a key name is 1 to {KEY_NAME_BYTES_MAX} characters, not {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "key name {name:?} has {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Checks a list of topic or group patterns (`what` names them in the message).
pub fn check_patterns(what: &str, patterns: &[String]) -> Result<(), String> {
    if patterns.len() > PATTERNS_PER_KEY_MAX {
        return Err(format!(
            "{} {what} patterns is over the limit of {PATTERNS_PER_KEY_MAX}",
            patterns.len()
        ));
    }
    for p in patterns {
        compile_pattern(p).map_err(|e| format!("{what} pattern {p:?}: {e}"))?;
    }
    Ok(())
}

/// Compiles one glob pattern (`*`, `?`, `[…]`; a name has no `/`, so `*` matches any
/// run of characters).
pub fn compile_pattern(p: &str) -> Result<glob::Pattern, String> {
    if p.is_empty() || p.len() > PATTERN_BYTES_MAX {
        return Err(format!(
            "a pattern is 1 to {PATTERN_BYTES_MAX} bytes, not {}",
            p.len()
        ));
    }
    glob::Pattern::new(p).map_err(|e| e.to_string())
}

/// SHA-256 of a secret's raw bytes.
pub fn hash_secret(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// Lowercase hex of a hash.
pub fn encode_hash(hash: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(HASH_HEX_LEN);
    for b in hash {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The hash of a `secret_sha256` field, if it is 64 lowercase hex digits.
pub fn decode_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != HASH_HEX_LEN {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
        let hi = hex_digit(*pair.first()?)?;
        let lo = hex_digit(*pair.get(1)?)?;
        *slot = hi << 4 | lo;
    }
    Some(out)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex of a key id's random bytes.
pub fn encode_key_id(bytes: &[u8; KEY_ID_BYTES]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(KEY_ID_LEN);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The token for key `id` and its secret.
pub fn format_token(id: &str, secret: &[u8; SECRET_BYTES]) -> String {
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    format!("{TOKEN_PREFIX}{id}_{text}")
}

/// Splits a token into its key id and secret bytes. Surrounding whitespace (a token
/// file's final newline) is ignored.
pub fn parse_token(token: &str) -> Result<(&str, [u8; SECRET_BYTES]), TokenError> {
    let token = token.trim();
    if token.len() != TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let rest = token
        .strip_prefix(TOKEN_PREFIX)
        .ok_or(TokenError::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(TokenError::Malformed)?;
    if !is_key_id(id) || secret.len() != SECRET_TEXT_LEN {
        return Err(TokenError::Malformed);
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(secret)
        .map_err(|_| TokenError::Malformed)?;
    let secret: [u8; SECRET_BYTES] = bytes.try_into().map_err(|_| TokenError::Malformed)?;
    Ok((id, secret))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn entry() -> KeyEntry {
        KeyEntry {
            id: "0123456789abcdef".into(),
            name: "billing".into(),
            role: Role::Producer,
            topics: vec!["orders.*".into()],
            groups: vec![],
            created_ms: 1,
            last_used_ms: -1,
            secret_sha256: encode_hash(&hash_secret(b"x")),
        }
    }

    #[test]
    fn round_trip_and_checks() {
        let doc = KeysDoc {
            format: KEYS_FORMAT,
            keys: vec![entry()],
        };
        let bytes = encode_keys(&doc);
        assert_eq!(decode_keys(&bytes).unwrap(), doc);
        let text = String::from_utf8(bytes).unwrap();
        for (from, to) in [
            ("\"format\": 1", "\"format\": 2"),
            ("\"producer\"", "\"root\""),
            ("\"billing\"", "\"bill ing\""),
            ("\"orders.*\"", "\"[\""),
            ("0123456789abcdef", "0123456789ABCDEF"),
            ("\"last_used_ms\": -1", "\"last_used_ms\": -2"),
            ("\"created_ms\": 1", "\"created_ms\": 1, \"extra\": 0"),
        ] {
            let bad = text.replace(from, to);
            assert_ne!(bad, text);
            assert!(decode_keys(bad.as_bytes()).is_err(), "{to}");
        }
        let mut two = doc.clone();
        two.keys.push(entry());
        assert!(matches!(
            decode_keys(&encode_keys(&two)),
            Err(KeysFileError::DuplicateId { .. })
        ));
        let mut short = doc;
        short.keys[0].secret_sha256.pop();
        assert!(matches!(
            decode_keys(&encode_keys(&short)),
            Err(KeysFileError::BadKey { .. })
        ));
    }

    #[test]
    fn tokens() {
        let secret = [7u8; SECRET_BYTES];
        let token = format_token("0123456789abcdef", &secret);
        assert_eq!(token.len(), TOKEN_LEN);
        assert!(token.starts_with("sgk_0123456789abcdef_"));
        assert_eq!(
            parse_token(&format!("{token}\n")).unwrap(),
            ("0123456789abcdef", secret)
        );
        for bad in [
            "",
            "sgk_",
            &token[..token.len() - 1],
            &token.replace("sgk_", "sgx_"),
            &token.replace("0123456789abcdef", "0123456789abcdeg"),
            &format!("{token}A"),
        ] {
            assert_eq!(parse_token(bad), Err(TokenError::Malformed), "{bad}");
        }
        // Base64url may put '_' in the secret: the id ends at the first one.
        let underscores = format_token("0123456789abcdef", &[0xff; SECRET_BYTES]);
        assert!(underscores[21..].contains('_'));
        assert_eq!(parse_token(&underscores).unwrap().1, [0xff; SECRET_BYTES]);
    }

    #[test]
    fn hashes_and_patterns() {
        let h = hash_secret(b"abc");
        assert_eq!(
            encode_hash(&h),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(decode_hash(&encode_hash(&h)), Some(h));
        assert_eq!(decode_hash(&"G".repeat(64)), None);
        let p = compile_pattern("orders.*").unwrap();
        assert!(p.matches("orders.eu") && !p.matches("order"));
        assert!(compile_pattern("").is_err());
        assert!(compile_pattern(&"a".repeat(PATTERN_BYTES_MAX + 1)).is_err());
        assert!(check_key_name("ok.name-1_x").is_ok());
        assert!(check_key_name("no/slash").is_err());
    }
}
