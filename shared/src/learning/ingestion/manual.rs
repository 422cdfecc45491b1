//! Manual learning commands: `reflect turn|session`, `reprocess`, `remember`, `issue`,
//! `solved`, `forget`. They obey the same policy, source and idempotency rules as automatic
//! admission; none of them calls a model in the foreground.

use serde::Serialize;

use super::{LearningIngestion, session_project};
use crate::db::Tx;
use crate::learning::experience::{self, Experience, ExperienceError, ExperienceOrigin};
use crate::learning::{events, policy};
use crate::ledger::{Admission, JobIdentity, JobOrigin};
use crate::transcript::{Message, MessageStatus, Role, TranscriptError, TranscriptStore};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReflectScope {
    /// The latest completed assistant turn.
    Turn,
    /// Bounded sources across the durable session.
    Session,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManualError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Policy or source rules forbid the work (generation disabled/excluded, forgotten source).
    #[error("{0}")]
    Refused(String),
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

impl From<ExperienceError> for ManualError {
    fn from(error: ExperienceError) -> ManualError {
        match error {
            ExperienceError::NotFound(id) => {
                ManualError::NotFound(format!("experience `{id}` was not found"))
            }
            ExperienceError::Conflict(detail) => ManualError::Conflict(detail),
            ExperienceError::Invalid { field, reason } => ManualError::Invalid {
                field: field.to_owned(),
                reason,
            },
        }
    }
}

/// The result of a manual reflection.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReflectOutcome {
    pub scope: ReflectScope,
    pub admission: Admission,
    /// Older queued or running extractions of the same source message that this input revoked.
    pub revoked: Vec<String>,
}

type Manual<T> = Result<Result<T, ManualError>, TranscriptError>;

impl LearningIngestion {
    async fn latest_completed_assistant_in(
        &self,
        tx: &mut Tx,
        session_id: &str,
    ) -> Result<Option<Message>, TranscriptError> {
        match super::store::latest_completed_assistant_in(tx, session_id).await? {
            Some(id) => Ok(Some(self.store.message_in(tx, &id).await?)),
            None => Ok(None),
        }
    }

    /// `/reflect turn|session`: immediately due, keyed by the exact input digest, revoking older
    /// queued or running extractions of the same source message.
    pub async fn reflect(
        &self,
        session_id: &str,
        scope: ReflectScope,
        trace_parent: Option<String>,
    ) -> Manual<ReflectOutcome> {
        let mut tx = self.store.db().begin().await?;
        self.store_session_exists(&mut tx, session_id).await?;
        let Some(last) = self
            .latest_completed_assistant_in(&mut tx, session_id)
            .await?
        else {
            return Ok(Err(ManualError::NotFound(String::from(
                "the session has no completed assistant turn",
            ))));
        };
        let window = match scope {
            ReflectScope::Turn => self.turn_window_in(&mut tx, &last).await?,
            ReflectScope::Session => {
                TranscriptStore::window_in(&mut tx, session_id, 1, last.seq).await?
            }
        };
        let payload = serde_json::json!({ "reflect": scope });
        let admission = match self
            .admit_window_in(
                &mut tx,
                &window,
                true,
                JobOrigin::Manual,
                None,
                trace_parent,
                payload,
            )
            .await?
        {
            Ok(admission) => admission,
            Err(reason) => return Ok(Err(ManualError::Refused(reason))),
        };
        let mut revoked = Vec::new();
        if let Admission::Queued(job) = &admission {
            revoked = self
                .ledger
                .revoke_source_jobs_in(
                    &mut tx,
                    session_id,
                    &last.id,
                    &job.id,
                    "superseded by a newer explicit reflection",
                )
                .await
                .map_err(super::ledger_error)?;
        }
        tx.commit().await?;
        Ok(Ok(ReflectOutcome {
            scope,
            admission,
            revoked,
        }))
    }

    async fn store_session_exists(
        &self,
        tx: &mut Tx,
        session_id: &str,
    ) -> Result<(), TranscriptError> {
        session_project(tx, session_id).await.map(|_| ())
    }

    /// `/learn reprocess <assistant-message-id>`: returns the existing current-version job
    /// unchanged (whatever its state, attempts untouched), else admits one.
    pub async fn reprocess(
        &self,
        project_id: &str,
        message_id: &str,
        trace_parent: Option<String>,
    ) -> Manual<Admission> {
        let mut tx = self.store.db().begin().await?;
        let message = match self.store.message_in(&mut tx, message_id).await {
            Ok(message) => message,
            Err(TranscriptError::NotFound { .. }) => {
                return Ok(Err(ManualError::NotFound(format!(
                    "assistant message `{message_id}` was not found"
                ))));
            }
            Err(error) => return Err(error),
        };
        if session_project(&mut tx, &message.session_id).await? != project_id {
            return Ok(Err(ManualError::NotFound(format!(
                "assistant message `{message_id}` was not found in this project"
            ))));
        }
        if message.role != Role::Assistant {
            return Ok(Err(ManualError::Invalid {
                field: String::from("assistantMessageId"),
                reason: String::from(
                    "reprocess takes an assistant-message id, not an experience id",
                ),
            }));
        }
        let identity = JobIdentity::extract(
            project_id,
            &message.session_id,
            &message.id,
            self.extractor_version(),
            None,
        );
        if let Some(existing) = self
            .ledger
            .find_in(&mut tx, &identity)
            .await
            .map_err(super::ledger_error)?
        {
            tx.rollback().await?;
            return Ok(Ok(Admission::Existing(existing)));
        }
        if message.status != MessageStatus::Completed {
            return Ok(Err(ManualError::Conflict(format!(
                "assistant message `{message_id}` is `{}`, not a closed learning source",
                message.status.as_str()
            ))));
        }
        let window = self.turn_window_in(&mut tx, &message).await?;
        let delay = i64::try_from(self.config.learning.post_turn.idle_delay_ms).unwrap_or(i64::MAX);
        let run_at = (delay > 0).then(|| self.ledger.now_ms().saturating_add(delay));
        let payload = serde_json::json!({ "reprocess": true });
        let admission = match self
            .admit_window_in(
                &mut tx,
                &window,
                false,
                JobOrigin::Manual,
                run_at,
                trace_parent,
                payload,
            )
            .await?
        {
            Ok(admission) => admission,
            Err(reason) => return Ok(Err(ManualError::Refused(reason))),
        };
        tx.commit().await?;
        Ok(Ok(admission))
    }

