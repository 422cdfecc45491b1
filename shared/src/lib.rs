//! Zuno's domain: transcripts, learning (extraction, validation, recall), resident Memory,
//! Skills, model providers and configuration, built on the job queue of `zuno-queue`, whose
//! modules are re-exported here under their own names.

pub mod config;
pub mod guards;
pub mod learning;
pub mod managed_file;
pub mod memory;
pub mod migrations;
pub mod ownership;
pub mod paths;
pub mod provider;
pub mod runtime;
pub mod skills;
pub mod states;
pub mod telemetry;
pub mod text;
pub mod tokens;
pub mod transcript;
pub mod worktree;

// The job queue (storage, ledger, worker runtime) is its own crate; these re-exports keep one
// path for the domain (`crate::ledger::…`) whether a type is the queue's or the domain's.
pub use zuno_queue::{clock, db, ids, ledger, on_db, on_tx};
