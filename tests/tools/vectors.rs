//! The format module against the vectors of an independent encoder
//! (tests/fixtures/vectors): decode every vector to its fields and re-encode the
//! fields to the same bytes; `dump` of the vector partition matches the expected
//! JSON Lines field by field.

use std::path::PathBuf;

use serde_json::Value;

use seglog::format::{crc32, decode_record, encode_record, SegmentHeader};

use crate::util::bin::seglog;
use crate::util::build::unhex;
use crate::util::fs::fixture;

fn vectors() -> PathBuf {
    fixture("vectors")
}

fn records_json() -> Value {
    serde_json::from_slice(&std::fs::read(vectors().join("records.json")).unwrap()).unwrap()
}

#[test]
fn crc_check_value() {
    let v = records_json();
    let input = v["crc_check"]["input_ascii"].as_str().unwrap();
    let want = u32::from_str_radix(v["crc_check"]["crc32"].as_str().unwrap(), 16).unwrap();
    assert_eq!(crc32(input.as_bytes()), want);
    assert_eq!(want, 0xCBF4_3926);
}

#[test]
fn headers_decode_and_re_encode() {
    let v = records_json();
    let headers = v["headers"].as_array().unwrap();
    assert_eq!(headers.len(), 3);
    for h in headers {
        let bytes = unhex(h["bytes_hex"].as_str().unwrap());
        let d = SegmentHeader::decode(&bytes).unwrap();
        assert_eq!(d.base_offset, h["base_offset"].as_u64().unwrap());
        assert_eq!(d.generation, h["generation"].as_u64().unwrap());
        assert_eq!(d.flags, 0);
        assert_eq!(d.is_spare(), h.get("note").is_some(), "{h}");
        let again = SegmentHeader {
            base_offset: d.base_offset,
            generation: d.generation,
            flags: 0,
        }
        .encode();
        assert_eq!(again.to_vec(), bytes, "{h}");
    }
}

#[test]
fn records_decode_and_re_encode() {
    let v = records_json();
    let records = v["records"].as_array().unwrap();
    assert_eq!(records.len(), 8);
    for r in records {
        let name = r["name"].as_str().unwrap();
        let bytes = unhex(r["bytes_hex"].as_str().unwrap());
        let generation = r["generation"].as_u64().unwrap();
        let key = r["key_hex"].as_str().map(unhex);
        let value = unhex(r["value_hex"].as_str().unwrap());
        let d = decode_record(&bytes, 0, generation).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.offset, r["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(
            d.timestamp_ms,
            r["timestamp_ms"].as_i64().unwrap(),
            "{name}"
        );
        assert_eq!(d.key, key.as_deref(), "{name}");
        assert_eq!(d.value, &value[..], "{name}");
        assert_eq!(d.encoded_len, bytes.len(), "{name}");
        let mut again = Vec::new();
        let n = encode_record(
            &mut again,
            d.offset,
            d.timestamp_ms,
            key.as_deref(),
            &value,
            generation,
        )
        .unwrap();
        assert_eq!(n, bytes.len(), "{name}");
        assert_eq!(again, bytes, "{name}");
        // Under any other generation the same bytes do not pass.
        assert!(decode_record(&bytes, 0, generation ^ 1).is_err(), "{name}");
    }
}

#[test]
fn dump_of_the_vector_partition_matches_the_expected_lines() {
    let expected: Vec<Value> = std::fs::read_to_string(vectors().join("partition.expected.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let out = seglog()
        .args(["dump", "--json", "--bytes", "hex"])
        .arg(vectors().join("partition"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let got: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(got.iter().all(|l| l["type"] == "record"));
    assert_eq!(got.len(), expected.len());
    assert_eq!(got.len(), 700);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        for (gf, ef) in [
            ("position", "position"),
            ("offset", "offset"),
            ("timestamp_ms", "timestamp_ms"),
            ("key", "key_hex"),
            ("value", "value_hex"),
            ("base_offset", "base_offset"),
        ] {
            assert_eq!(g[gf], e[ef], "line {i}: {gf}");
        }
        let segment = format!("{:020}.log", e["base_offset"].as_u64().unwrap());
        assert_eq!(g["path"], segment, "line {i}");
    }
}
