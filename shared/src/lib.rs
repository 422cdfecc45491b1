//! Zuno's shared core: the domain model, storage on SQLite or Postgres, the durable job ledger
//! and the worker runtime that the API and every worker binary build on.

pub mod clock;
pub mod config;
pub mod db;
pub mod ids;
pub mod learning;
pub mod ledger;
pub mod managed_file;
pub mod memory;
pub mod paths;
pub mod provider;
pub mod runtime;
pub mod skills;
pub mod states;
pub mod telemetry;
pub mod tokens;
pub mod transcript;
