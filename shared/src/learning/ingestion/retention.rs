//! Session deletion (transcript retention). Session-owned feedback and learning jobs go with the
//! transcript; project learning (Experience, Memory) survives with its session provenance
//! detached, unless the caller explicitly chooses derived-learning cleanup. Deleting the source
//! messages marks surviving derived Experience `changed`, which withholds it from recall.

use serde::Serialize;

use super::LearningIngestion;
use crate::transcript::TranscriptError;

/// What a session deletion removed.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDeletion {
    pub session_id: String,
    /// Learning jobs of the session (queued, running or finished) that were deleted. A running
    /// worker loses its lease fence and cannot settle.
    pub jobs_removed: u64,
    /// Derived Experience deleted because `cleanupDerivedExperiences` was true.
    pub experiences_removed: Vec<String>,
    /// Derived Experience kept (detached from the session, withheld from recall).
    pub experiences_kept: u64,
    /// Memory documents whose projection must be republished after commit.
    #[serde(skip)]
    pub documents: Vec<String>,
}

impl LearningIngestion {
    /// Deletes a session and what it owns in one transaction. `cleanup_derived` is the explicit
    /// keep-versus-clean choice (`cleanupDerivedExperiences` on `DELETE /api/session/{id}`);
    /// there is no default, so a deletion never guesses what happens to derived Experience.
    pub async fn delete_session(
        &self,
        session_id: &str,
        cleanup_derived: bool,
    ) -> Result<SessionDeletion, TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let now = self.ledger.now_ms();
        let exists: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT id FROM session WHERE id = $1"
        )
        .bind(session_id)
        .fetch_optional(conn)
        .await)?;
        if exists.is_none() {
            return Err(TranscriptError::NotFound {
                what: "session",
                id: session_id.to_owned(),
            });
        }
        // Derived Experience: produced by the session's jobs or citing its messages.
        let derived: Vec<String> = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT id FROM experience_record WHERE session_id = $1 \
                 UNION SELECT e.experience_id FROM experience_evidence e JOIN message m ON m.id = e.message_id \
                 WHERE m.session_id = $1 ORDER BY 1")
            .bind(session_id).fetch_all(conn).await
        })?;
        let mut documents: Vec<String> = Vec::new();
        let mut removed = Vec::new();
        if cleanup_derived {
            for experience_id in &derived {
                // Retract resident entries that lose their last support before the provenance
                // rows cascade away with the Experience.
                crate::db::execute_in(
                    &mut tx,
                    "UPDATE experience_record SET status = 'forgotten', forgotten_at = $2, updated_at = $2 WHERE id = $1",
                    &[experience_id.into(), now.into()],
                )
                .await?;
                for document in
                    crate::memory::service::retract_unsupported_in(&mut tx, experience_id, now)
                        .await?
                {
                    if !documents.contains(&document) {
                        documents.push(document);
                    }
                }
                crate::db::execute_in(
                    &mut tx,
                    "DELETE FROM experience_record WHERE id = $1",
                    &[experience_id.into()],
                )
                .await?;
                removed.push(experience_id.clone());
            }
        }
        let jobs_removed = crate::db::execute_in(
            &mut tx,
            "DELETE FROM learning_job WHERE session_id = $1",
            &[session_id.into()],
        )
        .await?;
        crate::db::execute_in(
            &mut tx,
            "DELETE FROM session WHERE id = $1",
            &[session_id.into()],
        )
        .await?;
        tx.commit().await?;
        Ok(SessionDeletion {
            session_id: session_id.to_owned(),
            jobs_removed,
            experiences_kept: (derived.len() - removed.len()) as u64,
            experiences_removed: removed,
            documents,
        })
    }
}
