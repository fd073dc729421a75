//! The network side: the native protocol's TCP server over the broker ([`server`])
//! and the blocking client the command-line tools use ([`client`]). The bytes of the
//! protocol live in [`crate::format::wire`].

pub mod auth;
pub mod client;
pub mod cluster_client;
pub mod dispatch;
pub mod group_client;
pub mod groups;
pub mod kafka;
pub mod key_client;
pub mod limits;
pub mod metrics;
pub mod producer_client;
pub mod producers;
pub mod server;
pub mod tls;
