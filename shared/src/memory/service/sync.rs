//! File ↔ database: publishing a document to its Markdown projection, adopting a file that
//! predates the database, inspecting and importing a hand-edited file.

use std::path::Path;

use crate::managed_file::{self, CreateDir, ManagedFileError, Publish};
use crate::memory::markdown;
use crate::memory::store::{self, Candidate, Scope};
use crate::memory::write_check::{self, WriteRefusal};

use super::{Inspection, MemoryError, MemoryService, Outcome, ProjectionReport, contents, json};

impl MemoryService {
    /// Adopts existing projection files before a batch of proposals (see
    /// [`MemoryService::propose_in`]).
    pub async fn prepare(&self, scope: Scope, project_id: Option<&str>) -> Result<(), MemoryError> {
        self.adopt_existing_file(scope, project_id).await
    }

    /// Publishes a document's projection after a committed change.
    pub async fn publish(&self, document_id: &str) -> Result<ProjectionReport, MemoryError> {
        let mut tx = self.db.begin_read().await?;
        let document = self.document_by_id_in(&mut tx, document_id).await?;
        let expected = store::written_digest_in(&mut tx, document_id).await?;
        tx.rollback().await?;
        let path = match self
            .projection_path(document.scope, document.project_id.as_deref())
            .await
        {
            Ok(Some(path)) => path,
            Ok(None) => {
                return Ok(ProjectionReport {
                    path: None,
                    state: String::from("none"),
                    detail: Some(String::from("the project has no worktree")),
                });
            }
            Err(MemoryError::Worktree(moved)) => {
                return self.refuse_projection(document_id, &document, moved).await;
            }
            Err(error) => return Err(error),
        };
        let content = markdown::render(
            document.scope.as_str(),
            document.revision,
            &contents(&document.entries),
        );
        let create = match document.scope {
            Scope::Global => CreateDir::WithAncestors,
            Scope::Project => CreateDir::Immediate,
        };
        let target = path.clone();
        let published = tokio::task::spawn_blocking(move || {
            managed_file::publish_with(&target, &content, expected.as_deref(), create)
        })
        .await
        .map_err(|e| MemoryError::Conflict(format!("projection task failed: {e}")))?;
        let (state, digest, detail) = match published {
            Ok(Publish::Written { digest } | Publish::Unchanged { digest }) => {
                ("synced", Some(digest), None)
            }
            Ok(Publish::ExternalEdit { found_digest }) => (
                "external_edit",
                None,
                Some(format!(
                    "the file changed outside Zuno (sha256 {found_digest}); it was preserved — compare with inspect-memory, accept with import-memory"
                )),
            ),
            Err(error) => ("error", None, Some(error.to_string())),
        };
        self.record_projection(
            document_id,
            &path,
            state,
            digest.as_deref(),
            digest.as_ref().map(|_| document.revision),
            detail.as_deref(),
        )
        .await?;
        if state != "synced" {
            tracing::warn!(
                path = %path.display(),
                state,
                detail = detail.as_deref().unwrap_or(""),
                "memory projection not written"
            );
        }
        Ok(ProjectionReport {
            path: Some(path.display().to_string()),
            state: state.to_owned(),
            detail,
        })
    }

    /// A projection not written because the project's worktree moved since its claim: recorded
    /// as `error` under the path the claim named, so `inspect` and the next start-up see why.
    async fn refuse_projection(
        &self,
        document_id: &str,
        document: &store::Document,
        moved: crate::worktree::WorktreeMoved,
    ) -> Result<ProjectionReport, MemoryError> {
        let detail = moved.to_string();
        let stored = match document.project_id.as_deref() {
            Some(project_id) => store::project_worktree(&self.db, project_id)
                .await?
                .flatten()
                .map(|worktree| crate::paths::Paths::project_rules(Path::new(&worktree))),
            None => None,
        };
        if let Some(stored) = &stored {
            self.record_projection(document_id, stored, "error", None, None, Some(&detail))
                .await?;
        }
        Ok(ProjectionReport {
            path: stored.map(|path| path.display().to_string()),
            state: String::from("error"),
            detail: Some(detail),
        })
    }

    /// Records that the file at `path` holds `revision` of the document (`digest`), with the
    /// reason in `detail`.
    async fn record_synced(
        &self,
        document_id: &str,
        path: &std::path::Path,
        digest: &str,
        revision: i64,
        detail: &str,
    ) -> Result<(), MemoryError> {
        self.record_projection(
            document_id,
            path,
            "synced",
            Some(digest),
            Some(revision),
            Some(detail),
        )
        .await
    }

    /// Publishes the document's projection after a committed change to it, and reports what
    /// became of `candidate`.
    pub(super) async fn published(
        &self,
        document_id: &str,
        candidate: Candidate,
        applied: bool,
        revision: i64,
    ) -> Result<Outcome, MemoryError> {
        let projection = Some(self.publish(document_id).await?);
        Ok(Outcome {
            candidate,
            applied,
            revision,
            projection,
        })
    }

