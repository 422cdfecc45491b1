//! The learning flywheel's host-side policy: which turns are learning sources, the source
//! snapshots jobs are bound to, and admission.

pub mod changes;
pub mod eligibility;
pub mod events;
pub mod experience;
pub mod extraction;
pub mod feedback;
mod ingestion;
pub mod manifest;
pub mod policy;
pub mod projection;
pub mod recall;
pub mod retrieval;
pub mod rules;
pub mod signals;
mod snapshot;
mod store;
pub mod usage;
pub mod validate;

pub use ingestion::{
    CATCH_UP_LIMIT, LearningIngestion, MODEL_EXTRACTOR_VERSION, ManualError, ProjectDeletion,
    RULES_2_EXTRACTOR_VERSION, RULES_EXTRACTOR_VERSION, ReflectOutcome, ReflectScope, RepairAction,
    RepairReport, SessionDeletion, TurnOutcome, extractor_version,
};
pub use snapshot::{
    CheckedSource, SourceCheck, SourceGate, SourceSnapshot, cited_sources, manifest_for,
};
