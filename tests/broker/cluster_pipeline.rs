//! Pipelined produce to a replicated topic, on three real `seglog serve` processes: a
//! client sends many produce requests to the leader of a factor-3 partition before
//! reading any answer; each request's entry is queued to the partition's Raft group
//! as it is read, so the answers come in request order with offsets in request order,
//! every record is where its answer says, and the leader's Raft log takes many of
//! the requests in one write instead of one write (and one fsync) per request. The
//! same requests pipelined to a follower are each refused in order, naming the
//! leader, and write nothing.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use seglog::engine::net::client::{read_frame, Client};
use seglog::format::wire::{
    decode_response, encode_request, ErrorCode, PartitionBatch, Request, ResponseBody, WireRecord,
    PROTOCOL_VERSION,
};

use crate::util::cluster::Cluster;

const TOPIC: &str = "piped";
const REQUESTS: u32 = 40;
const RECORDS_PER_REQUEST: u32 = 3;

fn value(request: u32, record: u32) -> Vec<u8> {
    format!("request {request} record {record}").into_bytes()
}

/// Fsyncs the node has made (its stats).
fn fsyncs(addr: &str) -> u64 {
    Client::connect(addr, Duration::from_secs(10))
        .unwrap()
        .stats()
        .unwrap()
        .fsyncs
}

/// Opens a connection to `addr` and sends `requests` produce requests (ids 100 and
/// up; request r carries `value(r, 0..RECORDS_PER_REQUEST)`) before reading anything.
fn pipeline(addr: &str, requests: u32) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let hello = Request::Handshake {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        token: None,
    };
    encode_request(&mut out, 1, &hello).unwrap();
    s.write_all(&out).unwrap();
    let mut frame = Vec::new();
    read_frame(&mut s, &mut frame).unwrap();
    out.clear();
    for r in 0..requests {
        let values: Vec<Vec<u8>> = (0..RECORDS_PER_REQUEST).map(|i| value(r, i)).collect();
        let records = values
            .iter()
            .map(|v| WireRecord {
                timestamp_ms: -1,
                key: None,
                value: v,
            })
            .collect();
        let req = Request::Produce {
            topic: TOPIC,
            partitions: vec![PartitionBatch {
                partition: 0,
                records,
            }],
        };
        encode_request(&mut out, 100 + r, &req).unwrap();
    }
    s.write_all(&out).unwrap();
    s
}

#[test]
fn pipelined_produces_to_a_replicated_partition_are_logged_and_answered_in_order() {
    let mut c = Cluster::start_direct(3);
    c.create_topic(TOPIC, 1, 3);
    let leader = c.wait_leader(TOPIC, 0);
    let addr = c.node(leader).client_addr.clone();
    let before = fsyncs(&addr);

    let mut s = pipeline(&addr, REQUESTS);
    let mut frame = Vec::new();
    let mut next = 0u64;
    for r in 0..REQUESTS {
        read_frame(&mut s, &mut frame).unwrap();
        let resp = decode_response(&frame).unwrap();
        assert_eq!(resp.request_id, 100 + r, "answers come in request order");
        let Some(ResponseBody::Produce { partitions }) = resp.body else {
            panic!("request {r}: not a produce answer: {:?}", resp.code);
        };
        let ack = &partitions[0];
        assert!(ack.code.is_ok(), "request {r}: {ack:?}");
        assert_eq!(
            (ack.base_offset, ack.last_offset),
            (next, next + u64::from(RECORDS_PER_REQUEST) - 1),
            "request {r}: offsets in request order"
        );
        next = ack.last_offset + 1;
    }
    let logged = fsyncs(&addr) - before;

    let mut client = Client::connect(&addr, Duration::from_secs(10)).unwrap();
    let fetched = client
        .fetch(TOPIC, 0, 0, 1 << 20, Duration::from_secs(1))
        .unwrap();
    let got: Vec<(u64, Vec<u8>)> = fetched
        .records
        .into_iter()
        .map(|r| (r.offset, r.value))
        .collect();
    let want: Vec<(u64, Vec<u8>)> = (0..REQUESTS)
        .flat_map(|r| (0..RECORDS_PER_REQUEST).map(move |i| value(r, i)))
        .enumerate()
        .map(|(o, v)| (o as u64, v))
        .collect();
    assert_eq!(got, want);

    // One request at a time, each entry is written and fsynced in the leader's Raft
    // log on its own, and applied and its data fsynced, before the next is read: 80
    // fsyncs for these 40 requests (measured); pipelined, a few.
    assert!(
        logged < u64::from(REQUESTS),
        "{logged} fsyncs on the leader for {REQUESTS} pipelined requests"
    );

    // Pipelined to a follower: each request is refused in order, naming the leader,
    // and nothing is written.
    let follower = c.ids().into_iter().find(|&n| n != leader).unwrap();
    let mut s = pipeline(&c.node(follower).client_addr.clone(), 5);
    for r in 0..5 {
        read_frame(&mut s, &mut frame).unwrap();
        let resp = decode_response(&frame).unwrap();
        assert_eq!(resp.request_id, 100 + r, "answers come in request order");
        let Some(ResponseBody::Produce { partitions }) = resp.body else {
            panic!("request {r}: not a produce answer: {:?}", resp.code);
        };
        let (code, message) = (partitions[0].code, &partitions[0].message);
        assert_eq!(code, ErrorCode::NOT_LEADER, "request {r}: {message}");
        assert!(message.contains(&addr), "request {r}: {message}");
    }
    c.wait_caught_up(TOPIC, 1);
    let end = Client::connect(&addr, Duration::from_secs(10))
        .unwrap()
        .list_offsets(TOPIC)
        .unwrap();
    assert_eq!(end[0].end_offset, next, "{end:?}");
    c.stop_all();
}
