//! SaslHandshake and SaslAuthenticate: where authentication is answered. The broker
//! has no credentials yet, so no mechanism is offered: a handshake is answered
//! UNSUPPORTED_SASL_MECHANISM with an empty list, an authenticate ILLEGAL_SASL_STATE.

use kafka_protocol::messages::{
    ApiKey, ResponseKind, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};

use super::server::{Ctx, Outcome};
use super::{code, sb};

pub(crate) fn handshake(ctx: &Ctx, r: SaslHandshakeRequest) -> Outcome {
    let msg = format!(
        "SASL mechanism {:?} asked; this listener offers none (no authentication)",
        r.mechanism.as_str()
    );
    ctx.client_error(
        ApiKey::SaslHandshake,
        code::UNSUPPORTED_SASL_MECHANISM,
        &msg,
    );
    let mut resp = SaslHandshakeResponse::default();
    resp.error_code = code::UNSUPPORTED_SASL_MECHANISM;
    resp.mechanisms = Vec::new();
    Outcome::reply(ResponseKind::SaslHandshake(resp))
}

pub(crate) fn authenticate(ctx: &Ctx) -> Outcome {
    let msg = "SaslAuthenticate without a mechanism agreed: this listener has no authentication";
    ctx.client_error(ApiKey::SaslAuthenticate, code::ILLEGAL_SASL_STATE, msg);
    let mut resp = SaslAuthenticateResponse::default();
    resp.error_code = code::ILLEGAL_SASL_STATE;
    resp.error_message = Some(sb(msg));
    Outcome::reply(ResponseKind::SaslAuthenticate(resp))
}
