//! Durable learning events (`learning.extraction.request`, `learning.extraction.outcome`,
//! `learning.feedback.changed`, `learning.retrieval_skipped`, …).

use serde::Serialize;

pub use super::store::events::{append_in, for_job, for_session};

pub const EXTRACTION_REQUEST: &str = "learning.extraction.request";
pub const EXTRACTION_OUTCOME: &str = "learning.extraction.outcome";
pub const FEEDBACK_CHANGED: &str = "learning.feedback.changed";
pub const POLICY_CHANGED: &str = "learning.policy.changed";
pub const EXPERIENCE_CHANGED: &str = "learning.experience.changed";

/// Where an event belongs.
#[derive(Debug, Clone, Default)]
pub struct EventScope<'a> {
    pub project_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub message_id: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LearningEvent {
    pub id: String,
    pub kind: String,
    pub project_id: Option<String>,
    pub session_id: Option<String>,
    pub job_id: Option<String>,
    pub message_id: Option<String>,
    /// JSON text.
    pub payload: String,
    pub at: i64,
}
