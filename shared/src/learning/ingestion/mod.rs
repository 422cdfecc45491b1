//! `LearningIngestion`: sessions with frozen policy, closed-turn admission, feedback, manual
//! selection (`reflect`, `reprocess`), history repair and start-up catch-up.
//!
//! Admission happens in the same transaction as the write that closes a turn: the status
//! change, the eligibility decision, the job row and its source snapshot commit together, so a
//! completed turn is never left without its job and a job never exists without the snapshot the
//! database revalidates at claim.

mod manual;
mod repair;
mod retention;
mod store;

use std::sync::Arc;

use serde::Serialize;

pub use manual::ReflectOutcome;
pub use manual::{ManualError, ReflectScope};
pub use repair::{CATCH_UP_LIMIT, REPAIR_BATCH as REPAIR_BATCH_LIMIT, RepairAction, RepairReport};
pub use retention::{ProjectDeletion, SessionDeletion};

use super::eligibility::{self, Eligibility};
use super::feedback::{self, Feedback, FeedbackError, FeedbackValue};
use super::snapshot::{SourceSnapshot, cited_sources, manifest_for};
use super::{experience, policy};
use crate::config::Config;
use crate::db::Tx;
use crate::ledger::{Admission, JobIdentity, JobKind, JobOrigin, Ledger, NewJob};
use crate::transcript::{
    Message, MessageStatus, NewMessage, NewSession, Role, Session, TranscriptError, TranscriptStore,
};

/// The first rules extractor's version, kept for reprocessing comparisons.
pub const RULES_EXTRACTOR_VERSION: &str = super::rules::RULES_1;
/// The default rules extractor's version.
pub const RULES_2_EXTRACTOR_VERSION: &str = super::rules::RULES_2;
/// The model extractor's version.
pub const MODEL_EXTRACTOR_VERSION: &str = "model-1";

/// The extractor new jobs are admitted for: the model extractor when a provider is configured,
/// else the configured rules extractor (`rules-2` unless `learning.rules_extractor` says
/// `rules-1`).
pub fn extractor_version(config: &Config) -> &'static str {
    if config.providers.is_empty() {
        config.learning.rules_extractor.version()
    } else {
        MODEL_EXTRACTOR_VERSION
    }
}

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

