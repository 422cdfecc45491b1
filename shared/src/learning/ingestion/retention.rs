//! Session deletion (transcript retention). Session-owned feedback and learning jobs go with the
//! transcript; project learning (Experience, Memory) survives with its session provenance
//! detached, unless the caller explicitly chooses derived-learning cleanup. Deleting the source
//! messages marks surviving derived Experience `changed`, which withholds it from recall.

use serde::Serialize;

use super::{LearningIngestion, store};
use crate::learning::experience::store as experience;
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
        if !store::session_exists_in(&mut tx, session_id).await? {
            return Err(TranscriptError::NotFound {
                what: "session",
                id: session_id.to_owned(),
            });
        }
        // Derived Experience: produced by the session's jobs or citing its messages.
        let derived = experience::derived_from_session_in(&mut tx, session_id).await?;
        let mut documents: Vec<String> = Vec::new();
        let mut removed = Vec::new();
        if cleanup_derived {
            for experience_id in &derived {
                // Retract resident entries that lose their last support before the provenance
                // rows cascade away with the Experience.
                experience::set_forgotten_in(&mut tx, experience_id, now).await?;
                for document in
                    crate::memory::service::retract_unsupported_in(&mut tx, experience_id, now)
                        .await?
                {
                    if !documents.contains(&document) {
                        documents.push(document);
                    }
                }
                experience::delete_in(&mut tx, experience_id).await?;
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
        store::delete_session_in(&mut tx, session_id).await?;
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
        let Some(worktree) = store::project_worktree_in(&mut tx, project_id).await? else {
            return Err(TranscriptError::NotFound {
                what: "project",
                id: project_id.to_owned(),
            });
        };
        let documents = retract_global_support_in(&mut tx, project_id, now).await?;
        let candidates_withdrawn = store::withdraw_candidates_in(&mut tx, project_id, now).await?;
        let sessions_removed = store::session_count_in(&mut tx, project_id).await?;
        let experiences_removed = experience::count_of_project_in(&mut tx, project_id).await?;
        let jobs_removed = delete_unowned_rows_in(&self.ledger, &mut tx, project_id).await?;
        store::delete_project_in(&mut tx, project_id).await?;
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
    let supporting = experience::supporting_global_memory_in(tx, project_id).await?;
    // All of them first: an entry two of the project's experiences support loses both.
    experience::forget_project_in(tx, project_id, now).await?;
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
    store::delete_unowned_rows_in(tx, project_id).await?;
    Ok(jobs)
}
