//! `zuno-queue`: the durable job queue Zuno's API and workers share.
//!
//! - [`db`]: one storage handle over SQLite (the embedded default) or Postgres, connection
//!   options, fail-closed migrations, and the `on_db!` / `on_tx!` macros that run one statement
//!   on whichever backend is open.
//! - [`ledger`]: idempotent admission by `(session, source message, extractor version)`, leases
//!   with heartbeats and fencing, the attempt ceiling, interval buckets, rescue and restart
//!   recovery. Every decision is a statement in one transaction; on Postgres leases are judged by
//!   the database clock.
//! - [`runtime`]: the [`runtime::JobHandler`] trait and the [`runtime::Runner`] that wakes,
//!   claims, heartbeats, settles and drains on shutdown.
//! - [`clock`], [`ids`], [`trace_context`]: what those need from the process; the ledger's
//!   metric instruments live in [`ledger::metrics`]; [`text_enum!`] declares an enum stored as
//!   text (the ledger's kinds, states and origins, and the application's states).
//!
//! The queue knows job kinds and states but nothing of what a job does: handlers live in the
//! worker crates and in `zuno-shared`, which re-exports these modules under the same names.

pub mod clock;
pub mod db;
pub mod ids;
pub mod ledger;
pub mod runtime;
mod text_enum;
pub mod trace_context;
