//! Login and the per-request permission check of the native listener. The session
//! ([`super::dispatch::Session`]) calls [`login`] at the handshake and [`authorize`]
//! once per request, before the request touches the broker: a refused request
//! writes nothing.
//!
//! What each request needs, as ([`Action`], [`Resource`]) pairs, is fixed here and in
//! docs/PROTOCOL.md ("Authentication"); the key's role and patterns decide
//! ([`Principal::allows`]).
//!
//! Invariants:
//! - While the broker requires a login, a session without a principal is refused
//!   every request (AUTH_REQUIRED), and a principal whose key was revoked is dropped
//!   at its next request (AUTH_FAILED). Noticing a change costs one atomic load.
//! - Every failed login is logged with its source address and counted.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::engine::keys::{Action, AuthError, KeyError, KeyStore, Principal, Resource};
use crate::engine::net::metrics::NetMetrics;
use crate::format::keys::KeyEntry;
use crate::format::wire::groups::GroupRequest;
use crate::format::wire::keys::{KeyInfo, KeyRequest, KeyResponse, KEYS_VERSION};
use crate::format::wire::producers::ProducerRequest;
use crate::format::wire::{ErrorCode, Request};

type Refusal = (ErrorCode, String);

/// A session's login state.
#[derive(Debug, Default)]
pub struct Login {
    principal: Option<Principal>,
    /// The key store's generation when `principal` was last checked.
    generation: u64,
}

impl Login {
    /// The key the session logged in with.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }
}

/// Checks the handshake's token. `Ok` leaves the session logged in (or, when no
/// login is required and no token was given, anonymous); `Err` is the handshake's
/// error response, after which the connection closes.
pub fn login(
    keys: &KeyStore,
    token: Option<&str>,
    peer: SocketAddr,
    metrics: Option<&Arc<NetMetrics>>,
    state: &mut Login,
) -> Result<(), Refusal> {
    state.principal = None;
    state.generation = keys.generation();
    let Some(token) = token else {
        if keys.required() {
            return Err((
                ErrorCode::AUTH_REQUIRED,
                "the broker requires an API key: pass --token-file PATH or set $SEGLOG_TOKEN"
                    .to_string(),
            ));
        }
        return Ok(());
    };
    // A token is checked whenever auth is not off (with no key at all it cannot be
    // valid), so a mistyped or revoked token is never silently accepted.
    if is_off(keys) {
        return Ok(());
    }
    match keys.authenticate(token, peer.ip()) {
        Ok(p) => {
            tracing::debug!(%peer, key = p.key_id(), name = p.name(), "login");
            state.principal = Some(p);
            Ok(())
        }
        Err(e) => {
            if let Some(m) = metrics {
                m.auth_failure();
            }
            tracing::warn!(%peer, error = %e, "failed login");
            let code = match e {
                AuthError::RateLimited { .. } => ErrorCode::AUTH_RATE_LIMITED,
                _ => ErrorCode::AUTH_FAILED,
            };
            Err((code, e.to_string()))
        }
    }
}

/// Whether auth is off outright (a token is then ignored).
fn is_off(keys: &KeyStore) -> bool {
    keys.mode() == crate::engine::keys::AuthMode::Off
}

