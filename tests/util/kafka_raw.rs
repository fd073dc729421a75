//! One Kafka request by hand, for tests that need a request or an answer no client
//! library gives them as is: the frame written on a connection, the response frame
//! read back (checked against a limit) and its header decoded.

use std::io::{Read, Write};
use std::net::TcpStream;

use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::serve::PATIENCE;

/// Longest response frame read back.
const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// Sends a request of `key` at `version` whose body `body` encodes, on `conn`, and
/// returns the response body after its header.
pub fn call(
    conn: &mut TcpStream,
    key: ApiKey,
    version: i16,
    body: impl FnOnce(&mut bytes::BytesMut, i16),
) -> bytes::Bytes {
    let mut b = bytes::BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("test")))
        .encode(&mut b, key.request_header_version(version))
        .unwrap();
    body(&mut b, version);
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    conn.write_all(&u32::try_from(b.len()).unwrap().to_be_bytes())
        .unwrap();
    conn.write_all(&b).unwrap();
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).unwrap();
    let n = u32::from_be_bytes(len) as usize;
    assert!(n <= RESPONSE_BYTES_MAX, "a {n}-byte {key:?} response");
    let mut body = vec![0u8; n];
    conn.read_exact(&mut body).unwrap();
    let mut body = bytes::Bytes::from(body);
    ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
    body
}