impl TurnOutcome {
    /// A stored message that closes no turn: nothing was judged or admitted.
    fn open(message: Message) -> Self {
        TurnOutcome {
            message,
            eligibility: None,
            admission: None,
            not_admitted: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LearningIngestion {
    store: TranscriptStore,
    ledger: Ledger,
    config: Arc<Config>,
}

impl LearningIngestion {
    pub fn new(store: TranscriptStore, ledger: Ledger, config: Arc<Config>) -> Self {
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

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The extractor version new jobs are admitted under.
    pub fn extractor_version(&self) -> &'static str {
        extractor_version(&self.config)
    }

    /// Creates a session and freezes its policy in one transaction (a child copies its
    /// parent's latest durable policy).
    pub async fn create_session(
        &self,
        new: &NewSession,
    ) -> Result<(Session, policy::SessionPolicy), TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let session = self.store.create_session_in(&mut tx, new).await?;
        let policy = policy::create_in(
            &mut tx,
            &session.id,
            session.parent_id.as_deref(),
            &self.config.learning,
            self.ledger.now_ms(),
        )
        .await?;
        tx.commit().await?;
        Ok((session, policy))
    }

    /// Appends a message; an assistant message that arrives already ended closes its turn in the
    /// same transaction.
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
        crate::guards::record_violations_in(&mut tx, &message, self.ledger.now_ms()).await?;
        let outcome = if message.role == Role::Assistant && message.status.ends_turn() {
            self.close_turn_in(&mut tx, message, JobOrigin::ClosedTurn, false, trace_parent)
                .await?
        } else {
            TurnOutcome::open(message)
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Sets an assistant message's completion status; `completed` closes its turn.
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
        let outcome = self
            .close_turn_in(&mut tx, message, JobOrigin::ClosedTurn, false, trace_parent)
            .await?;
        tx.commit().await?;
        Ok(outcome)
    }

    /// Writes feedback (compare-and-set on its revision) and, since feedback makes a completed
    /// turn eligible, admits the turn's extraction in the same transaction.
    pub async fn set_feedback(
        &self,
        message_id: &str,
        value: FeedbackValue,
        note: Option<&str>,
        expected_revision: i64,
        trace_parent: Option<String>,
    ) -> Result<Result<(Feedback, TurnOutcome), FeedbackError>, TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let feedback = match feedback::set_in(
            &mut tx,
            message_id,
            value,
            note,
            expected_revision,
            self.ledger.now_ms(),
        )
        .await?
        {
            Ok(feedback) => feedback,
            Err(error) => return Ok(Err(error)),
        };
        let message = self.store.message_in(&mut tx, message_id).await?;
        let outcome = if message.status == MessageStatus::Completed {
            self.close_turn_in(&mut tx, message, JobOrigin::ClosedTurn, true, trace_parent)
                .await?
        } else {
            TurnOutcome::open(message)
        };
        tx.commit().await?;
        Ok(Ok((feedback, outcome)))
    }

    /// The turn that `message` (an assistant message) ends, oldest first.
    pub(crate) async fn turn_window_in(
        &self,
        tx: &mut Tx,
        message: &Message,
    ) -> Result<Vec<Message>, TranscriptError> {
        let start =
            TranscriptStore::previous_turn_end_in(tx, &message.session_id, message.seq).await? + 1;
        TranscriptStore::window_in(tx, &message.session_id, start, message.seq).await
    }

    /// Assesses the turn `message` closes and admits its extraction. `keyed_by_input` (new
    /// feedback on an already closed turn) joins the input digest to the job identity: the turn
    /// as it now reads is a new input, so it gets a job of its own instead of the existing one,
    /// which the changed source would skip.
    async fn close_turn_in(
        &self,
        tx: &mut Tx,
        message: Message,
        origin: JobOrigin,
        keyed_by_input: bool,
        trace_parent: Option<String>,
    ) -> Result<TurnOutcome, TranscriptError> {
        let window = self.turn_window_in(tx, &message).await?;
        let has_feedback = feedback::load_in(tx, &message.id).await?.is_some();
        let assessed = eligibility::assess(&window, has_feedback);
        let mut outcome = TurnOutcome {
            message,
            eligibility: Some(assessed.clone()),
            admission: None,
            not_admitted: None,
        };
        let session_id = outcome.message.session_id.clone();
        let now = self.ledger.now_ms();
        // Exclusion reads durable tool metadata, and applies whether or not the turn is eligible.
        if self.config.learning.post_turn.disable_on_external_context
            && assessed.consumed_external_context
        {
            policy::exclude_in(
                tx,
                &session_id,
                "a completed turn consumed a successful Web/MCP result",
                &self.config.learning,
                now,
            )
            .await?;
            self.skip_queued_automatic_in(tx, &session_id).await?;
            outcome.not_admitted = Some(String::from(
                "the session is excluded: a turn consumed a Web/MCP result",
            ));
            return Ok(outcome);
        }
        if !assessed.eligible {
            return Ok(outcome);
        }
        if !self.config.learning.post_turn_enabled() {
            outcome.not_admitted = Some(String::from(
                "automatic extraction is disabled (learning.enabled, learning.generate or learning.post_turn.enabled)",
            ));
            return Ok(outcome);
        }
        let delay = i64::try_from(self.config.learning.post_turn.idle_delay_ms).unwrap_or(i64::MAX);
        let run_at = (delay > 0).then(|| now.saturating_add(delay));
        match self
            .admit_window_in(
                tx,
                &window,
                keyed_by_input,
                origin,
                run_at,
                trace_parent,
                serde_json::json!({ "reasons": assessed.reasons }),
            )
            .await?
        {
            Ok(admission) => outcome.admission = Some(admission),
            Err(reason) => outcome.not_admitted = Some(reason),
        }
        Ok(outcome)
    }

    /// The turn before `window` (what a correction in it may refer to, an interrupted turn
    /// included), oldest first; empty when the window starts the session.
    async fn context_before_in(
        tx: &mut Tx,
        window: &[Message],
    ) -> Result<Vec<Message>, TranscriptError> {
        let Some(first) = window.first() else {
            return Ok(Vec::new());
        };
        let end = TranscriptStore::previous_turn_end_in(tx, &first.session_id, first.seq).await?;
        if end <= 0 {
            return Ok(Vec::new());
        }
        let start = TranscriptStore::previous_turn_end_in(tx, &first.session_id, end).await? + 1;
        TranscriptStore::window_in(tx, &first.session_id, start, end).await
    }

    /// Admits an extraction of `window` after the policy and forgotten-source checks. Manual
    /// reflection is `keyed_by_input`: the manifest digest joins the job identity, so new
    /// feedback or a wider selection is a new job while identical input stays idempotent. The
    /// snapshot is inserted when the job is new. Returns the reason when admission is refused.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn admit_window_in(
        &self,
        tx: &mut Tx,
        window: &[Message],
        keyed_by_input: bool,
        origin: JobOrigin,
        run_at: Option<i64>,
        trace_parent: Option<String>,
        payload: serde_json::Value,
    ) -> Result<Result<Admission, String>, TranscriptError> {
        let Some(last) = window.last() else {
            return Ok(Err(String::from("no source messages")));
        };
        let now = self.ledger.now_ms();
        let session_id = last.session_id.clone();
        let project_id = session_project(tx, &session_id).await?;
        let policy = policy::effective_in(tx, &session_id, &self.config.learning, now).await?;
        if policy.generation != policy::Generation::Enabled {
            return Ok(Err(format!(
                "learning generation is `{}` for this session",
                policy.generation.as_str()
            )));
        }
        let bound =
            usize::try_from(self.config.learning.execution.max_input_bytes).unwrap_or(usize::MAX);
        let context = Self::context_before_in(tx, window).await?;
        let manifest = manifest_for(tx, &context, window, bound).await?;
        if experience::any_forgotten_in(tx, &cited_sources(&manifest)).await? {
            return Ok(Err(String::from(
                "a source of this turn was explicitly forgotten",
            )));
        }
        let Some(snapshot) =
            SourceSnapshot::capture(&project_id, &context, window, &manifest, bound)
        else {
            return Ok(Err(String::from("no source messages")));
        };
        let digest = keyed_by_input.then_some(manifest.digest.as_str());
        let identity = JobIdentity::extract(
            &project_id,
            &session_id,
            &last.id,
            self.extractor_version(),
            digest,
        );
        let mut job = NewJob::new(identity, origin)
            .with_trace_parent(trace_parent)
            .with_payload(payload);
        if let Some(run_at) = run_at {
            job = job.due_at(run_at);
        }
        let admission = self.ledger.admit_in(tx, job).await.map_err(ledger_error)?;
        if let Admission::Queued(job) = &admission {
            snapshot.insert_in(tx, &job.id).await?;
        }
        Ok(Ok(admission))
    }
}

