use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::engine::storage::io::RealStorage;
use crate::testkit::storage::{FailOn, FailingStorage};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const TWO: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn open(dir: &Path) -> KeyStore {
    KeyStore::open(Arc::new(RealStorage), dir).unwrap()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

#[test]
fn create_authenticate_revoke_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert!(!store.required());
    let c = store
        .create("app", "producer", &strings(&["orders.*"]), &[])
        .unwrap();
    assert!(store.required());
    let file = std::fs::read_to_string(dir.path().join(KEYS_FILE)).unwrap();
    let secret = &c.token[21..];
    assert_eq!(secret.len(), 43);
    assert!(!file.contains(secret) && !file.contains(&c.token));
    assert!(file.contains(&c.entry.secret_sha256));
    let mode = std::fs::metadata(dir.path().join(KEYS_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let p = store.authenticate(&c.token, ONE).unwrap();
    assert_eq!(p.key_id(), c.entry.id);
    assert!(p.allows(Action::Produce, Resource::Topic("orders.eu")));
    assert!(!p.allows(Action::Produce, Resource::Topic("payments")));
    assert!(!p.allows(Action::Consume, Resource::Topic("orders.eu")));
    assert!(!p.allows(Action::Admin, Resource::Cluster));
    assert!(store.list()[0].last_used_ms > 0);

    // A wrong secret for a real id, an unknown id, a malformed token.
    let mut wrong = c.token.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    let unknown = format!("sgk_ffffffffffffffff_{}", &c.token[21..]);
    for bad in [wrong.as_str(), unknown.as_str(), "nonsense"] {
        assert_eq!(store.authenticate(bad, ONE).unwrap_err(), AuthError::Failed);
    }
    assert_eq!(store.failures(), 3);

    // Several keys per name; reopening keeps both.
    let c2 = store
        .create("app", "consumer", &strings(&["*"]), &strings(&["g-*"]))
        .unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.list().len(), 2);
    let p2 = store.authenticate(&c2.token, ONE).unwrap();
    assert!(p2.allows(Action::Group, Resource::Group("g-1")));
    assert!(!p2.allows(Action::Group, Resource::Group("h")));
    assert!(p2.allows(Action::Consume, Resource::Topic("x")));

    let generation = store.generation();
    store.revoke(&c.entry.id).unwrap();
    assert!(store.generation() > generation);
    assert!(store.current(&p).is_none());
    assert!(store.current(&p2).is_some());
    assert_eq!(
        store.authenticate(&c.token, ONE).unwrap_err(),
        AuthError::Failed
    );
    assert!(matches!(
        store.revoke(&c.entry.id),
        Err(KeyError::UnknownKey { .. })
    ));
}

#[test]
fn bad_fields_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert!(matches!(
        store.create("app", "root", &[], &[]),
        Err(KeyError::BadRole(_))
    ));
    assert!(store.create("a b", "admin", &[], &[]).is_err());
    assert!(store.create("app", "admin", &strings(&["["]), &[]).is_err());
    assert!(!dir.path().join(KEYS_FILE).exists());
}

#[test]
fn failures_are_limited_per_address() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = store.create("app", "admin", &[], &[]).unwrap();
    let mut limited = 0;
    for _ in 0..1000 {
        match store.authenticate("sgk_bad", ONE) {
            Err(AuthError::RateLimited { peer, .. }) => {
                assert_eq!(peer, ONE);
                limited += 1;
            }
            Err(AuthError::Failed) => {}
            Ok(_) => panic!("a bad token logged in"),
        }
    }
    // The burst, then (with at most a refill or two) refusals only.
    assert!(limited >= 1000 - FAILURES_BURST as usize - 5, "{limited}");
    // The limited address is refused even with the right token; another is not.
    assert!(matches!(
        store.authenticate(&c.token, ONE),
        Err(AuthError::RateLimited { .. })
    ));
    assert!(store.authenticate(&c.token, TWO).is_ok());
}

#[test]
fn the_tracked_addresses_are_bounded() {
    let mut l = Limiter::default();
    let now = Instant::now();
    for i in 0..(TRACKED_ADDRESSES_MAX as u32 + 10) {
        let peer = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        l.fail(peer, now);
    }
    assert!(l.buckets.len() <= TRACKED_ADDRESSES_MAX);
    assert!(l.overflow.is_some());
}

#[test]
fn a_failed_replace_changes_nothing_and_poisons() {
    let dir = tempfile::tempdir().unwrap();
    let s = FailingStorage::new(Arc::new(RealStorage), 1, FailOn::Any, false);
    let store = KeyStore::open(Arc::new(s), dir.path()).unwrap();
    assert!(matches!(
        store.create("app", "admin", &[], &[]),
        Err(KeyError::Io { .. })
    ));
    assert!(store.list().is_empty());
    assert!(!store.required());
    assert!(matches!(
        store.create("app", "admin", &[], &[]),
        Err(KeyError::Poisoned { .. })
    ));
}

#[test]
fn flush_writes_last_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = store.create("app", "admin", &[], &[]).unwrap();
    store.authenticate(&c.token, ONE).unwrap();
    store.flush().unwrap();
    let doc = read_file(dir.path()).unwrap();
    assert!(doc.keys[0].last_used_ms > 0);
}

#[test]
fn patterns_a_role_does_not_check_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (role, topics, groups) in [
        ("admin", &["a*"][..], &[][..]),
        ("admin", &[], &["g"]),
        ("producer", &["*"], &["g"]),
    ] {
        assert!(
            matches!(
                store.create("app", role, &strings(topics), &strings(groups)),
                Err(KeyError::Invalid(_))
            ),
            "{role} {topics:?} {groups:?}"
        );
    }
    assert!(!dir.path().join(KEYS_FILE).exists());
    store.create("app", "admin", &[], &[]).unwrap();
    store
        .create("app", "producer", &strings(&["*"]), &[])
        .unwrap();
    store
        .create("app", "consumer", &strings(&["*"]), &strings(&["g"]))
        .unwrap();
}
