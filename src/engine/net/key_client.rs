//! The client side of the API-key requests (protocol version 3).

use std::time::Duration;

use super::client::{Client, ClientError};
use crate::format::keys::{KeyEntry, Role};
use crate::format::wire::keys::{KeyRequest, KeyResponse};
use crate::format::wire::{Request, ResponseBody};

/// A key just created: the token is the only copy of its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewKey {
    pub id: String,
    pub token: String,
    pub created_ms: i64,
}

impl Client {
    pub fn key_create(
        &mut self,
        name: &str,
        role: &str,
        topics: &[String],
        groups: &[String],
    ) -> Result<NewKey, ClientError> {
        let req = Request::Key(KeyRequest::Create {
            name,
            role,
            topics: topics.iter().map(String::as_str).collect(),
            groups: groups.iter().map(String::as_str).collect(),
        });
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::Key(KeyResponse::Created {
                id,
                token,
                created_ms,
            }) => Ok(NewKey {
                id: id.to_string(),
                token: token.to_string(),
                created_ms,
            }),
            _ => Err(self.protocol("key_create answered with another response")),
        }
    }

    /// Every key (the hash is left empty: the broker never sends it).
    pub fn key_list(&mut self) -> Result<Vec<KeyEntry>, ClientError> {
        let req = Request::Key(KeyRequest::List);
        let keys = match self.call(&req, Duration::ZERO)? {
            ResponseBody::Key(KeyResponse::List { keys }) => keys
                .into_iter()
                .map(|k| {
                    Role::parse(k.role).map(|role| KeyEntry {
                        id: k.id.to_string(),
                        name: k.name.to_string(),
                        role,
                        topics: k.topics.iter().map(ToString::to_string).collect(),
                        groups: k.groups.iter().map(ToString::to_string).collect(),
                        created_ms: k.created_ms,
                        last_used_ms: k.last_used_ms,
                        secret_sha256: String::new(),
                    })
                })
                .collect::<Option<Vec<_>>>(),
            _ => return Err(self.protocol("key_list answered with another response")),
        };
        keys.ok_or_else(|| self.protocol("key_list named an unknown role"))
    }

    pub fn key_revoke(&mut self, id: &str) -> Result<(), ClientError> {
        let req = Request::Key(KeyRequest::Revoke { id });
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::Key(KeyResponse::Revoked) => Ok(()),
            _ => Err(self.protocol("key_revoke answered with another response")),
        }
    }
}