pub(crate) async fn session_project(
    tx: &mut Tx,
    session_id: &str,
) -> Result<String, TranscriptError> {
    let project = crate::transcript::session_project_in(tx, session_id).await?;
    project.ok_or_else(|| TranscriptError::NotFound {
        what: "session",
        id: session_id.to_owned(),
    })
}

pub(crate) fn ledger_error(error: crate::ledger::LedgerError) -> TranscriptError {
    match error {
        crate::ledger::LedgerError::Store(store) => TranscriptError::Store(store),
        other => TranscriptError::Conflict(other.to_string()),
    }
}

impl LearningIngestion {
    /// Skips a session's queued automatic extraction (it became excluded); what a person asked
    /// for by hand still runs.
    async fn skip_queued_automatic_in(
        &self,
        tx: &mut Tx,
        session_id: &str,
    ) -> Result<(), TranscriptError> {
        let selection = crate::ledger::QueuedJobs {
            kind: JobKind::Extract,
            scope: crate::ledger::JobScope::Session(session_id),
            origins: &[JobOrigin::ClosedTurn, JobOrigin::Legacy],
        };
        self.ledger
            .skip_queued_in(tx, selection, "the session was excluded from learning")
            .await
            .map_err(ledger_error)?;
        Ok(())
    }
}