    /// `/learn remember` and `/learn issue`: explicit user records, by a caller allowed to
    /// change global Memory.
    pub async fn record(
        &self,
        project_id: &str,
        session_id: Option<&str>,
        origin: ExperienceOrigin,
        text: &str,
    ) -> Manual<Experience> {
        self.record_by(project_id, session_id, origin, text, true)
            .await
    }

    /// [`Self::record`] by a caller who may (`global_write`) or may not change global Memory:
    /// a record of the latter reaches global Memory only through review.
    pub async fn record_by(
        &self,
        project_id: &str,
        session_id: Option<&str>,
        origin: ExperienceOrigin,
        text: &str,
        global_write: bool,
    ) -> Manual<Experience> {
        let mut tx = self.store.db().begin().await?;
        if let Some(session_id) = session_id {
            if session_project(&mut tx, session_id).await? != project_id {
                return Ok(Err(ManualError::NotFound(format!(
                    "session `{session_id}` was not found in this project"
                ))));
            }
            let policy = policy::effective_in(
                &mut tx,
                session_id,
                &self.config.learning,
                self.ledger.now_ms(),
            )
            .await?;
            if policy.generation != policy::Generation::Enabled {
                return Ok(Err(ManualError::Refused(format!(
                    "learning generation is `{}` for this session",
                    policy.generation.as_str()
                ))));
            }
        } else if !self.config.learning.generate_enabled() {
            return Ok(Err(ManualError::Refused(String::from(
                "learning generation is disabled (learning.generate)",
            ))));
        }
        let now = self.ledger.now_ms();
        let experience =
            match experience::insert_manual_in(&mut tx, project_id, session_id, origin, text, now)
                .await?
            {
                Ok(experience) => experience,
                Err(error) => return Ok(Err(error.into())),
            };
        if !global_write {
            experience::mark_without_global_write_in(&mut tx, &experience.id).await?;
        }
        changed_event_in(&mut tx, &experience, origin.as_str(), now).await?;
        crate::learning::recall::semantic::admit_in(
            &self.ledger,
            &mut tx,
            &self.config,
            project_id,
            &experience.id,
            crate::ledger::JobOrigin::Manual,
        )
        .await
        .map_err(super::ledger_error)?;
        if origin == ExperienceOrigin::Remember {
            crate::memory::maintenance::admit_in(&self.ledger, &mut tx, project_id, &experience.id)
                .await
                .map_err(super::ledger_error)?;
        }
        tx.commit().await?;
        Ok(Ok(experience))
    }

    /// `/learn solved <experience-id> <resolution>`.
    pub async fn solve(&self, experience_id: &str, resolution: &str) -> Manual<Experience> {
        let mut tx = self.store.db().begin().await?;
        let now = self.ledger.now_ms();
        let experience = match experience::solve_in(&mut tx, experience_id, resolution, now).await?
        {
            Ok(experience) => experience,
            Err(error) => return Ok(Err(error.into())),
        };
        changed_event_in(&mut tx, &experience, "solved", now).await?;
        tx.commit().await?;
        Ok(Ok(experience))
    }

    /// `/learn forget <experience-id>`: marks the evidence forgotten and, in the same
    /// transaction, retracts resident entries that lost all their sources and rejects pending
    /// candidates citing it. Returns the memory documents whose projection needs republishing.
    pub async fn forget(&self, experience_id: &str) -> Manual<(Experience, Vec<String>)> {
        let mut tx = self.store.db().begin().await?;
        let now = self.ledger.now_ms();
        let experience = match experience::forget_in(&mut tx, experience_id, now).await? {
            Ok(experience) => experience,
            Err(error) => return Ok(Err(error.into())),
        };
        let documents =
            crate::memory::service::retract_unsupported_in(&mut tx, experience_id, now).await?;
        changed_event_in(&mut tx, &experience, "forgotten", now).await?;
        tx.commit().await?;
        Ok(Ok((experience, documents)))
    }
}

async fn changed_event_in(
    tx: &mut Tx,
    experience: &Experience,
    change: &str,
    now: i64,
) -> Result<(), TranscriptError> {
    events::append_in(
        tx,
        events::EXPERIENCE_CHANGED,
        &events::EventScope {
            project_id: Some(&experience.project_id),
            session_id: experience.session_id.as_deref(),
            job_id: experience.job_id.as_deref(),
            message_id: None,
        },
        &serde_json::json!({ "experienceId": experience.id, "change": change }),
        now,
    )
    .await?;
    Ok(())
}
