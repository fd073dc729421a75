//! SaslHandshake and SaslAuthenticate: SASL PLAIN, the password being an API key.
//!
//! The handshake offers `["PLAIN"]`. After a version 1 handshake the client sends
//! SaslAuthenticate (what librdkafka, confluent-kafka and kcat do); after a
//! version 0 handshake the next frame is the bare PLAIN token with no request
//! header, answered by an empty frame, as Kafka does. The PLAIN message is
//! `authzid \0 username \0 password`: the password is the API key token, checked by
//! [`crate::engine::keys::KeyStore::authenticate`] (constant time, rate limited per
//! source address); the username is informational (the key's name, say) and is
//! only logged. A failed login is answered SASL_AUTHENTICATION_FAILED with a
//! message, counted in `seglog_auth_failures`, and the connection closed. With
//! `--auth off` any credentials are accepted.

use kafka_protocol::messages::{
    ApiKey, ResponseKind, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};

use super::server::{Ctx, Outcome};
use super::{code, sb};
use crate::engine::keys::{AuthMode, Principal};

/// The one mechanism offered.
pub const MECHANISM: &str = "PLAIN";

/// Longest PLAIN message read (three fields; a token is far shorter).
pub const PLAIN_BYTES_MAX: usize = 4096;

/// Where a connection is in its login.
#[derive(Debug, Default)]
pub(crate) struct SaslState {
    /// A handshake agreed on PLAIN; `Some(true)`: a version 0 handshake, the next
    /// frame is the bare token.
    agreed: Option<bool>,
    /// Set once a login succeeded (or auth is off and credentials were given).
    pub authenticated: bool,
    /// The key logged in with (`None` with auth off).
    pub principal: Option<Principal>,
    /// The key store's generation when `principal` was last checked.
    pub generation: u64,
}

impl SaslState {
    pub(crate) fn expects_raw_token(&self) -> bool {
        self.agreed == Some(true)
    }
}

pub(crate) fn handshake(
    ctx: &Ctx,
    state: &mut SaslState,
    r: SaslHandshakeRequest,
    version: i16,
) -> Outcome {
    let mut resp = SaslHandshakeResponse::default();
    resp.mechanisms = vec![sb(MECHANISM)];
    if state.authenticated {
        let msg = "SaslHandshake after a successful login";
        ctx.client_error(ApiKey::SaslHandshake, code::ILLEGAL_SASL_STATE, msg);
        resp.error_code = code::ILLEGAL_SASL_STATE;
        return Outcome::ReplyClose(Box::new(ResponseKind::SaslHandshake(resp)), msg.into());
    }
    if r.mechanism.as_str() != MECHANISM {
        let msg = format!(
            "SASL mechanism {:?} asked; this listener offers PLAIN only",
            r.mechanism.as_str()
        );
        ctx.client_error(
            ApiKey::SaslHandshake,
            code::UNSUPPORTED_SASL_MECHANISM,
            &msg,
        );
        resp.error_code = code::UNSUPPORTED_SASL_MECHANISM;
        return Outcome::reply(ResponseKind::SaslHandshake(resp));
    }
    state.agreed = Some(version == 0);
    resp.error_code = code::NONE;
    Outcome::reply(ResponseKind::SaslHandshake(resp))
}

pub(crate) fn authenticate(
    ctx: &Ctx,
    state: &mut SaslState,
    r: SaslAuthenticateRequest,
) -> Outcome {
    let mut resp = SaslAuthenticateResponse::default();
    if state.agreed != Some(false) || state.authenticated {
        let msg = "SaslAuthenticate without a SaslHandshake v1 agreeing on PLAIN";
        ctx.client_error(ApiKey::SaslAuthenticate, code::ILLEGAL_SASL_STATE, msg);
        resp.error_code = code::ILLEGAL_SASL_STATE;
        resp.error_message = Some(sb(msg));
        return Outcome::ReplyClose(Box::new(ResponseKind::SaslAuthenticate(resp)), msg.into());
    }
    match login(ctx, state, &r.auth_bytes) {
        Ok(()) => {
            resp.error_code = code::NONE;
            resp.session_lifetime_ms = 0;
            Outcome::reply(ResponseKind::SaslAuthenticate(resp))
        }
        Err(msg) => {
            resp.error_code = code::SASL_AUTHENTICATION_FAILED;
            resp.error_message = Some(sb(&msg));
            Outcome::ReplyClose(Box::new(ResponseKind::SaslAuthenticate(resp)), msg)
        }
    }
}

/// The bare PLAIN token after a version 0 handshake: `Err` is the reason to close.
pub(crate) fn raw_token(ctx: &Ctx, state: &mut SaslState, frame: &[u8]) -> Result<(), String> {
    login(ctx, state, frame)
}

/// `authzid \0 username \0 password` split; `None` unless exactly three fields of
/// UTF-8.
pub fn parse_plain(msg: &[u8]) -> Option<(&str, &str, &str)> {
    if msg.len() > PLAIN_BYTES_MAX {
        return None;
    }
    let mut parts = msg.split(|b| *b == 0);
    let authzid = std::str::from_utf8(parts.next()?).ok()?;
    let user = std::str::from_utf8(parts.next()?).ok()?;
    let password = std::str::from_utf8(parts.next()?).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((authzid, user, password))
}

fn login(ctx: &Ctx, state: &mut SaslState, msg: &[u8]) -> Result<(), String> {
    state.agreed = None;
    let keys = ctx.broker.keys();
    let failed = |detail: String| {
        if let Some(m) = &ctx.opts.metrics {
            m.auth_failure();
        }
        tracing::warn!(peer = %ctx.peer, error = %detail, "kafka: failed login");
        detail
    };
    let Some((_, user, password)) = parse_plain(msg) else {
        // A malformed message still costs an authentication (and a failure).
        let e = keys
            .authenticate("", ctx.peer.ip())
            .err()
            .map_or_else(String::new, |e| e.to_string());
        return Err(failed(format!(
            "malformed SASL PLAIN message (authzid NUL username NUL password): {e}"
        )));
    };
    if keys.mode() == AuthMode::Off {
        state.authenticated = true;
        return Ok(());
    }
    state.generation = keys.generation();
    match keys.authenticate(password, ctx.peer.ip()) {
        Ok(p) => {
            tracing::debug!(peer = %ctx.peer, key = p.key_id(), name = p.name(), user,
                "kafka: login");
            state.principal = Some(p);
            state.authenticated = true;
            Ok(())
        }
        Err(e) => Err(failed(format!("{e} (SASL PLAIN, username {user:?})"))),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_plain;

    #[test]
    fn plain_messages_split_into_three_fields() {
        assert_eq!(parse_plain(b"\0u\0p"), Some(("", "u", "p")));
        assert_eq!(parse_plain(b"a\0u\0sgk_x_y"), Some(("a", "u", "sgk_x_y")));
        assert_eq!(parse_plain(b"\0u"), None);
        assert_eq!(parse_plain(b"\0u\0p\0"), None);
        assert_eq!(parse_plain(b"\0u\0\xff"), None);
        assert_eq!(parse_plain(&vec![b'a'; super::PLAIN_BYTES_MAX + 1]), None);
    }
}