    pub(super) async fn record_projection(
        &self,
        document_id: &str,
        path: &std::path::Path,
        state: &str,
        digest: Option<&str>,
        revision: Option<i64>,
        detail: Option<&str>,
    ) -> Result<(), MemoryError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let path = path.display().to_string();
        let record = store::ProjectionRecord {
            path: &path,
            state,
            digest,
            revision,
            detail,
        };
        store::record_projection_in(&mut tx, document_id, &record, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Existing files are adopted once: before the first write, a file that exists and holds
    /// entries becomes the document's first revision (`adopt`), owned by the user.
    pub(super) async fn adopt_existing_file(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<(), MemoryError> {
        // A worktree that moved is not read from (the refusal is logged where it is checked);
        // the document's next publication records why nothing is written either.
        let path = match self.projection_path(scope, project_id).await {
            Ok(Some(path)) => path,
            Ok(None) | Err(MemoryError::Worktree(_)) => return Ok(()),
            Err(error) => return Err(error),
        };
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let document = store::document_in(&mut tx, scope, project_id, now).await?;
        if store::projection_known_in(&mut tx, &document.id).await? || document.revision > 0 {
            tx.commit().await?;
            return Ok(());
        }
        let target = path.clone();
        let file = tokio::task::spawn_blocking(move || read_projection(&target))
            .await
            .map_err(|e| MemoryError::Conflict(format!("projection task failed: {e}")))?
            .map_err(|error| WriteRefusal::Invalid {
                field: "projection",
                reason: format!("the memory file cannot be used: {error}"),
            })?;
        let Some(file) = file else {
            tx.commit().await?;
            return Ok(());
        };
        let revision = self
            .restore_in(&mut tx, &document, &file.entries, "adopt", None, now)
            .await?;
        store::set_owner_in(&mut tx, &document.id, revision, "imported").await?;
        tx.commit().await?;
        self.record_synced(
            &document.id,
            &path,
            &file.digest,
            revision,
            "adopted the existing file",
        )
        .await?;
        Ok(())
    }

    /// `inspect-memory`: the accepted version beside the file, and the projection's state.
    pub async fn inspect(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<Inspection, MemoryError> {
        let mut tx = self.db.begin_read().await?;
        let view = store::view_in(&mut tx, scope, project_id).await?;
        let state = match &view {
            Some(_) => store::projection_state_in(&mut tx, scope, project_id).await?,
            None => None,
        };
        let document_id = store::document_id_in(&mut tx, scope, project_id).await?;
        let accepted = match &document_id {
            Some(id) => contents(&store::entries_in(&mut tx, id).await?),
            None => Vec::new(),
        };
        tx.rollback().await?;
        let path = self.projection_path(scope, project_id).await?;
        let (file, mut detail) = match &path {
            Some(path) => {
                let target = path.clone();
                match tokio::task::spawn_blocking(move || read_projection(&target))
                    .await
                    .map_err(|e| MemoryError::Conflict(e.to_string()))?
                {
                    Ok(file) => (file.map(|f| f.entries), None),
                    Err(error) => (None, Some(error.to_string())),
                }
            }
            None => (None, Some(String::from("the project has no worktree"))),
        };
        let (projection_state, stored_detail) = state.unwrap_or((String::from("none"), None));
        if detail.is_none() {
            detail = stored_detail;
        }
        Ok(Inspection {
            scope,
            revision: view.map_or(0, |v| v.revision),
            differs: file.as_ref().is_some_and(|f| {
                f.iter().cloned().ne(accepted
                    .iter()
                    .map(|entry| markdown::projected_entry(entry)))
            }),
            accepted,
            path: path.map(|p| p.display().to_string()),
            file,
            projection_state,
            detail,
        })
    }

    /// `import-memory`: accepts the file's current entries as a new version (owned by the user).
    pub async fn import(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<Outcome, MemoryError> {
        let path = self
            .projection_path(scope, project_id)
            .await?
            .ok_or_else(|| MemoryError::NotFound(String::from("the project has no worktree")))?;
        let target = path.clone();
        let file = tokio::task::spawn_blocking(move || read_projection(&target))
            .await
            .map_err(|e| MemoryError::Conflict(e.to_string()))?
            .map_err(|error| WriteRefusal::Invalid {
                field: "projection",
                reason: error.to_string(),
            })?
            .ok_or_else(|| MemoryError::NotFound(format!("{} does not exist", path.display())))?;
        for entry in &file.entries {
            write_check::check_text("content", entry)?;
        }
        write_check::check_cap(scope, &file.entries, &self.config.memory)?;
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let document = store::document_in(&mut tx, scope, project_id, now).await?;
        let candidate_id = crate::ids::new_id("mcand");
        store::insert_import_candidate_in(
            &mut tx,
            &candidate_id,
            &document,
            project_id,
            &file.content,
            &json(&contents(&document.entries)),
            &json(&file.entries),
            now,
        )
        .await?;
        let revision = self
            .restore_in(
                &mut tx,
                &document,
                &file.entries,
                "import",
                Some(&candidate_id),
                now,
            )
            .await?;
        store::set_owner_in(&mut tx, &document.id, revision, "user").await?;
        store::mark_applied_in(&mut tx, &candidate_id, revision).await?;
        let candidate = store::candidate_in(&mut tx, &candidate_id)
            .await?
            .expect("inserted");
        tx.commit().await?;
        // The file now is the accepted version: record its digest so the next write proceeds.
        self.record_synced(&document.id, &path, &file.digest, revision, "imported")
            .await?;
        self.published(&document.id, candidate, true, revision)
            .await
    }
}

/// A Memory projection as found on disk, with its entries read back from the Markdown.
struct ProjectionFile {
    content: String,
    digest: String,
    entries: Vec<String>,
}

fn read_projection(path: &Path) -> Result<Option<ProjectionFile>, ManagedFileError> {
    Ok(managed_file::read(path)?.map(|file| ProjectionFile {
        entries: markdown::parse(&file.content),
        content: file.content,
        digest: file.digest,
    }))
}
