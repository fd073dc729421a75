//! The schema-registry requests of protocol version 3 (docs/PROTOCOL.md, Version 3):
//! their payloads and response bodies. `text` = u32 length + UTF-8, at most
//! [`SCHEMA_TEXT_BYTES_MAX`] bytes.
//!
//! ```text
//! schema_register  topic string, compatibility string ("" = keep), schema text
//!                → version u32
//! schema_get       topic string, version u32 (0 = latest)
//!                → version u32, compatibility string, schema text
//! schema_list      (empty)
//!                → count u32, then per topic: topic string, compatibility string,
//!                  versions count u32, version u32 …
//! schema_check     topic string, schema text
//!                → compatible u8 (0 or 1), reason string
//! schema_delete    topic string, version u32 (0 = every version)
//!                → count u32, version u32 …
//! ```

use super::{
    put_count, put_str, ProtocolError, Reader, Request, ResponseBody, MESSAGE_BYTES_MAX,
    STRING_WIRE_MIN, TOPICS_MAX, TOPIC_BYTES_MAX,
};
use crate::format::schemas::{SCHEMA_BYTES_MAX, VERSIONS_PER_TOPIC_MAX};

/// The first protocol version with the schema requests and error codes.
pub const SCHEMAS_VERSION: u16 = 3;
/// Longest schema text.
pub const SCHEMA_TEXT_BYTES_MAX: usize = SCHEMA_BYTES_MAX;
/// Longest compatibility name.
pub const COMPATIBILITY_BYTES_MAX: usize = 16;
/// Most versions in a list or delete response.
pub const SCHEMA_VERSIONS_MAX: u32 = VERSIONS_PER_TOPIC_MAX as u32;

const _: () = assert!(SCHEMA_TEXT_BYTES_MAX <= u32::MAX as usize);
const SUBJECT_WIRE_MIN: usize = STRING_WIRE_MIN + STRING_WIRE_MIN + 4;

/// One topic in a schema-list response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaSubjectInfo<'a> {
    pub topic: &'a str,
    pub compatibility: &'a str,
    pub versions: Vec<u32>,
}

fn put_text(out: &mut Vec<u8>, field: &'static str, s: &str) -> Result<(), ProtocolError> {
    if s.len() > SCHEMA_TEXT_BYTES_MAX {
        return Err(ProtocolError::Unencodable {
            field,
            len: s.len() as u64,
            max: SCHEMA_TEXT_BYTES_MAX as u64,
        });
    }
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_versions(out: &mut Vec<u8>, versions: &[u32]) -> Result<(), ProtocolError> {
    put_count(out, "versions", versions.len(), SCHEMA_VERSIONS_MAX)?;
    for v in versions {
        out.extend_from_slice(&v.to_be_bytes());
    }
    Ok(())
}

impl<'a> Reader<'a> {
    fn text(&mut self, field: &'static str) -> Result<&'a str, ProtocolError> {
        let at = self.at;
        let len = self.u32(field)? as usize;
        if len > SCHEMA_TEXT_BYTES_MAX {
            return Err(ProtocolError::TooLong {
                field,
                at,
                len: len as u64,
                max: SCHEMA_TEXT_BYTES_MAX as u64,
            });
        }
        let bytes = self.take(field, len)?;
        std::str::from_utf8(bytes).map_err(|_| ProtocolError::BadUtf8 { field, at: at + 4 })
    }

    fn versions(&mut self) -> Result<Vec<u32>, ProtocolError> {
        let n = self.count("versions", SCHEMA_VERSIONS_MAX, 4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u32("version")?);
        }
        Ok(v)
    }
}

/// Encodes the payload of a schema request; `false` if `req` is not one.
pub(super) fn encode_request(out: &mut Vec<u8>, req: &Request<'_>) -> Result<bool, ProtocolError> {
    match req {
        Request::SchemaRegister {
            topic,
            compatibility,
            schema,
        } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            put_str(out, "compatibility", compatibility, COMPATIBILITY_BYTES_MAX)?;
            put_text(out, "schema", schema)?;
        }
        Request::SchemaGet { topic, version } | Request::SchemaDelete { topic, version } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            out.extend_from_slice(&version.to_be_bytes());
        }
        Request::SchemaList => {}
        Request::SchemaCheck { topic, schema } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            put_text(out, "schema", schema)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

pub(super) fn decode_register<'a>(r: &mut Reader<'a>) -> Result<Request<'a>, ProtocolError> {
    Ok(Request::SchemaRegister {
        topic: r.str("topic", TOPIC_BYTES_MAX)?,
        compatibility: r.str("compatibility", COMPATIBILITY_BYTES_MAX)?,
        schema: r.text("schema")?,
    })
}

pub(super) fn decode_get<'a>(r: &mut Reader<'a>) -> Result<Request<'a>, ProtocolError> {
    Ok(Request::SchemaGet {
        topic: r.str("topic", TOPIC_BYTES_MAX)?,
        version: r.u32("version")?,
    })
}

pub(super) fn decode_check<'a>(r: &mut Reader<'a>) -> Result<Request<'a>, ProtocolError> {
    Ok(Request::SchemaCheck {
        topic: r.str("topic", TOPIC_BYTES_MAX)?,
        schema: r.text("schema")?,
    })
}

pub(super) fn decode_delete<'a>(r: &mut Reader<'a>) -> Result<Request<'a>, ProtocolError> {
    Ok(Request::SchemaDelete {
        topic: r.str("topic", TOPIC_BYTES_MAX)?,
        version: r.u32("version")?,
    })
}

