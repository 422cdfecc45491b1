//! The worker runtime every worker binary and `zuno serve --all-in-one` run: a job handler trait
//! and a runner that claims with leases, heartbeats, settles through fenced transactions and shuts
//! down gracefully.

mod handler;
mod runner;
pub mod shutdown;
pub mod wake;

pub use handler::{JobContext, JobError, JobHandler};
pub use runner::{RunReport, Runner, RunnerConfig, RunnerConfigError};
