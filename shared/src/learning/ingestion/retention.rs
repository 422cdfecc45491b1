//! Session deletion (transcript retention). Session-owned feedback and learning jobs go with the
//! transcript; project learning (Experience, Memory) survives with its session provenance
//! detached, unless the caller explicitly chooses derived-learning cleanup. Deleting the source
//! messages marks surviving derived Experience `changed`, which withholds it from recall.

use serde::Serialize;

use super::LearningIngestion;
use crate::ledger::JobScope;
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
        let jobs_removed = self
            .ledger
            .prune_in(
                &mut tx,
                JobScope::Session(session_id),
                "its session was deleted",
            )
            .await
            .map_err(super::ledger_error)?;
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

/// What a project deletion removed.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectDeletion {
    pub project_id: String,
    /// Sessions deleted with their messages and feedback.
    pub sessions_removed: u64,
    /// The project's Experience, deleted.
    pub experiences_removed: u64,
    /// The project's learning jobs (queued, running or finished), deleted. A running worker
    /// loses its lease fence and cannot settle.
    pub jobs_removed: u64,
    /// Pending global Memory candidates the project proposed, now `stale`.
    pub candidates_withdrawn: u64,
    /// The worktree the project was bound to; its `.zuno/RULES.md` and applied Skills stay on
    /// disk.
    pub worktree: Option<String>,
    /// Global Memory documents whose projection must be republished after commit.
    #[serde(skip)]
    pub documents: Vec<String>,
}

impl LearningIngestion {
    /// Deletes a project and everything it owns in one transaction: sessions and transcripts,
    /// Experience, project Memory, patterns and Skill candidates (the schema's cascades), its
    /// learning jobs (no foreign key; a running worker loses its fence, as with
    /// [`LearningIngestion::delete_session`]), prompt receipts, learning events and aggregation
    /// watermarks. Global Memory keeps only what other evidence or a person supports: a derived
    /// entry whose last support was this project's Experience is retracted, and the project's
    /// pending global candidates become `stale`. API tokens naming the project are left alone.
    pub async fn delete_project(
        &self,
        project_id: &str,
    ) -> Result<ProjectDeletion, TranscriptError> {
        let mut tx = self.store.db().begin().await?;
        let now = self.ledger.now_ms();
        let worktree: Option<Option<String>> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT worktree FROM project WHERE id = $1"
        )
        .bind(project_id)
        .fetch_optional(conn)
        .await)?;
        let Some(worktree) = worktree else {
            return Err(TranscriptError::NotFound {
                what: "project",
                id: project_id.to_owned(),
            });
        };
        let documents = retract_global_support_in(&mut tx, project_id, now).await?;
        let candidates_withdrawn = crate::db::execute_in(
            &mut tx,
            "UPDATE memory_candidate SET state = 'stale', detail = 'its project was deleted', \
               updated_at = $2 WHERE project_id = $1 AND state = 'pending'",
            &[project_id.into(), now.into()],
        )
        .await?;
        let count = |table: &'static str| {
            sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {table} WHERE project_id = $1"
            ))
        };
        let sessions_removed: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(count("session"))
            .bind(project_id)
            .fetch_one(conn)
            .await)?;
        let experiences_removed: i64 =
            crate::on_tx!(tx, |conn| sqlx::query_scalar(count("experience_record"))
                .bind(project_id)
                .fetch_one(conn)
                .await)?;
        let jobs_removed = delete_unowned_rows_in(&self.ledger, &mut tx, project_id).await?;
        crate::db::execute_in(
            &mut tx,
            "DELETE FROM project WHERE id = $1",
            &[project_id.into()],
        )
        .await?;
        tx.commit().await?;
        Ok(ProjectDeletion {
            project_id: project_id.to_owned(),
            sessions_removed: u64::try_from(sessions_removed).unwrap_or(0),
            experiences_removed: u64::try_from(experiences_removed).unwrap_or(0),
            jobs_removed,
            candidates_withdrawn,
            worktree,
            documents,
        })
    }
}

/// Retracts derived entries of other documents (global Memory) whose only support is the
/// project's Experience, before that Experience cascades away; returns the documents changed.
async fn retract_global_support_in(
    tx: &mut crate::db::Tx,
    project_id: &str,
    now: i64,
) -> Result<Vec<String>, TranscriptError> {
    let supporting: Vec<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT DISTINCT p.experience_id FROM memory_provenance p \
           JOIN memory_entry m ON m.id = p.entry_id \
           JOIN memory_document d ON d.id = m.document_id \
           JOIN experience_record e ON e.id = p.experience_id \
         WHERE e.project_id = $1 AND d.project_id IS NULL ORDER BY 1"
    )
    .bind(project_id)
    .fetch_all(conn)
    .await)?;
    // All of them first: an entry two of the project's experiences support loses both.
    crate::db::execute_in(
        tx,
        "UPDATE experience_record SET status = 'forgotten', forgotten_at = $2, updated_at = $2 \
         WHERE project_id = $1 AND status = 'active'",
        &[project_id.into(), now.into()],
    )
    .await?;
    let mut documents: Vec<String> = Vec::new();
    for experience_id in &supporting {
        for document in
            crate::memory::service::retract_unsupported_in(tx, experience_id, now).await?
        {
            if !documents.contains(&document) {
                documents.push(document);
            }
        }
    }
    Ok(documents)
}

/// Deletes the project's rows in tables without a foreign key to it; returns how many learning
/// jobs went.
async fn delete_unowned_rows_in(
    ledger: &crate::ledger::Ledger,
    tx: &mut crate::db::Tx,
    project_id: &str,
) -> Result<u64, TranscriptError> {
    let jobs = ledger
        .prune_in(tx, JobScope::Project(project_id), "its project was deleted")
        .await
        .map_err(super::ledger_error)?;
    for sql in [
        "DELETE FROM prompt_receipt WHERE project_id = $1",
        "DELETE FROM learning_event WHERE project_id = $1",
    ] {
        crate::db::execute_in(tx, sql, &[project_id.into()]).await?;
    }
    crate::db::execute_in(
        tx,
        "DELETE FROM learning_aggregation WHERE scope_key = $1",
        &[(&format!("project:{project_id}")).into()],
    )
    .await?;
    Ok(jobs)
}
