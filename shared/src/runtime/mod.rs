//! The worker runtime shared by every worker binary and by `zuno serve --all-in-one`: a job
//! handler trait, a registry keyed by kind, and a runner that claims with leases, heartbeats,
//! settles through fenced transactions and shuts down gracefully.

mod handler;
pub mod model_call;
pub mod process;
mod runner;
pub mod shutdown;
pub mod wake;

pub use handler::{JobContext, JobError, JobHandler};
pub use runner::{RunReport, Runner, RunnerConfig, RunnerConfigError};
