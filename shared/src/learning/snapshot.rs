//! `LearningSourceSnapshot`: the closed turn an extraction job is bound to, and the claim gate
//! that revalidates it against stored rows inside the ledger's own transactions.

use async_trait::async_trait;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::db::{StoreError, Tx};
use crate::ledger::{ClaimGate, GateDecision, Job, JobKind};
use crate::transcript::{Message, MessageStatus, TranscriptStore};

/// The bound source of one extraction job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceSnapshot {
    pub project_id: String,
    pub session_id: String,
    pub start_message_id: String,
    pub end_message_id: String,
    pub start_seq: i64,
    pub end_seq: i64,
    pub completed_at: i64,
    pub terminal_digest: String,
    pub manifest_digest: String,
}

impl SourceSnapshot {
    /// Binds the closed turn `window` (oldest first, ending with the completed assistant message).
    pub fn capture(project_id: &str, window: &[Message]) -> Option<SourceSnapshot> {
        let first = window.first()?;
        let last = window.last()?;
        Some(SourceSnapshot {
            project_id: project_id.to_owned(),
            session_id: last.session_id.clone(),
            start_message_id: first.id.clone(),
            end_message_id: last.id.clone(),
            start_seq: first.seq,
            end_seq: last.seq,
            completed_at: last.completed_at.unwrap_or(last.created_at),
            terminal_digest: message_digest(last),
            manifest_digest: window_digest(window),
        })
    }

    pub async fn insert_in(&self, tx: &mut Tx, job_id: &str) -> Result<(), StoreError> {
        let sql = "INSERT INTO learning_source_snapshot (job_id, project_id, session_id, \
                     start_message_id, end_message_id, start_seq, end_seq, completed_at, \
                     terminal_digest, manifest_digest) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (job_id) DO NOTHING";
        crate::on_tx!(tx, conn => sqlx::query(sql)
            .bind(job_id)
            .bind(&self.project_id)
            .bind(&self.session_id)
            .bind(&self.start_message_id)
            .bind(&self.end_message_id)
            .bind(self.start_seq)
            .bind(self.end_seq)
            .bind(self.completed_at)
            .bind(&self.terminal_digest)
            .bind(&self.manifest_digest)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(())
    }

    pub async fn load_in(tx: &mut Tx, job_id: &str) -> Result<Option<SourceSnapshot>, StoreError> {
        let sql = "SELECT project_id, session_id, start_message_id, end_message_id, start_seq, \
                     end_seq, completed_at, terminal_digest, manifest_digest \
                   FROM learning_source_snapshot WHERE job_id = $1";
        Ok(crate::on_tx!(tx, conn => sqlx::query_as(sql).bind(job_id).fetch_optional(conn).await)?)
    }

    /// Recomputes the snapshot from stored rows in `tx` and compares
    /// (`extraction_sources_current_on`).
    pub async fn check_in(&self, tx: &mut Tx) -> Result<SourceCheck, StoreError> {
        let window =
            match TranscriptStore::window_in(tx, &self.session_id, self.start_seq, self.end_seq)
                .await
            {
                Ok(window) => window,
                Err(crate::transcript::TranscriptError::Store(error)) => return Err(error),
                Err(other) => return Ok(SourceCheck::Unavailable(other.to_string())),
            };
        let (Some(first), Some(last)) = (window.first(), window.last()) else {
            return Ok(SourceCheck::Unavailable(String::from(
                "the source messages were deleted",
            )));
        };
        if first.id != self.start_message_id || last.id != self.end_message_id {
            return Ok(SourceCheck::Unavailable(String::from(
                "the source window no longer starts and ends with the bound messages",
            )));
        }
        if last.status != MessageStatus::Completed {
            return Ok(SourceCheck::Changed(format!(
                "the terminal message is now `{}`",
                last.status.as_str()
            )));
        }
        if message_digest(last) != self.terminal_digest {
            return Ok(SourceCheck::Changed(String::from(
                "the terminal message changed",
            )));
        }
        if window_digest(&window) != self.manifest_digest {
            return Ok(SourceCheck::Changed(String::from(
                "a source message changed",
            )));
        }
        Ok(SourceCheck::Current)
    }
}

/// The result of revalidating a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCheck {
    Current,
    Changed(String),
    Unavailable(String),
}

fn message_digest(message: &Message) -> String {
    let mut hasher = Sha256::new();
    digest_message(&mut hasher, message);
    hex::encode(hasher.finalize())
}

fn window_digest(window: &[Message]) -> String {
    let mut hasher = Sha256::new();
    for message in window {
        digest_message(&mut hasher, message);
    }
    hex::encode(hasher.finalize())
}

fn digest_message(hasher: &mut Sha256, message: &Message) {
    for field in [
        message.id.as_str(),
        message.role.as_str(),
        message.status.as_str(),
        &message.revision.to_string(),
    ] {
        hasher.update(field.as_bytes());
        hasher.update([0x1f]);
    }
    for part in &message.parts {
        hasher.update(part.ordinal.to_le_bytes());
        hasher.update(part.content_digest.as_bytes());
    }
    hasher.update([0x1e]);
}

/// The claim gate for extraction jobs: a job whose bound source changed or disappeared settles
/// `skipped` without spending an attempt. Jobs without a verified snapshot never gain a lease.
#[derive(Debug, Default, Clone, Copy)]
pub struct SourceGate;

#[async_trait]
impl ClaimGate for SourceGate {
    async fn check(&self, tx: &mut Tx, job: &Job) -> Result<GateDecision, StoreError> {
        if job.kind != JobKind::Extract {
            return Ok(GateDecision::Proceed);
        }
        let Some(snapshot) = SourceSnapshot::load_in(tx, &job.id).await? else {
            return Ok(GateDecision::Skip {
                reason: String::from("the job has no verified source snapshot"),
            });
        };
        Ok(match snapshot.check_in(tx).await? {
            SourceCheck::Current => GateDecision::Proceed,
            SourceCheck::Changed(reason) => GateDecision::Skip {
                reason: format!("source changed: {reason}"),
            },
            SourceCheck::Unavailable(reason) => GateDecision::Skip {
                reason: format!("source unavailable: {reason}"),
            },
        })
    }
}
