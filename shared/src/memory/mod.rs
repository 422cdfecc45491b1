//! Resident Memory: authoritative entries in the database and their Markdown projections.

pub mod consolidate;
pub mod dedupe;
pub mod maintenance;
pub mod markdown;
pub mod service;
pub mod store;
pub mod write_check;
