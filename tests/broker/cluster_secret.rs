//! The cluster secret (`serve --cluster-secret-file`), with real `seglog serve`
//! processes: nodes holding the same secret replicate; a node with another secret or
//! none is refused and says why; a connection to a Raft listener that proves no
//! secret, or a wrong one, is refused before any call; bad secret files stop `serve`
//! before it starts. A client sent to a Raft listener is told what it reached.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use seglog::format::wire::raft::{
    decode_peer_frame, encode_peer_frame, PeerFrame, Rpc, NONCE_LEN, PEER_VERSION, PROOF_LEN,
};

use crate::util::bin::BIN;
use crate::util::cluster::Cluster;

/// Writes `secret` to a 0600 file named `name` under `dir`.
fn secret_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn secret_args(path: &Path) -> Vec<String> {
    vec![
        "--cluster-secret-file".into(),
        path.to_str().unwrap().into(),
    ]
}

/// Restarts node `id` with `args` as its extra flags.
fn restart_with(c: &mut Cluster, id: u64, args: Vec<String>) {
    c.stop(id);
    c.node_mut(id).args = args;
    c.restart(id);
}

fn frame(f: &PeerFrame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_peer_frame(&mut out, f).unwrap();
    out
}

/// Reads one peer frame (its bytes after the length); `None` once the connection
/// is closed.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// Connects to `raft_addr` as node `as_node` of a cluster of nodes 1..=3 and sends a
/// hello; returns the stream and the acceptor's answer.
fn hello_as(raft_addr: &str, as_node: u64) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(raft_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&frame(&PeerFrame::Hello {
        version: PEER_VERSION,
        cluster_id: "",
        node_id: as_node,
        client_addr: "127.0.0.1:1",
        kafka_addr: "",
        nodes: vec![1, 2, 3],
        nonce: [5; NONCE_LEN],
        proof: b"",
        flags: 0,
    }))
    .unwrap();
    let answer = read_frame(&mut s).expect("an answer to the hello");
    (s, answer)
}

/// What a connection answers after `then` was sent in place of a proof: the reason
/// of its refusal, or `None` when it closed without one.
fn refusal_after(s: &mut TcpStream, then: &[u8]) -> Option<String> {
    s.write_all(then).unwrap();
    let body = read_frame(s)?;
    match decode_peer_frame(&body).unwrap() {
        PeerFrame::Refuse { reason } => Some(reason.to_string()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn only_nodes_holding_the_cluster_secret_join() {
    let keys = tempfile::tempdir().unwrap();
    let good = secret_file(keys.path(), "good", "9T1cM2d1m3oAq2f7Xz0pLw==");
    let other = secret_file(keys.path(), "other", "another secret of the right length");
    let mut c = Cluster::prepare(3);
    for node in &mut c.nodes {
        node.args = secret_args(&good);
    }
    c.start_all();
    c.create_topic("s", 1, 3);
    c.ok_with_stdin(&["produce", "s"], "a\nb\n");
    c.wait_caught_up("s", 1);

    // A client sent to a Raft listener by mistake is told so.
    let raft1 = c.node(1).raft_addr.clone();
    let out = Command::new(BIN)
        .args(["topics", "list", "--broker", &raft1])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "{raft1} is a cluster node's Raft listener (serve --raft-listen), not a client \
             listener"
        )),
        "{err}"
    );

    // A stranger's first frame is held to the handshake's limit before anything is
    // allocated for it.
    let mut s = TcpStream::connect(&raft1).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
    let body = read_frame(&mut s).expect("a refusal");
    match decode_peer_frame(&body).unwrap() {
        PeerFrame::Refuse { reason } => assert!(
            reason.contains("a handshake frame of 16777216 bytes, more than 524288"),
            "{reason}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // The acceptor proves the secret in its hello; a dialer that proves nothing, or
    // a wrong proof, is refused and served no call.
    let (mut s, answer) = hello_as(&raft1, 3);
    match decode_peer_frame(&answer).unwrap() {
        PeerFrame::Hello { node_id, proof, .. } => {
            assert_eq!(node_id, 1);
            assert_eq!(proof.len(), PROOF_LEN, "the acceptor proves the secret");
        }
        other => panic!("expected a hello, got {other:?}"),
    }
    let reason = refusal_after(&mut s, &frame(&PeerFrame::Proof { proof: b"" })).unwrap();
    assert!(reason.contains("node 3 has no cluster secret"), "{reason}");
    let (mut s, _) = hello_as(&raft1, 2);
    let reason = refusal_after(
        &mut s,
        &frame(&PeerFrame::Proof {
            proof: &[7; PROOF_LEN],
        }),
    )
    .unwrap();
    assert!(
        reason.contains("hold different cluster secrets"),
        "{reason}"
    );
    // A call in place of the proof: refused, never handled.
    let (mut s, _) = hello_as(&raft1, 2);
    let call = frame(&PeerFrame::Call {
        call_id: 1,
        topic: "",
        partition: 0,
        rpc: Rpc::Keys,
        payload: br#"{"revoke":"x"}"#,
    });
    let reason = refusal_after(&mut s, &call).unwrap();
    assert!(reason.contains("expected a proof"), "{reason}");
    assert!(read_frame(&mut s).is_none(), "the connection is closed");

    // Node 3 with another secret: refused both ways, said on stderr.
    restart_with(&mut c, 3, secret_args(&other));
    assert!(
        c.node(3)
            .serve()
            .stderr_gets("hold different cluster secrets"),
        "{}",
        c.node(3).stderr()
    );
    c.ok_with_stdin(&["produce", "s"], "c\n");
    // Node 3 with none: it refuses its peers, which prove one.
    restart_with(&mut c, 3, Vec::new());
    assert!(
        c.node(3)
            .serve()
            .stderr_gets("node 3 has no cluster secret and node"),
        "{}",
        c.node(3).stderr()
    );
    // With the cluster's secret again it catches up.
    restart_with(&mut c, 3, secret_args(&good));
    c.wait_caught_up("s", 1);
    c.stop(3);
    let replica = c.dump(3, "s", 1);
    assert_eq!(replica.records.len(), 3, "{:?}", replica.records);
    c.stop_all();
}

#[test]
fn bad_secret_files_are_refused_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    let short = secret_file(dir.path(), "short", "too short");
    let run = |secret: &Path| {
        Command::new(BIN)
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen", "127.0.0.1:0", "--node-id", "1"])
            .args(["--raft-listen", "127.0.0.1:0", "--peers", "1=127.0.0.1:9"])
            .arg("--cluster-secret-file")
            .arg(secret)
            .output()
            .unwrap()
    };
    let out = run(&short);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("9 bytes without trailing white space, fewer than 16"),
        "{err}"
    );
    let out = run(&dir.path().join("missing"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{err}");
    assert!(err.contains("--cluster-secret-file"), "{err}");
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created before the secret is read"
    );
}