/// Refuses `req` unless the session's key allows it (or no login is required).
pub fn authorize(keys: &KeyStore, state: &mut Login, req: &Request<'_>) -> Result<(), Refusal> {
    if !keys.required() {
        return Ok(());
    }
    let generation = keys.generation();
    if generation != state.generation {
        state.generation = generation;
        if let Some(p) = state.principal.take() {
            match keys.current(&p) {
                Some(now) => state.principal = Some(now),
                None => {
                    return Err((
                        ErrorCode::AUTH_FAILED,
                        format!("API key {} of this connection was revoked", p.key_id()),
                    ))
                }
            }
        }
    }
    let Some(p) = &state.principal else {
        return Err((
            ErrorCode::AUTH_REQUIRED,
            "the broker requires an API key: pass --token-file PATH or set $SEGLOG_TOKEN"
                .to_string(),
        ));
    };
    for (action, resource) in needs(req).into_iter().flatten() {
        if !p.allows(action, resource) {
            let on = match resource {
                Resource::Topic(t) => format!(" on topic {t:?}"),
                Resource::Group(g) => format!(" on group {g:?}"),
                Resource::Cluster => String::new(),
            };
            return Err((
                ErrorCode::NOT_AUTHORIZED,
                format!(
                    "API key {} ({} {:?}) may not {}{on}",
                    p.key_id(),
                    p.role().as_str(),
                    p.name(),
                    req.api_key().name()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the session may see `topic` in a topic list.
pub fn may_see(keys: &KeyStore, state: &Login, topic: &str) -> bool {
    !keys.required()
        || state
            .principal
            .as_ref()
            .is_some_and(|p| p.allows(Action::Describe, Resource::Topic(topic)))
}

/// What `req` needs: at most two permissions.
pub fn needs<'r>(req: &Request<'r>) -> [Option<(Action, Resource<'r>)>; 2] {
    use Action::*;
    let one = |a, r| [Some((a, r)), None];
    match req {
        Request::Handshake { .. } => [None, None],
        Request::Produce { topic, .. } => one(Produce, Resource::Topic(topic)),
        Request::Fetch { topic, .. } => one(Consume, Resource::Topic(topic)),
        Request::ListOffsets { topic }
        | Request::DescribeTopic { topic }
        | Request::SchemaGet { topic, .. }
        | Request::SchemaCheck { topic, .. } => one(Describe, Resource::Topic(topic)),
        Request::ListTopics | Request::ClusterStatus => one(Describe, Resource::Cluster),
        Request::CreateTopic { .. }
        | Request::DeleteTopic { .. }
        | Request::AlterTopic { .. }
        | Request::Stats
        | Request::SchemaRegister { .. }
        | Request::SchemaList
        | Request::SchemaDelete { .. }
        | Request::Key(_) => one(Admin, Resource::Cluster),
        Request::Producer(ProducerRequest::InitProducer { .. }) => one(Produce, Resource::Cluster),
        Request::Producer(ProducerRequest::Produce { topic, .. }) => {
            one(Produce, Resource::Topic(topic))
        }
        Request::Group(g) => match g {
            GroupRequest::JoinGroup { group, .. }
            | GroupRequest::SyncGroup { group, .. }
            | GroupRequest::Heartbeat { group, .. }
            | GroupRequest::LeaveGroup { group, .. }
            | GroupRequest::DescribeGroup { group } => one(Group, Resource::Group(group)),
            GroupRequest::OffsetCommit { group, topic, .. }
            | GroupRequest::OffsetFetch { group, topic, .. } => [
                Some((Group, Resource::Group(group))),
                (!topic.is_empty()).then_some((Group, Resource::Topic(topic))),
            ],
            GroupRequest::ListGroups | GroupRequest::DeleteGroup { .. } => {
                one(Admin, Resource::Cluster)
            }
        },
    }
}

/// The answer to a key request, owned (the response borrows from it).
#[derive(Debug)]
pub enum KeyAnswer {
    Created {
        id: String,
        token: String,
        created_ms: i64,
    },
    List(Vec<KeyEntry>),
    Revoked,
}

impl KeyAnswer {
    pub fn as_wire(&self) -> KeyResponse<'_> {
        match self {
            KeyAnswer::Created {
                id,
                token,
                created_ms,
            } => KeyResponse::Created {
                id,
                token,
                created_ms: *created_ms,
            },
            KeyAnswer::List(keys) => KeyResponse::List {
                keys: keys
                    .iter()
                    .map(|k| KeyInfo {
                        id: &k.id,
                        name: &k.name,
                        role: k.role.as_str(),
                        topics: k.topics.iter().map(String::as_str).collect(),
                        groups: k.groups.iter().map(String::as_str).collect(),
                        created_ms: k.created_ms,
                        last_used_ms: k.last_used_ms,
                    })
                    .collect(),
            },
            KeyAnswer::Revoked => KeyResponse::Revoked,
        }
    }
}

/// Carries out a key request (the session has checked it is an admin's).
pub fn serve_key(
    keys: &KeyStore,
    version: u16,
    req: &KeyRequest<'_>,
) -> Result<KeyAnswer, Refusal> {
    if version < KEYS_VERSION {
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!(
                "{} needs protocol version {KEYS_VERSION}; this connection agreed on {version}",
                req.api_key().name()
            ),
        ));
    }
    let owned = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    match req {
        KeyRequest::Create {
            name,
            role,
            topics,
            groups,
        } => {
            let c = keys
                .create(name, role, &owned(topics), &owned(groups))
                .map_err(key_error)?;
            tracing::info!(key = %c.entry.id, name = %c.entry.name, role = c.entry.role.as_str(), "API key created");
            Ok(KeyAnswer::Created {
                id: c.entry.id,
                token: c.token,
                created_ms: c.entry.created_ms,
            })
        }
        KeyRequest::List => Ok(KeyAnswer::List(keys.list())),
        KeyRequest::Revoke { id } => {
            keys.revoke(id).map_err(key_error)?;
            tracing::info!(key = %id, "API key revoked");
            Ok(KeyAnswer::Revoked)
        }
    }
}

/// [`serve_key`] on a cluster node: a create or revoke also changes every other node
/// ([`crate::engine::replication::Replicator::share_key`]). A create some node did
/// not take is undone and refused (its token is never shown); a revoke some node did
/// not take is refused naming the nodes that still accept the key, and asked again
/// it finishes, also through a node that no longer has the key.
///
/// A session without a login may not create or revoke a key in a cluster: the change
/// would reach every node, and a node serving without logins (no key yet, its
/// directory new, or not given the cluster's keys) would otherwise let anyone make
/// an admin key for all of them.
pub async fn serve_key_in_cluster(
    keys: &KeyStore,
    version: u16,
    req: &KeyRequest<'_>,
    logged_in: bool,
    cluster: Arc<dyn crate::engine::replication::Replicator>,
) -> Result<KeyAnswer, Refusal> {
    use crate::engine::replication::KeyChange;
    if !logged_in && !matches!(req, KeyRequest::List) {
        return Err((
            ErrorCode::AUTH_REQUIRED,
            "in a cluster, API keys are created and revoked by a session logged in with an \
             admin key: give every node its first key offline (`seglog keys create \
             --data-dir` on one node's directory, then copy its api_keys.json to the \
             others) and pass --token-file"
                .to_string(),
        ));
    }
    // The nodes that failed, then why: "3,4" and "…; …".
    let nodes = |failed: &[(u64, String)]| -> (String, String) {
        let (ids, why): (Vec<String>, Vec<&str>) = failed
            .iter()
            .map(|(n, m)| (n.to_string(), m.as_str()))
            .unzip();
        (ids.join(","), why.join("; "))
    };
    match req {
        KeyRequest::Create { .. } => {
            let answer = serve_key(keys, version, req)?;
            let KeyAnswer::Created { id, .. } = &answer else {
                return Ok(answer);
            };
            let Some(entry) = keys.entry(id) else {
                return Ok(answer);
            };
            let shared = Arc::clone(&cluster).share_key(KeyChange::Put(entry)).await;
            if shared.failed.is_empty() {
                return Ok(answer);
            }
            // Undone where it was made; nobody has its token.
            if let Err(e) = keys.forget(id) {
                tracing::warn!(key = %id, error = %e, "undoing a key not created on every node failed (its token was never shown)");
            }
            if !shared.changed.is_empty() {
                let undone = cluster.share_key(KeyChange::Revoke(id.clone())).await;
                if !undone.failed.is_empty() {
                    tracing::warn!(key = %id, nodes = %nodes(&undone.failed).0, "undoing a key not created on every node failed there (its token was never shown)");
                }
            }
            let (down, why) = nodes(&shared.failed);
            Err((
                ErrorCode::PARTITION_UNAVAILABLE,
                format!(
                    "{why}; no key created: node(s) [{down}] did not answer, and a key must be \
                     on every node to log in through any: run the same command again once \
                     node(s) [{down}] answer"
                ),
            ))
        }
        KeyRequest::Revoke { id } => {
            let here = serve_key(keys, version, req);
            match &here {
                Ok(_) | Err((ErrorCode::UNKNOWN_KEY, _)) => {}
                Err(_) => return here,
            }
            let shared = cluster.share_key(KeyChange::Revoke(id.to_string())).await;
            if !shared.failed.is_empty() {
                let (down, why) = nodes(&shared.failed);
                return Err((
                    ErrorCode::PARTITION_UNAVAILABLE,
                    format!(
                        "{why}; key {id} is revoked on every node but node(s) [{down}], which \
                         still accept it: run the same command again once node(s) [{down}] \
                         answer"
                    ),
                ));
            }
            if here.is_err() && !shared.changed.is_empty() {
                tracing::info!(key = %id, "API key revoked on the nodes that still had it");
                return Ok(KeyAnswer::Revoked);
            }
            here
        }
        KeyRequest::List => serve_key(keys, version, req),
    }
}

/// The wire error of a key operation.
pub fn key_error(e: KeyError) -> Refusal {
    let code = match &e {
        KeyError::Invalid(_) | KeyError::BadRole(_) | KeyError::TooMany => {
            ErrorCode::INVALID_REQUEST
        }
        KeyError::UnknownKey { .. } => ErrorCode::UNKNOWN_KEY,
        KeyError::Unreadable { .. } => ErrorCode::CORRUPT_DATA,
        KeyError::Io { .. } | KeyError::Poisoned { .. } => ErrorCode::STORAGE,
    };
    (code, e.to_string())
}
