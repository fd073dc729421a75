//! TLS on the native listener, end to end with the real binary: a CA and certificates
//! made here (rcgen); the CLI clients round-trip records over TLS; plaintext is refused
//! with TLS_REQUIRED unless `--allow-plaintext`; a client trusting another CA fails
//! with one clear line; `--tls-client-ca` requires a client certificate the CA signed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use seglog::format::wire::{decode_response, encode_request, ErrorCode, Request};

use crate::util::serve::Serve;

/// A CA: its certificate and key.
pub(crate) struct Ca {
    cert: Certificate,
    key: KeyPair,
}

pub(crate) fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A certificate for `names` signed by `ca`, written as `<stem>.crt`/`<stem>.key`.
pub(crate) fn issue(
    dir: &Path,
    ca: &Ca,
    stem: &str,
    names: &[&str],
    usage: &[ExtendedKeyUsagePurpose],
) -> (PathBuf, PathBuf) {
    let mut p =
        CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, stem);
    p.extended_key_usages = usage.to_vec();
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let (c, k) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

pub(crate) fn write_ca(dir: &Path, ca: &Ca, stem: &str) -> PathBuf {
    let path = dir.join(format!("{stem}.pem"));
    std::fs::write(&path, ca.cert.pem()).unwrap();
    path
}

/// The files of one TLS set-up: the broker's certificate and key, its CA, another CA.
pub(crate) struct Pki {
    _dir: tempfile::TempDir,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) ca: PathBuf,
    other_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
}

pub(crate) fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let root = ca("seglog test CA");
    let other = ca("another CA");
    let (cert, key) = issue(
        dir.path(),
        &root,
        "broker",
        &["localhost", "127.0.0.1"],
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    let (client_cert, client_key) = issue(
        dir.path(),
        &root,
        "client",
        &["client"],
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    let (stranger_cert, stranger_key) = issue(
        dir.path(),
        &other,
        "stranger",
        &["stranger"],
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    Pki {
        ca: write_ca(dir.path(), &root, "ca"),
        other_ca: write_ca(dir.path(), &other, "other-ca"),
        cert,
        key,
        client_cert,
        client_key,
        stranger_cert,
        stranger_key,
        _dir: dir,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn serve_tls(data: &Path, pki: &Pki, extra: &[&str]) -> Serve {
    let mut args = vec!["--tls-cert", s(&pki.cert), "--tls-key", s(&pki.key)];
    args.extend_from_slice(extra);
    Serve::start_with(data, &args)
}

/// The one frame a plaintext peer gets from a TLS-only listener.
fn plaintext_answer(addr: &str) -> (ErrorCode, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut out = Vec::new();
    encode_request(
        &mut out,
        1,
        &Request::Handshake {
            min_version: 1,
            max_version: 3,
            token: None,
        },
    )
    .unwrap();
    s.write_all(&out).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let resp = decode_response(answer.get(4..).unwrap()).unwrap();
    (resp.code, resp.message.to_string())
}

#[test]
fn records_round_trip_over_tls_with_every_client_command() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &[]);
    let tls = ["--tls", "--tls-ca", s(&pki.ca)];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(tls.iter())
            .map(|a| (*a).to_string())
            .collect()
    };
    let run = |args: &[&str]| b.ok(&with(args).iter().map(String::as_str).collect::<Vec<_>>());
    run(&["topics", "create", "secure", "--partitions", "2"]);
    assert_eq!(run(&["topics", "list"]), "secure\n");
    let args = with(&["produce", "secure", "--partition", "1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    b.ok_with_stdin(&args, "one\ntwo\nthree\n");
    assert_eq!(
        run(&["consume", "secure", "--partition", "1"]),
        "one\ntwo\nthree\n"
    );
    // The CA from the environment works as the flag does.
    let out = b
        .cmd()
        .env("SEGLOG_TLS_CA", &pki.ca)
        .args(["topics", "list", "--tls"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "secure\n");
    // The bench client speaks TLS too.
    let addr = b.addr.clone();
    let bench = with(&[
        "bench",
        "produce",
        "--broker",
        &addr,
        "--records",
        "200",
        "--batch",
        "10",
        "--connections",
        "2",
        "--topic",
        "bench",
        "--json",
    ]);
    let bench: Vec<&str> = bench.iter().map(String::as_str).collect();
    let report = crate::util::bin::json(&b.ok(&bench));
    assert_eq!(report["records"], 200, "{report}");
    b.stop();
}

/// A fetch over 1 MiB is streamed from the segment files; over TLS its slices go
/// through the TLS session. The bench client decodes every record (CRC included) of
/// 4.4 MiB fetches and counts them.
#[test]
fn large_fetches_stream_over_tls() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &[]);
    let addr = b.addr.clone();
    let mut args = vec![
        "bench",
        "consume",
        "--broker",
        &addr,
        "--records",
        "45000",
        "--batch",
        "15000",
        "--json",
    ];
    args.extend(["--tls", "--tls-ca", s(&pki.ca)]);
    let report = crate::util::bin::json(&b.ok(&args));
    assert_eq!(report["records"], 45000, "{report}");
    assert_eq!(report["requests"], 3, "{report}");
    b.stop();
}

#[test]
fn plaintext_is_refused_unless_allowed() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &[]);
    let (code, message) = plaintext_answer(&b.addr);
    assert_eq!(code, ErrorCode::TLS_REQUIRED, "{message}");
    assert!(message.contains("requires TLS"), "{message}");
    // The CLI says so in one line, exit 69.
    let out = b.run(&["topics", "list"]);
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("requires TLS") && err.contains("tls_required"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // TLS clients are still served.
    b.ok(&["topics", "create", "t", "--tls", "--tls-ca", s(&pki.ca)]);
    b.stop();

    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &["--allow-plaintext"]);
    b.ok(&["topics", "create", "plain"]);
    assert_eq!(
        b.ok(&["topics", "list", "--tls", "--tls-ca", s(&pki.ca)]),
        "plain\n"
    );
    assert_eq!(b.ok(&["topics", "list"]), "plain\n");
    b.stop();
}

