//! `LearningIngestion`: admits an extraction job when an assistant turn closes.
//!
//! The status change, the eligibility decision, the job row and its source snapshot commit in
//! one transaction, so a completed turn is never left without its job and a job never exists
//! without the snapshot that the database will revalidate at claim.

use serde::Serialize;

use super::eligibility::{self, Eligibility};
use super::snapshot::SourceSnapshot;
use crate::config::Config;
use crate::db::Tx;
use crate::ledger::{Admission, JobIdentity, JobOrigin, Ledger, NewJob};
use crate::transcript::{
    Message, MessageStatus, NewMessage, Role, TranscriptError, TranscriptStore,
};

/// The built-in rules extractor's version. A new version admits one upgrade job per source.
pub const RULES_EXTRACTOR_VERSION: &str = "rules-1";

/// What happened when a message was stored or completed.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnOutcome {
    pub message: Message,
    /// Present when the message closed an assistant turn.
    pub eligibility: Option<Eligibility>,
    /// Present when an extraction job was admitted (or already existed).
    pub admission: Option<Admission>,
    /// Why no job was admitted although the turn was eligible (learning disabled, …).
    pub not_admitted: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LearningIngestion {
    store: TranscriptStore,
    ledger: Ledger,
    config: std::sync::Arc<Config>,
}

impl LearningIngestion {
    pub fn new(store: TranscriptStore, ledger: Ledger, config: std::sync::Arc<Config>) -> Self {
        LearningIngestion {
            store,
            ledger,
            config,
        }
    }

    pub fn store(&self) -> &TranscriptStore {
        &self.store
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The extractor version new jobs are admitted under.
    pub fn extractor_version(&self) -> &'static str {
        RULES_EXTRACTOR_VERSION
    }

    /// Appends a message; when it is an assistant message that arrives already completed, the
    /// turn is assessed and admitted in the same transaction.
    pub async fn append_message(
        &self,
        session_id: &str,
        new: &NewMessage,
        trace_parent: Option<String>,
    ) -> Result<TurnOutcome, TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let message = self
            .store
            .append_message_in(&mut tx, session_id, new)
            .await?;
        let outcome = if message.role == Role::Assistant && message.status.ends_turn() {
            self.close_turn_in(&mut tx, message, trace_parent).await?
        } else {
            TurnOutcome {
                message,
                eligibility: None,
                admission: None,
                not_admitted: None,
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Sets an assistant message's completion status and, when that closes an eligible turn,
    /// admits its extraction job.
    pub async fn complete_message(
        &self,
        message_id: &str,
        status: MessageStatus,
        trace_parent: Option<String>,
    ) -> Result<TurnOutcome, TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let message = self
            .store
            .set_status_in(&mut tx, message_id, status)
            .await?;
        let outcome = self.close_turn_in(&mut tx, message, trace_parent).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn close_turn_in(
        &self,
        tx: &mut Tx,
        message: Message,
        trace_parent: Option<String>,
    ) -> Result<TurnOutcome, TranscriptError> {
        let start =
            TranscriptStore::previous_turn_end_in(tx, &message.session_id, message.seq).await? + 1;
        let window =
            TranscriptStore::window_in(tx, &message.session_id, start, message.seq).await?;
        let assessed = eligibility::assess(&window, false);
        let mut outcome = TurnOutcome {
            message,
            eligibility: Some(assessed.clone()),
            admission: None,
            not_admitted: None,
        };
        if !assessed.eligible {
            return Ok(outcome);
        }
        if !self.config.learning.post_turn_enabled() {
            outcome.not_admitted = Some(String::from(
                "automatic extraction is disabled (learning.enabled, learning.generate or learning.post_turn.enabled)",
            ));
            return Ok(outcome);
        }
        let project_id = session_project(tx, &outcome.message.session_id).await?;
        let Some(snapshot) = SourceSnapshot::capture(&project_id, &window) else {
            return Ok(outcome);
        };
        let identity = JobIdentity::extract(
            &project_id,
            &outcome.message.session_id,
            &outcome.message.id,
            self.extractor_version(),
            None,
        );
        let delay = i64::try_from(self.config.learning.post_turn.idle_delay_ms).unwrap_or(i64::MAX);
        let mut job = NewJob::new(identity, JobOrigin::ClosedTurn)
            .with_trace_parent(trace_parent)
            .with_payload(serde_json::json!({ "reasons": assessed.reasons }));
        if delay > 0 {
            job = job.due_at(self.ledger.now_ms().saturating_add(delay));
        }
        let admission = self.ledger.admit_in(tx, job).await.map_err(ledger_error)?;
        if let Admission::Queued(job) = &admission {
            snapshot.insert_in(tx, &job.id).await?;
        }
        outcome.admission = Some(admission);
        Ok(outcome)
    }
}

async fn session_project(tx: &mut Tx, session_id: &str) -> Result<String, TranscriptError> {
    let project: Option<String> = crate::on_tx!(tx, conn =>
        sqlx::query_scalar("SELECT project_id FROM session WHERE id = $1")
            .bind(session_id)
            .fetch_optional(conn)
            .await)?;
    project.ok_or_else(|| TranscriptError::NotFound {
        what: "session",
        id: session_id.to_owned(),
    })
}

fn ledger_error(error: crate::ledger::LedgerError) -> TranscriptError {
    match error {
        crate::ledger::LedgerError::Store(store) => TranscriptError::Store(store),
        other => TranscriptError::Conflict(other.to_string()),
    }
}
