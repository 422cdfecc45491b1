//! The worker runtime: the queue crate's handler trait, runner, shutdown and wake-ups, plus what
//! the learning domain adds on top — process wiring for the worker binaries and `zuno serve`
//! ([`process`]) and the one path every model call takes ([`model_call`]).

pub mod model_call;
pub mod process;

pub use zuno_queue::runtime::*;

/// A domain error inside a job: a store failure keeps its classification (so a database outage
/// re-runs the job within its attempt instead of spending it); anything else may succeed on a
/// later attempt.
impl From<crate::memory::service::MemoryError> for JobError {
    fn from(error: crate::memory::service::MemoryError) -> JobError {
        match error {
            crate::memory::service::MemoryError::Store(store) => store.into(),
            other => JobError::retryable(other.to_string()),
        }
    }
}

/// As for [`crate::memory::service::MemoryError`]: store failures keep their classification.
impl From<crate::skills::SkillError> for JobError {
    fn from(error: crate::skills::SkillError) -> JobError {
        match error {
            crate::skills::SkillError::Store(store) => store.into(),
            crate::skills::SkillError::Ledger(crate::ledger::LedgerError::Store(store)) => {
                store.into()
            }
            other => JobError::retryable(other.to_string()),
        }
    }
}
