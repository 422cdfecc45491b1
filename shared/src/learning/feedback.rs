//! `FeedbackService`: revisioned feedback on one persisted assistant message. Revision 0 means
//! no feedback may exist yet; a positive revision must match the current row; every material
//! change increments it; a stale write is a conflict. The current value and an appended
//! `learning.feedback.changed` event commit together.

use serde::{Deserialize, Serialize};

use super::events::{self, EventScope};
use super::store::feedback as store;
use crate::db::{StoreError, Tx};
use crate::transcript::Role;

zuno_queue::text_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum FeedbackValue {
        Positive = "positive",
        Negative = "negative",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Feedback {
    pub message_id: String,
    pub session_id: String,
    pub value: FeedbackValue,
    pub note: Option<String>,
    pub revision: i64,
    pub updated_at: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FeedbackError {
    #[error("message `{0}` was not found")]
    NotFound(String),
    #[error("feedback targets an assistant message; `{0}` is not one")]
    NotAssistant(String),
    #[error("stale feedback revision: expected {expected}, current is {current}")]
    Stale { expected: i64, current: i64 },
    #[error("the note is longer than 2000 characters")]
    NoteTooLong,
}

/// The feedback on `message_id`, if any.
pub async fn load_in(tx: &mut Tx, message_id: &str) -> Result<Option<Feedback>, StoreError> {
    store::load_in(tx, message_id).await
}

/// Sets feedback with an expected revision (0 = none may exist).
pub async fn set_in(
    tx: &mut Tx,
    message_id: &str,
    value: FeedbackValue,
    note: Option<&str>,
    expected_revision: i64,
    now: i64,
) -> Result<Result<Feedback, FeedbackError>, StoreError> {
    if note.is_some_and(|n| n.chars().count() > 2000) {
        return Ok(Err(FeedbackError::NoteTooLong));
    }
    let (session_id, project_id) = match assistant_message_in(tx, message_id).await? {
        Ok(found) => found,
        Err(error) => return Ok(Err(error)),
    };
    let current = load_in(tx, message_id).await?;
    let current_revision = current.as_ref().map_or(0, |f| f.revision);
    if current_revision != expected_revision {
        return Ok(Err(FeedbackError::Stale {
            expected: expected_revision,
            current: current_revision,
        }));
    }
    if let Some(current) = &current
        && current.value == value
        && current.note.as_deref() == note
    {
        // Not a material change: nothing to record.
        return Ok(Ok(current.clone()));
    }
    let next = Feedback {
        message_id: message_id.to_owned(),
        session_id,
        value,
        note: note.map(str::to_owned),
        revision: current_revision + 1,
        updated_at: now,
    };
    if write_in(tx, &next, expected_revision).await? != 1 {
        let latest = load_in(tx, message_id).await?.map_or(0, |f| f.revision);
        return Ok(Err(FeedbackError::Stale {
            expected: expected_revision,
            current: latest,
        }));
    }
    record_change_in(tx, &next, &project_id, current, now).await?;
    Ok(Ok(next))
}

/// The session and project of `message_id`, which must be an assistant message.
async fn assistant_message_in(
    tx: &mut Tx,
    message_id: &str,
) -> Result<Result<(String, String), FeedbackError>, StoreError> {
    let target = store::target_in(tx, message_id).await?;
    let Some(target) = target else {
        return Ok(Err(FeedbackError::NotFound(message_id.to_owned())));
    };
    if Role::parse(&target.role) != Some(Role::Assistant) {
        return Ok(Err(FeedbackError::NotAssistant(message_id.to_owned())));
    }
    Ok(Ok((target.session_id, target.project_id)))
}

/// Writes `next` compare-and-set: returns the rows written, 0 when a concurrent writer got
/// there first (the first feedback already exists, or the revision moved on).
async fn write_in(tx: &mut Tx, next: &Feedback, expected_revision: i64) -> Result<u64, StoreError> {
    if expected_revision == 0 {
        store::insert_first_in(tx, next).await
    } else {
        store::update_in(tx, next, expected_revision).await
    }
}

/// Appends the `learning.feedback.changed` event, in the transaction that wrote `next`.
async fn record_change_in(
    tx: &mut Tx,
    next: &Feedback,
    project_id: &str,
    previous: Option<Feedback>,
    now: i64,
) -> Result<(), StoreError> {
    events::append_in(
        tx,
        events::FEEDBACK_CHANGED,
        &EventScope {
            project_id: Some(project_id),
            session_id: Some(&next.session_id),
            message_id: Some(&next.message_id),
            job_id: None,
        },
        &serde_json::json!({
            "messageId": next.message_id,
            "value": next.value,
            "note": next.note,
            "revision": next.revision,
            "previous": previous.map(|f| serde_json::json!({"value": f.value, "revision": f.revision})),
        }),
        now,
    )
    .await?;
    Ok(())
}