/// Encodes the body of a schema response; `false` if `body` is not one.
pub(super) fn encode_body(
    out: &mut Vec<u8>,
    body: &ResponseBody<'_>,
) -> Result<bool, ProtocolError> {
    match body {
        ResponseBody::SchemaRegister { version } => out.extend_from_slice(&version.to_be_bytes()),
        ResponseBody::SchemaGet {
            version,
            compatibility,
            schema,
        } => {
            out.extend_from_slice(&version.to_be_bytes());
            put_str(out, "compatibility", compatibility, COMPATIBILITY_BYTES_MAX)?;
            put_text(out, "schema", schema)?;
        }
        ResponseBody::SchemaList { topics } => {
            put_count(out, "topics", topics.len(), TOPICS_MAX)?;
            for t in topics {
                put_str(out, "topic", t.topic, TOPIC_BYTES_MAX)?;
                put_str(
                    out,
                    "compatibility",
                    t.compatibility,
                    COMPATIBILITY_BYTES_MAX,
                )?;
                put_versions(out, &t.versions)?;
            }
        }
        ResponseBody::SchemaCheck { compatible, reason } => {
            out.push(u8::from(*compatible));
            put_str(
                out,
                "reason",
                super::clip(reason, MESSAGE_BYTES_MAX),
                MESSAGE_BYTES_MAX,
            )?;
        }
        ResponseBody::SchemaDelete { versions } => put_versions(out, versions)?,
        _ => return Ok(false),
    }
    Ok(true)
}

pub(super) fn decode_register_body<'a>(
    r: &mut Reader<'a>,
) -> Result<ResponseBody<'a>, ProtocolError> {
    Ok(ResponseBody::SchemaRegister {
        version: r.u32("version")?,
    })
}

pub(super) fn decode_get_body<'a>(r: &mut Reader<'a>) -> Result<ResponseBody<'a>, ProtocolError> {
    Ok(ResponseBody::SchemaGet {
        version: r.u32("version")?,
        compatibility: r.str("compatibility", COMPATIBILITY_BYTES_MAX)?,
        schema: r.text("schema")?,
    })
}

pub(super) fn decode_list_body<'a>(r: &mut Reader<'a>) -> Result<ResponseBody<'a>, ProtocolError> {
    let n = r.count("topics", TOPICS_MAX, SUBJECT_WIRE_MIN)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        topics.push(SchemaSubjectInfo {
            topic: r.str("topic", TOPIC_BYTES_MAX)?,
            compatibility: r.str("compatibility", COMPATIBILITY_BYTES_MAX)?,
            versions: r.versions()?,
        });
    }
    Ok(ResponseBody::SchemaList { topics })
}

pub(super) fn decode_check_body<'a>(r: &mut Reader<'a>) -> Result<ResponseBody<'a>, ProtocolError> {
    let at = r.at;
    let compatible = match r.array::<1>("compatible")? {
        [0] => false,
        [1] => true,
        [v] => {
            return Err(ProtocolError::BadValue {
                field: "compatible",
                at,
                value: i64::from(v),
            })
        }
    };
    Ok(ResponseBody::SchemaCheck {
        compatible,
        reason: r.str("reason", MESSAGE_BYTES_MAX)?,
    })
}

pub(super) fn decode_delete_body<'a>(
    r: &mut Reader<'a>,
) -> Result<ResponseBody<'a>, ProtocolError> {
    Ok(ResponseBody::SchemaDelete {
        versions: r.versions()?,
    })
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::super::*;
    use super::{SCHEMA_TEXT_BYTES_MAX, SCHEMA_VERSIONS_MAX};

    #[test]
    fn golden_schema_register_request() {
        let mut frame = Vec::new();
        let req = Request::SchemaRegister {
            topic: "t",
            compatibility: "full",
            schema: "{}",
        };
        encode_request(&mut frame, 3, &req).unwrap();
        let expected: Vec<u8> = [
            &[0, 0, 0, 21][..],              // frame_len
            &[0, 0, 0, 3],                   // request_id
            &[0, 50],                        // api_key schema_register
            &[0, 1, b't'],                   // topic
            &[0, 4, b'f', b'u', b'l', b'l'], // compatibility
            &[0, 0, 0, 2, b'{', b'}'],       // schema text
        ]
        .concat();
        assert_eq!(frame, expected);
        assert_eq!(decode_request(&frame[4..]).unwrap(), (3, req));
    }

    #[test]
    fn limits_are_checked_before_allocating() {
        // A schema text length over the limit.
        let mut b = vec![0, 0, 0, 1, 0, 53, 0, 1, b't'];
        b.extend_from_slice(&(SCHEMA_TEXT_BYTES_MAX as u32 + 1).to_be_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::TooLong {
                field: "schema",
                ..
            })
        ));
        // A versions count over the limit in a delete response.
        let mut b = vec![0, 0, 0, 1, 0, 54, 0, 0, 0, 0];
        b.extend_from_slice(&(SCHEMA_VERSIONS_MAX + 1).to_be_bytes());
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::TooMany {
                field: "versions",
                ..
            })
        ));
        // `compatible` other than 0 or 1.
        let b = [0, 0, 0, 1, 0, 53, 0, 0, 0, 0, 2, 0, 0];
        assert!(matches!(
            decode_response(&b),
            Err(ProtocolError::BadValue {
                field: "compatible",
                ..
            })
        ));
        let long = "x".repeat(SCHEMA_TEXT_BYTES_MAX + 1);
        let mut out = Vec::new();
        let req = Request::SchemaCheck {
            topic: "t",
            schema: &long,
        };
        assert!(encode_request(&mut out, 1, &req).is_err());
        assert!(out.is_empty());
    }
}