#[test]
fn a_wrong_ca_fails_with_one_clear_line() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &[]);
    let out = b.run(&["topics", "list", "--tls", "--tls-ca", s(&pki.other_ca)]);
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS handshake"), "{err}");
    assert!(err.contains("--tls-ca"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // --tls without a CA, and a CA file that is not PEM: usage errors.
    let out = b
        .cmd()
        .env_remove("SEGLOG_TLS_CA")
        .args(["topics", "list", "--tls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-ca"));
    let out = b.run(&["topics", "list", "--tls", "--tls-ca", s(&pki.key)]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The broker goes on serving.
    assert_eq!(
        b.ok(&["topics", "list", "--tls", "--tls-ca", s(&pki.ca)]),
        ""
    );
    b.stop();
}

#[test]
fn a_client_ca_requires_a_client_certificate_it_signed() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &["--tls-client-ca", s(&pki.ca)]);
    let base = ["topics", "list", "--tls", "--tls-ca", s(&pki.ca)];
    // No client certificate.
    let out = b.run(&base);
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TLS handshake") || err.contains("certificate"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // A certificate from another CA.
    let mut stranger = base.to_vec();
    stranger.extend([
        "--tls-cert",
        s(&pki.stranger_cert),
        "--tls-key",
        s(&pki.stranger_key),
    ]);
    let out = b.run(&stranger);
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The right one.
    let mut good = base.to_vec();
    good[1] = "list";
    good.extend([
        "--tls-cert",
        s(&pki.client_cert),
        "--tls-key",
        s(&pki.client_key),
    ]);
    assert_eq!(b.ok(&good), "");
    b.stop();
}

#[test]
fn serve_refuses_unusable_tls_files() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::util::bin::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("d"))
        .args(["--tls-cert", s(&pki.ca), "--tls-key", s(&pki.cert)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot set up TLS"), "{err}");
    // Nothing was created.
    assert!(!data.path().join("d").exists());
}

#[test]
fn a_refusal_at_the_connection_limit_is_told_over_tls() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &["--max-connections", "1"]);
    let tls = seglog::engine::net::tls::ClientTls::from_pem_files(&pki.ca, None).unwrap();
    let timeout = std::time::Duration::from_secs(30);
    let mut held =
        seglog::engine::net::client::Client::connect_with(&b.addr, timeout, Some(&tls), None)
            .unwrap();
    let e = seglog::engine::net::client::Client::connect_with(&b.addr, timeout, Some(&tls), None)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TOO_MANY_CONNECTIONS), "{e}");
    assert!(e.to_string().contains("at most 1 connections"), "{e}");
    assert!(held.list_topics().unwrap().is_empty());
    drop(held);
    b.stop();
}

/// A client that ends its TLS connection after its requests is a normal close: the
/// broker logs no WARN for it (it used to log "peer closed connection without
/// sending TLS close_notify" for every command).
#[test]
fn a_normal_tls_close_logs_no_warning() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let b = serve_tls(data.path(), &pki, &[]);
    let tls = ["--tls", "--tls-ca", s(&pki.ca)];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(tls.iter())
            .map(|a| (*a).to_string())
            .collect()
    };
    let run = |args: &[&str]| b.ok(&with(args).iter().map(String::as_str).collect::<Vec<_>>());
    run(&["topics", "create", "t"]);
    run(&["produce", "t", "--value", "v"]);
    assert_eq!(run(&["consume", "t"]), "v\n");
    // The broker logs a closed connection as soon as it reads the end of the stream.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = b.stderr();
    assert!(!log.contains("close_notify"), "{log}");
    assert!(!log.contains("closing the connection"), "{log}");
    b.stop();
}

/// A certificate that does not list the host of `--broker` is told as that, not as
/// a wrong `--tls-ca`.
#[test]
fn a_host_the_certificate_does_not_name_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let root = ca("seglog test CA");
    let (cert, key) = issue(
        dir.path(),
        &root,
        "broker",
        &["broker.example"],
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    let ca_path = write_ca(dir.path(), &root, "ca");
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(data.path(), &["--tls-cert", s(&cert), "--tls-key", s(&key)]);
    let out = b.run(&["topics", "list", "--tls", "--tls-ca", s(&ca_path)]);
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS handshake"), "{err}");
    assert!(err.contains("does not name the host of --broker"), "{err}");
    assert!(!err.contains("is --tls-ca"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    b.stop();
}

/// An input file that cannot be read exits 74 (I/O error) whichever flag names it:
/// --tls-ca, --token-file, produce --value-file.
#[test]
fn unreadable_input_files_exit_74() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    b.ok(&["topics", "create", "t"]);
    let missing = data.path().join("missing.pem");
    let m = s(&missing);
    for args in [
        &["topics", "list", "--tls", "--tls-ca", m][..],
        &["topics", "list", "--token-file", m],
        &["produce", "t", "--value-file", m],
    ] {
        let out = b.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{args:?}: {err}");
        assert!(err.contains(m), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    b.stop();
}
