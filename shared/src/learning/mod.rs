//! The learning flywheel's host-side policy: which turns are learning sources, the source
//! snapshots jobs are bound to, and admission.

pub mod eligibility;
pub mod extraction;
mod ingestion;
pub mod manifest;
pub mod redact;
pub mod signals;
mod snapshot;

pub use ingestion::{LearningIngestion, RULES_EXTRACTOR_VERSION, TurnOutcome};
pub use snapshot::{SourceCheck, SourceGate, SourceSnapshot};
