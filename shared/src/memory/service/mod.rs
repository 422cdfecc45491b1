//! The managed memory service: every change to resident Memory is an audited `MemoryCandidate`
//! applied by compare-and-set on the document revision. Apply and undo commit the exact
//! before/after snapshots, the entries, the revision history and the candidate's state in one
//! transaction; the Markdown projection is published afterwards and its failure never loses a
//! committed entry.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use super::consolidate::Consolidation;
use super::store::{self, Candidate, DocumentView, Entry, Scope};
use super::write_check::WriteRefusal;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::db::{Db, StoreError};
use crate::managed_file::ManagedFileError;
use crate::memory::MemoryAction;
use crate::paths::Paths;

mod candidates;
mod reconcile;
mod revisions;
mod stale;
mod sync;

pub use super::store::retract_unsupported_in;

zuno_queue::text_enum! {
    /// Who proposed a change; decides the new entry's owner and which rules apply.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Origin {
        /// The model-visible `memory_update` tool.
        Tool = "tool",
        /// The no-tools maintenance stage, from verified evidence.
        Maintenance = "maintenance",
        /// A person, through the CLI, the page or an explicit command.
        User = "user",
    }
}

impl Origin {
    fn owner(self) -> &'static str {
        match self {
            Origin::User => "user",
            Origin::Tool | Origin::Maintenance => "automatic",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Proposal {
    pub scope: Scope,
    pub project_id: Option<String>,
    pub action: MemoryAction,
    pub content: Option<String>,
    pub old_text: Option<String>,
    pub expected_revision: Option<i64>,
    pub reason: String,
    pub confidence: f64,
    pub origin: Origin,
    /// Experiences supporting the change (never unresolved issues: the schema refuses them).
    pub evidence: Vec<String>,
    /// The evidence includes an explicit user statement (correction, preference, `remember`).
    pub explicit_user_evidence: bool,
    pub job_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Refused(#[from] WriteRefusal),
    #[error("{0}")]
    NotFound(String),
    #[error("stale revision: expected {expected}, current is {current}")]
    Stale { expected: i64, current: i64 },
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The project's worktree moved since its claim (see [`crate::worktree`]).
    #[error(transparent)]
    Worktree(#[from] crate::worktree::WorktreeMoved),
}

impl From<sqlx::Error> for MemoryError {
    fn from(error: sqlx::Error) -> Self {
        MemoryError::Store(StoreError::Database(error))
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionReport {
    pub path: Option<String>,
    /// `synced`, `external_edit`, `error` or `none` (no path: a project without a worktree).
    pub state: String,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub candidate: Candidate,
    pub applied: bool,
    pub revision: i64,
    pub projection: Option<ProjectionReport>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    pub scope: Scope,
    pub revision: i64,
    pub accepted: Vec<String>,
    pub path: Option<String>,
    /// Entries parsed from the file, when it exists and is readable.
    pub file: Option<Vec<String>>,
    pub projection_state: String,
    pub detail: Option<String>,
    /// True when the file's entries differ from the accepted ones.
    pub differs: bool,
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    pub applied: Vec<String>,
    pub not_applied: Vec<String>,
    pub uncertain: Vec<String>,
    pub restored_projections: Vec<String>,
    pub external_edits: Vec<String>,
}

/// A proposal staged in a transaction that has not committed yet.
#[derive(Debug, Clone)]
pub struct Staged {
    pub candidate: Candidate,
    pub applied: bool,
    pub revision: i64,
    pub document_id: String,
}

#[derive(Clone)]
pub struct MemoryService {
    db: Db,
    config: Arc<Config>,
    paths: Paths,
    clock: SharedClock,
}

fn json(entries: &[String]) -> String {
    serde_json::to_string(entries).unwrap_or_else(|_| String::from("[]"))
}

fn consolidation_json(consolidation: &Consolidation) -> String {
    serde_json::to_string(consolidation).unwrap_or_else(|_| String::from("{}"))
}

/// A planned change to a document's entries, ready to apply.
struct Write<'a> {
    after: &'a [String],
    origin: Origin,
    evidence: &'a [String],
    consolidation: Option<Consolidation>,
}

fn contents(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.content.clone()).collect()
}

impl MemoryService {
    pub fn new(db: Db, config: Arc<Config>, paths: Paths, clock: SharedClock) -> MemoryService {
        MemoryService {
            db,
            config,
            paths,
            clock,
        }
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The id of a project's Memory document when it holds at least one revision (a document
    /// never written has no file to move).
    pub async fn project_document_id(
        &self,
        project_id: &str,
    ) -> Result<Option<String>, StoreError> {
        store::written_project_document(&self.db, project_id).await
    }

    /// The projection path of a document: `$CONFIG/memory/MEMORY.md` or
    /// `<worktree>/.zuno/RULES.md` (none for a project without an absolute worktree). The
    /// worktree is resolved again on every call, and a worktree that moved since its claim is
    /// [`MemoryError::Worktree`]: every read and write of a projection starts here.
    pub async fn projection_path(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<Option<PathBuf>, MemoryError> {
        match scope {
            Scope::Global => Ok(Some(self.paths.global_memory())),
            Scope::Project => {
                let Some(project_id) = project_id else {
                    return Ok(None);
                };
                let worktree = store::project_worktree(&self.db, project_id).await?;
                let Some(worktree) = worktree
                    .flatten()
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
                else {
                    return Ok(None);
                };
                let roots = crate::worktree::roots(&self.config.server);
                let checked = tokio::task::spawn_blocking(move || {
                    crate::worktree::recheck(&worktree, &roots)
                })
                .await
                .map_err(|e| MemoryError::Conflict(format!("worktree check failed: {e}")))??;
                Ok(Some(Paths::project_rules(&checked)))
            }
        }
    }

    /// `memory_read`: current entries with revisions, optionally filtered, and how many
    /// unsupported derived entries were withheld.
    pub async fn read(
        &self,
        scope: Option<Scope>,
        project_id: Option<&str>,
        query: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Vec<DocumentView>, MemoryError> {
        let mut tx = self.db.begin_read().await?;
        let mut views = Vec::new();
        for candidate_scope in [Scope::Global, Scope::Project] {
            if scope.is_some_and(|s| s != candidate_scope)
                || (candidate_scope == Scope::Project && project_id.is_none())
            {
                continue;
            }
            let mut view = store::view_in(&mut tx, candidate_scope, project_id)
                .await?
                .unwrap_or(DocumentView {
                    scope: candidate_scope,
                    revision: 0,
                    entries: Vec::new(),
                    withheld: 0,
                });
            if let Some(query) = query
                .map(str::to_lowercase)
                .filter(|q| !q.trim().is_empty())
            {
                let words: Vec<&str> = query.split_whitespace().collect();
                view.entries.retain(|e| {
                    let text = e.content.to_lowercase();
                    words.iter().any(|w| text.contains(w))
                });
            }
            if let Some(limit) = limit {
                view.entries.truncate(limit);
            }
            views.push(view);
        }
        tx.rollback().await?;
        Ok(views)
    }
}

impl From<ManagedFileError> for MemoryError {
    fn from(error: ManagedFileError) -> MemoryError {
        MemoryError::Refused(WriteRefusal::Invalid {
            field: "projection",
            reason: error.to_string(),
        })
    }
}
