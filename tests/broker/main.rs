//! The broker in one test binary: the engine through its API (round trips, failing
//! and hooked storage, background cleanup), and `seglog serve` as a real child
//! process (client commands, raw protocol, cleanup, the kill -9 loop). Run one part
//! with a filter, e.g. `cargo test --release --test broker kill9::`.

#[path = "../util/mod.rs"]
mod util;

mod cli_auth;
mod cli_broker;
mod cli_cleanup;
mod cli_clients;
mod cli_describe;
mod cli_groups;
mod cli_limits;
mod cli_metrics;
mod cli_oplog;
mod cli_producers;
mod cli_schemas;
mod cli_tls;
mod cli_topic_meta;
mod cluster_alter;
mod cluster_bench;
mod cluster_check;
mod cluster_cli;
mod cluster_create;
mod cluster_delete;
mod cluster_faults;
mod cluster_groups;
mod cluster_harness;
mod cluster_keys;
mod cluster_metrics;
mod cluster_nemesis;
mod cluster_pipeline;
mod cluster_proxy;
mod cluster_rejoin;
mod cluster_repair;
mod cluster_schemas;
mod cluster_secret;
mod cluster_snapshot;
mod cluster_startup;
mod cluster_tls;
mod engine_broker;
mod engine_cleanup;
mod engine_damage;
mod engine_failures;
mod engine_idempotent;
mod engine_spares;
mod kafka_clients;
mod kafka_cluster;
mod kill9;
mod replication;
