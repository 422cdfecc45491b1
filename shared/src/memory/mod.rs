//! Resident Memory: authoritative entries in the database and their Markdown projections.

pub mod consolidate;
pub mod dedupe;
pub mod maintenance;
pub mod markdown;
pub mod service;
pub mod store;
pub mod write_check;

/// The module's former name, still imported by worker-maintain and worker-mine; remove once they
/// import [`write_check`].
#[doc(hidden)]
pub use write_check as validate;
