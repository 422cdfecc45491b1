//! The managed memory service: every change to resident Memory is an audited `MemoryCandidate`
//! applied by compare-and-set on the document revision. Apply and undo commit the exact
//! before/after snapshots, the entries, the revision history and the candidate's state in one
//! transaction; the Markdown projection is published afterwards and its failure never loses a
//! committed entry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use super::consolidate::{self, Consolidation, Standing};
use super::projection::{self, CreateDir, ProjectionError, Publish};
use super::store::{self, Candidate, Document, DocumentView, Entry, MemoryCandidateState, Scope};
use super::validate::{self, WriteRefusal};
use crate::clock::SharedClock;
use crate::config::{Config, MemoryPromotion};
use crate::db::{Db, StoreError, Tx};
use crate::learning::extraction::MemoryAction;
use crate::learning::manifest::sha256;
use crate::paths::Paths;

/// Who proposed a change; decides the new entry's owner and which rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The model-visible `memory_update` tool.
    Tool,
    /// The no-tools maintenance stage, from verified evidence.
    Maintenance,
    /// A person, through the CLI, the page or an explicit command.
    User,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Tool => "tool",
            Origin::Maintenance => "maintenance",
            Origin::User => "user",
        }
    }

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

    /// The projection path of a document: `$CONFIG/memory/MEMORY.md` or
    /// `<worktree>/.zuno/RULES.md` (none for a project without an absolute worktree).
    pub async fn projection_path(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<Option<PathBuf>, StoreError> {
        match scope {
            Scope::Global => Ok(Some(self.paths.global_memory())),
            Scope::Project => {
                let Some(project_id) = project_id else {
                    return Ok(None);
                };
                let worktree: Option<Option<String>> =
                    crate::on_db!(self.db, |pool| sqlx::query_scalar(
                        "SELECT worktree FROM project WHERE id = $1"
                    )
                    .bind(project_id)
                    .fetch_optional(pool)
                    .await)?;
                Ok(worktree
                    .flatten()
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
                    .map(|w| Paths::project_rules(&w)))
            }
        }
    }

    /// Proposes a change. It is validated, journaled as a candidate, and applied at once when the
    /// promotion policy allows; otherwise it waits for review.
    pub async fn propose(&self, proposal: Proposal) -> Result<Outcome, MemoryError> {
        self.adopt_existing_file(proposal.scope, proposal.project_id.as_deref())
            .await?;
        let mut tx = self.db.begin().await?;
        let staged = self.propose_in(&mut tx, &proposal).await?;
        tx.commit().await?;
        let projection = if staged.applied {
            Some(self.publish(&staged.document_id).await?)
        } else {
            None
        };
        Ok(Outcome {
            candidate: staged.candidate,
            applied: staged.applied,
            revision: staged.revision,
            projection,
        })
    }

    /// Adopts existing projection files before a batch of proposals (see
    /// [`MemoryService::propose_in`]).
    pub async fn prepare(&self, scope: Scope, project_id: Option<&str>) -> Result<(), MemoryError> {
        self.adopt_existing_file(scope, project_id).await
    }

    /// [`MemoryService::propose`] inside the caller's transaction, without publishing: the
    /// maintenance stage commits a whole plan, its journal and its watermark in its fenced
    /// settlement, then publishes the touched documents.
    pub async fn propose_in(
        &self,
        tx: &mut Tx,
        proposal: &Proposal,
    ) -> Result<Staged, MemoryError> {
        for (field, text) in [
            ("content", proposal.content.as_deref()),
            ("old_text", proposal.old_text.as_deref()),
            ("reason", Some(proposal.reason.as_str())),
        ] {
            if let Some(text) = text {
                validate::check_text(field, text)?;
            }
        }
        if !(0.0..=1.0).contains(&proposal.confidence) || !proposal.confidence.is_finite() {
            return Err(WriteRefusal::Invalid {
                field: "confidence",
                reason: String::from("must be a probability in [0, 1]"),
            }
            .into());
        }
        if proposal.scope == Scope::Project && proposal.project_id.is_none() {
            return Err(WriteRefusal::Invalid {
                field: "project",
                reason: String::from("project memory needs a project"),
            }
            .into());
        }
        let now = self.now();
        let document =
            store::document_in(tx, proposal.scope, proposal.project_id.as_deref(), now).await?;
        if let Some(expected) = proposal.expected_revision
            && expected != document.revision
        {
            return Err(MemoryError::Stale {
                expected,
                current: document.revision,
            });
        }
        let after = validate::plan(
            &document.entries,
            proposal.action,
            proposal.content.as_deref(),
            proposal.old_text.as_deref(),
            proposal.expected_revision.is_some(),
        )?;
        if proposal.origin != Origin::User {
            self.protect_in(tx, &document, proposal, &after).await?;
        }
        let (after, consolidation) = self
            .fit_in(tx, &document, after, proposal.origin, &proposal.evidence)
            .await?;
        let candidate_id = crate::ids::new_id("mcand");
        let before = contents(&document.entries);
        let sql = "INSERT INTO memory_candidate (id, document_id, project_id, target, action, content, old_text, reason, confidence, \
                     origin, state, base_revision, before_entries, after_entries, job_id, created_at, updated_at, consolidation) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14, $15, $15, $16)";
        crate::on_tx!(tx, |conn| sqlx::query(sql)
            .bind(&candidate_id)
            .bind(&document.id)
            .bind(&proposal.project_id)
            .bind(proposal.scope.as_str())
            .bind(proposal.action.as_str())
            .bind(&proposal.content)
            .bind(&proposal.old_text)
            .bind(&proposal.reason)
            .bind(proposal.confidence)
            .bind(proposal.origin.as_str())
            .bind(document.revision)
            .bind(json(&before))
            .bind(json(&after))
            .bind(&proposal.job_id)
            .bind(now)
            .bind(consolidation.as_ref().map(consolidation_json))
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
        for experience_id in &proposal.evidence {
            crate::on_tx!(tx, |conn| {
                sqlx::query(
                    "INSERT INTO memory_candidate_evidence (candidate_id, experience_id, experience_kind) \
                     SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING")
                .bind(&candidate_id).bind(experience_id).execute(conn).await.map(|done| done.rows_affected())
            })?;
        }
        let applied = self.promotes(proposal);
        let mut revision = document.revision;
        if applied {
            revision = self
                .apply_in(
                    tx,
                    &candidate_id,
                    &document,
                    Write {
                        after: &after,
                        origin: proposal.origin,
                        evidence: &proposal.evidence,
                        consolidation,
                    },
                    now,
                )
                .await?;
        }
        let candidate = store::candidate_in(tx, &candidate_id)
            .await?
            .expect("inserted above");
        Ok(Staged {
            candidate,
            applied,
            revision,
            document_id: document.id,
        })
    }

    /// `memory.promotion`: automatic applies what passed validation; high_confidence applies at
    /// or above `memory.auto_confidence`; review applies nothing. Learning is narrower: global
    /// automatic memory needs explicit user evidence, and maintenance never applies without
    /// evidence (model confidence alone never authorises Memory).
    fn promotes(&self, proposal: &Proposal) -> bool {
        if proposal.origin == Origin::User {
            return true;
        }
        if proposal.origin == Origin::Maintenance {
            if proposal.evidence.is_empty() {
                return false;
            }
            if proposal.scope == Scope::Global && !proposal.explicit_user_evidence {
                return false;
            }
        }
        match self.config.memory.promotion {
            MemoryPromotion::Automatic => true,
            MemoryPromotion::HighConfidence => {
                proposal.confidence >= self.config.memory.auto_confidence
            }
            MemoryPromotion::Review => false,
        }
    }

    /// Automatic writers cannot rewrite user-owned entries or resurrect forgotten text.
    async fn protect_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        proposal: &Proposal,
        after: &[String],
    ) -> Result<(), MemoryError> {
        if matches!(
            proposal.action,
            MemoryAction::Replace | MemoryAction::Remove
        ) && let Some(old_text) = &proposal.old_text
            && let Ok(target) = validate::locate(
                &document.entries,
                old_text,
                proposal.expected_revision.is_some(),
            )
            && matches!(target.owner.as_str(), "user" | "imported")
        {
            return Err(WriteRefusal::UserOwned.into());
        }
        let before = contents(&document.entries);
        for added in after.iter().filter(|e| !before.contains(e)) {
            let forgotten: Option<i64> = crate::on_tx!(tx, |conn| {
                sqlx::query_scalar(
                    "SELECT CAST(1 AS BIGINT) FROM memory_forgotten_text WHERE document_id = $1 AND content_digest = $2")
                .bind(&document.id).bind(sha256(added)).fetch_optional(conn).await
            })?;
            if forgotten.is_some() {
                return Err(WriteRefusal::Forgotten.into());
            }
            if let Some(earlier) = store::dropped_evidence_in(tx, &document.id, added).await?
                && proposal.evidence.iter().all(|id| earlier.contains(id))
            {
                return Err(WriteRefusal::DroppedAtCap.into());
            }
        }
        Ok(())
    }

    /// The write's result within the document's cap: as planned when it fits, else consolidated
    /// (same-rule entries merged, the lowest-value derived entries dropped; see
    /// [`consolidate`]). Refused, naming the key that raises the cap, when even that does not
    /// fit.
    async fn fit_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        after: Vec<String>,
        origin: Origin,
        evidence: &[String],
    ) -> Result<(Vec<String>, Option<Consolidation>), MemoryError> {
        let (limit, key) = validate::cap(document.scope, &self.config.memory);
        if validate::document_chars(&after) <= limit {
            return Ok((after, None));
        }
        let values = store::entry_values_in(tx, &document.id).await?;
        let new_text = match origin {
            Origin::User => Standing::Protected,
            Origin::Maintenance if !evidence.is_empty() => Standing::Derived,
            Origin::Maintenance | Origin::Tool => Standing::Asserted,
        };
        match consolidate::fit(
            &after,
            &document.entries,
            &values,
            new_text,
            evidence,
            limit,
        ) {
            Ok(fitted) => Ok((fitted.after, Some(fitted.consolidation))),
            Err(chars) => Err(WriteRefusal::OverCap { chars, limit, key }.into()),
        }
    }

    /// Commits `write.after` as the document's next revision (compare-and-set on the revision
    /// the candidate was planned against) with its consolidation and the candidate's state, in
    /// the caller's transaction.
    async fn apply_in(
        &self,
        tx: &mut Tx,
        candidate_id: &str,
        document: &Document,
        write: Write<'_>,
        now: i64,
    ) -> Result<i64, MemoryError> {
        let Write {
            after,
            origin,
            evidence,
            consolidation,
        } = write;
        let before = contents(&document.entries);
        if before == after {
            // Adding an existing entry, or a rule an entry already states, preserves the
            // document revision.
            let (detail, consolidation) = match consolidation {
                Some(consolidation) => (
                    "no change: an entry already states this rule; the evidence now supports it",
                    Some(
                        settle_consolidation_in(
                            tx,
                            &document.id,
                            consolidation,
                            &HashMap::new(),
                            evidence,
                            document.revision,
                            now,
                        )
                        .await?,
                    ),
                ),
                None => ("no change: the entry already exists", None),
            };
            crate::on_tx!(tx, |conn| {
                sqlx::query(
                    "UPDATE memory_candidate SET state = 'applied', applied_revision = $2, detail = $3, consolidation = $4, updated_at = $5 WHERE id = $1")
                .bind(candidate_id).bind(document.revision).bind(detail).bind(consolidation.as_ref().map(consolidation_json)).bind(now)
                .execute(conn).await.map(|done| done.rows_affected())
            })?;
            return Ok(document.revision);
        }
        let revision = self.advance_in(tx, document, now).await?;
        let mut remaining: Vec<&Entry> = document.entries.iter().collect();
        let mut created = HashMap::new();
        // Positions only order the entries: a kept entry keeps its position while the order
        // allows, so removing entries (a consolidation drops several) rewrites no other row.
        let mut previous: Option<i64> = None;
        for content in after {
            let next = previous.map_or(0, |p| p + 1);
            if let Some(index) = remaining.iter().position(|e| &e.content == content) {
                let entry = remaining.remove(index);
                let position = entry.position.max(next);
                if position != entry.position {
                    crate::on_tx!(tx, |conn| sqlx::query(
                        "UPDATE memory_entry SET position = $2 WHERE id = $1"
                    )
                    .bind(&entry.id)
                    .bind(position)
                    .execute(conn)
                    .await
                    .map(|done| done.rows_affected()))?;
                }
                previous = Some(position);
            } else {
                let position = next;
                previous = Some(position);
                let id = crate::ids::new_id("ment");
                crate::on_tx!(tx, |conn| {
                    sqlx::query(
                        "INSERT INTO memory_entry (id, document_id, content, owner, derived, position, created_revision, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                    .bind(&id).bind(&document.id).bind(content).bind(origin.owner())
                    .bind(origin == Origin::Maintenance && !evidence.is_empty())
                    .bind(position).bind(revision).bind(now)
                    .execute(conn).await.map(|done| done.rows_affected())
                })?;
                support_in(tx, &id, evidence).await?;
                created.insert(content.clone(), id);
            }
        }
        for entry in remaining {
            crate::on_tx!(tx, |conn| sqlx::query(
                "UPDATE memory_entry SET retracted_revision = $2 WHERE id = $1"
            )
            .bind(&entry.id)
            .bind(revision)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
        }
        let consolidation = match consolidation {
            Some(consolidation) => Some(
                settle_consolidation_in(
                    tx,
                    &document.id,
                    consolidation,
                    &created,
                    evidence,
                    revision,
                    now,
                )
                .await?,
            ),
            None => None,
        };
        let consolidation = consolidation.as_ref().map(consolidation_json);
        self.revision_row_in(
            tx,
            &document.id,
            revision,
            after,
            "apply",
            consolidation.as_deref(),
            Some(candidate_id),
            now,
        )
        .await?;
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE memory_candidate SET state = 'applied', applied_revision = $2, consolidation = $3, updated_at = $4 WHERE id = $1")
            .bind(candidate_id).bind(revision).bind(&consolidation).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        Ok(revision)
    }

    /// `UPDATE … WHERE revision = <read revision>`: two writers cannot both replace one revision.
    async fn advance_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        now: i64,
    ) -> Result<i64, MemoryError> {
        let advanced = crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE memory_document SET revision = revision + 1, updated_at = $3 WHERE id = $1 AND revision = $2")
            .bind(&document.id).bind(document.revision).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        if advanced != 1 {
            let current: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(
                "SELECT revision FROM memory_document WHERE id = $1"
            )
            .bind(&document.id)
            .fetch_one(conn)
            .await)?;
            return Err(MemoryError::Stale {
                expected: document.revision,
                current,
            });
        }
        Ok(document.revision + 1)
    }

    #[allow(clippy::too_many_arguments)]
    async fn revision_row_in(
        &self,
        tx: &mut Tx,
        document_id: &str,
        revision: i64,
        entries: &[String],
        change: &str,
        consolidation: Option<&str>,
        candidate_id: Option<&str>,
        now: i64,
    ) -> Result<(), MemoryError> {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_revision (document_id, revision, entries, change, candidate_id, at, consolidation) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(document_id).bind(revision).bind(json(entries)).bind(change).bind(candidate_id).bind(now).bind(consolidation)
            .execute(conn).await.map(|done| done.rows_affected())
        })?;
        Ok(())
    }

    async fn document_by_id_in(
        &self,
        tx: &mut Tx,
        document_id: &str,
    ) -> Result<Document, MemoryError> {
        let row: Option<(String, Option<String>, i64)> = crate::on_tx!(tx, |conn| sqlx::query_as(
            "SELECT scope, project_id, revision FROM memory_document WHERE id = $1"
        )
        .bind(document_id)
        .fetch_optional(conn)
        .await)?;
        let (scope, project_id, revision) = row.ok_or_else(|| {
            MemoryError::NotFound(format!("memory document `{document_id}` was not found"))
        })?;
        let entries = store::entries_in(tx, document_id).await?;
        Ok(Document {
            id: document_id.to_owned(),
            scope: Scope::parse(&scope)
                .ok_or_else(|| StoreError::Corrupt(format!("memory scope `{scope}`")))?,
            project_id,
            revision,
            entries,
        })
    }

    async fn pending_candidate_in(&self, tx: &mut Tx, id: &str) -> Result<Candidate, MemoryError> {
        let candidate = store::candidate_in(tx, id).await?.ok_or_else(|| {
            MemoryError::NotFound(format!("memory candidate `{id}` was not found"))
        })?;
        if candidate.state != MemoryCandidateState::Pending {
            return Err(MemoryError::Conflict(format!(
                "memory candidate `{id}` is `{}`, not pending",
                candidate.state
            )));
        }
        Ok(candidate)
    }

    /// Reinforces the current entry of `scope` that states the same rule as `content`
    /// ([`super::dedupe::same_rule`]): `evidence` joins its support, and the document's text and
    /// revision stay as they are (adding an existing rule is not a change). Returns the entry, or
    /// `None` when no entry states that rule.
    pub async fn reinforce_in(
        &self,
        tx: &mut Tx,
        scope: Scope,
        project_id: Option<&str>,
        content: &str,
        evidence: &[String],
    ) -> Result<Option<store::Entry>, MemoryError> {
        let Some(view) = store::view_in(tx, scope, project_id).await? else {
            return Ok(None);
        };
        let rule = super::dedupe::RuleSignature::of(content);
        let Some(entry) = view
            .entries
            .into_iter()
            .find(|entry| super::dedupe::RuleSignature::of(&entry.content).same_rule_as(&rule))
        else {
            return Ok(None);
        };
        support_in(tx, &entry.id, evidence).await?;
        Ok(Some(entry))
    }

    /// Approves a pending candidate (optionally with edited content). A document that moved past
    /// the reviewed revision marks the candidate `stale` instead: drift is never applied.
    pub async fn approve(
        &self,
        id: &str,
        edited_content: Option<String>,
    ) -> Result<Outcome, MemoryError> {
        if let Some(content) = &edited_content {
            validate::check_text("content", content)?;
        }
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = self.pending_candidate_in(&mut tx, id).await?;
        let document = self
            .document_by_id_in(&mut tx, &candidate.document_id)
            .await?;
        if document.revision != candidate.base_revision {
            crate::on_tx!(&mut tx, |conn| {
                sqlx::query("UPDATE memory_candidate SET state = 'stale', detail = $2, updated_at = $3 WHERE id = $1")
                .bind(id).bind(format!("memory moved from revision {} to {} after this candidate was proposed", candidate.base_revision, document.revision))
                .bind(now).execute(conn).await.map(|done| done.rows_affected())
            })?;
            tx.commit().await?;
            return Err(MemoryError::Conflict(format!(
                "memory changed since this candidate was reviewed (revision {} → {}); it is now stale",
                candidate.base_revision, document.revision
            )));
        }
        let action = match candidate.action.as_str() {
            "add" => MemoryAction::Add,
            "replace" => MemoryAction::Replace,
            _ => MemoryAction::Remove,
        };
        let content = edited_content.clone().or(candidate.content.clone());
        let after = validate::plan(
            &document.entries,
            action,
            content.as_deref(),
            candidate.old_text.as_deref(),
            true,
        )?;
        let evidence: Vec<String> = crate::on_tx!(&mut tx, |conn| sqlx::query_scalar(
            "SELECT experience_id FROM memory_candidate_evidence WHERE candidate_id = $1"
        )
        .bind(id)
        .fetch_all(conn)
        .await)?;
        let origin = if candidate.origin == "maintenance" {
            Origin::Maintenance
        } else {
            Origin::User
        };
        let (after, consolidation) = self
            .fit_in(&mut tx, &document, after, origin, &evidence)
            .await?;
        if edited_content.is_some() {
            crate::on_tx!(&mut tx, |conn| {
                sqlx::query("UPDATE memory_candidate SET content = $2, detail = 'edited on approval' WHERE id = $1")
                .bind(id).bind(&content).execute(conn).await.map(|done| done.rows_affected())
            })?;
        }
        crate::on_tx!(&mut tx, |conn| sqlx::query(
            "UPDATE memory_candidate SET after_entries = $2 WHERE id = $1"
        )
        .bind(id)
        .bind(json(&after))
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
        let revision = self
            .apply_in(
                &mut tx,
                id,
                &document,
                Write {
                    after: &after,
                    origin,
                    evidence: &evidence,
                    consolidation,
                },
                now,
            )
            .await?;
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        let projection = Some(self.publish(&document.id).await?);
        Ok(Outcome {
            candidate,
            applied: true,
            revision,
            projection,
        })
    }

    /// Rejects a pending candidate; its proposed text is not proposed again automatically.
    pub async fn reject(&self, id: &str) -> Result<Candidate, MemoryError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = self.pending_candidate_in(&mut tx, id).await?;
        crate::on_tx!(&mut tx, |conn| sqlx::query(
            "UPDATE memory_candidate SET state = 'rejected', updated_at = $2 WHERE id = $1"
        )
        .bind(id)
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
        if let Some(content) = &candidate.content {
            self.remember_forgotten_in(&mut tx, &candidate.document_id, content, "rejected", now)
                .await?;
        }
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(candidate)
    }

    async fn remember_forgotten_in(
        &self,
        tx: &mut Tx,
        document_id: &str,
        content: &str,
        reason: &str,
        now: i64,
    ) -> Result<(), MemoryError> {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_forgotten_text (document_id, content_digest, reason, at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
            .bind(document_id).bind(sha256(content)).bind(reason).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        Ok(())
    }

    /// Undoes an applied candidate: the document returns to the candidate's exact `before`
    /// snapshot as a new revision (only when nothing changed since; later changes are never
    /// silently discarded). Undone text is not resurrected automatically.
    pub async fn undo(&self, id: &str) -> Result<Outcome, MemoryError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = store::candidate_in(&mut tx, id).await?.ok_or_else(|| {
            MemoryError::NotFound(format!("memory candidate `{id}` was not found"))
        })?;
        if candidate.state != MemoryCandidateState::Applied {
            return Err(MemoryError::Conflict(format!(
                "memory candidate `{id}` is `{}`; only applied candidates can be undone",
                candidate.state
            )));
        }
        let document = self
            .document_by_id_in(&mut tx, &candidate.document_id)
            .await?;
        let after: Vec<String> =
            serde_json::from_str(candidate.after_entries.as_deref().unwrap_or("[]"))
                .unwrap_or_default();
        let before: Vec<String> =
            serde_json::from_str(candidate.before_entries.as_deref().unwrap_or("[]"))
                .unwrap_or_default();
        if contents(&document.entries) != after {
            return Err(MemoryError::Conflict(format!(
                "memory changed after candidate `{id}` was applied; undoing it would discard later changes"
            )));
        }
        let revision = self
            .restore_in(&mut tx, &document, &before, "undo", Some(id), now)
            .await?;
        for removed in after.iter().filter(|e| !before.contains(e)) {
            self.remember_forgotten_in(&mut tx, &document.id, removed, "undone", now)
                .await?;
        }
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query("UPDATE memory_candidate SET state = 'undone', undone_revision = $2, updated_at = $3 WHERE id = $1")
            .bind(id).bind(revision).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        let projection = Some(self.publish(&document.id).await?);
        Ok(Outcome {
            candidate,
            applied: false,
            revision,
            projection,
        })
    }

    /// Sets the document's entries to `target` (keeping entries that survive, retracting the rest,
    /// re-adding from history with their original owners where possible) as a new revision.
    async fn restore_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        target: &[String],
        change: &str,
        candidate_id: Option<&str>,
        now: i64,
    ) -> Result<i64, MemoryError> {
        let revision = self.advance_in(tx, document, now).await?;
        let mut remaining: Vec<&Entry> = document.entries.iter().collect();
        for (position, content) in target.iter().enumerate() {
            if let Some(index) = remaining.iter().position(|e| &e.content == content) {
                let entry = remaining.remove(index);
                crate::on_tx!(tx, |conn| sqlx::query(
                    "UPDATE memory_entry SET position = $2 WHERE id = $1"
                )
                .bind(&entry.id)
                .bind(position as i64)
                .execute(conn)
                .await
                .map(|done| done.rows_affected()))?;
            } else {
                let previous: Option<(String, String, bool)> = crate::on_tx!(tx, |conn| {
                    sqlx::query_as(
                        "SELECT id, owner, derived FROM memory_entry WHERE document_id = $1 AND content = $2 ORDER BY created_revision DESC LIMIT 1")
                    .bind(&document.id).bind(content).fetch_optional(conn).await
                })?;
                // An undo brings a derived entry back as derived, with its evidence, so it is
                // withheld and consolidated like any derived entry (an undone consolidation
                // restores the entries it dropped).
                let restored_from = previous
                    .as_ref()
                    .filter(|(_, _, derived)| change == "undo" && *derived)
                    .map(|(id, _, _)| id.clone());
                let owner =
                    previous.map_or_else(|| String::from("imported"), |(_, owner, _)| owner);
                let id = crate::ids::new_id("ment");
                crate::on_tx!(tx, |conn| {
                    sqlx::query(
                        "INSERT INTO memory_entry (id, document_id, content, owner, derived, position, created_revision, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                    .bind(&id).bind(&document.id).bind(content)
                    .bind(owner).bind(restored_from.is_some()).bind(position as i64).bind(revision).bind(now)
                    .execute(conn).await.map(|done| done.rows_affected())
                })?;
                if let Some(from) = restored_from {
                    crate::on_tx!(tx, |conn| {
                        sqlx::query(
                            "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) \
                             SELECT $2, experience_id, experience_kind FROM memory_provenance WHERE entry_id = $1 \
                             ON CONFLICT DO NOTHING")
                        .bind(&from).bind(&id).execute(conn).await.map(|done| done.rows_affected())
                    })?;
                }
            }
        }
        for entry in remaining {
            crate::on_tx!(tx, |conn| sqlx::query(
                "UPDATE memory_entry SET retracted_revision = $2 WHERE id = $1"
            )
            .bind(&entry.id)
            .bind(revision)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
        }
        self.revision_row_in(
            tx,
            &document.id,
            revision,
            target,
            change,
            None,
            candidate_id,
            now,
        )
        .await?;
        Ok(revision)
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

    /// Publishes a document's projection after a committed change.
    pub async fn publish(&self, document_id: &str) -> Result<ProjectionReport, MemoryError> {
        let mut tx = self.db.begin_read().await?;
        let document = self.document_by_id_in(&mut tx, document_id).await?;
        let written: Option<Option<String>> = crate::on_tx!(&mut tx, |conn| sqlx::query_scalar(
            "SELECT written_digest FROM memory_projection WHERE document_id = $1"
        )
        .bind(document_id)
        .fetch_optional(conn)
        .await)?;
        tx.rollback().await?;
        let Some(path) = self
            .projection_path(document.scope, document.project_id.as_deref())
            .await?
        else {
            return Ok(ProjectionReport {
                path: None,
                state: String::from("none"),
                detail: Some(String::from("the project has no worktree")),
            });
        };
        let content = projection::render(
            document.scope.as_str(),
            document.revision,
            &contents(&document.entries),
        );
        let create = match document.scope {
            Scope::Global => CreateDir::WithAncestors,
            Scope::Project => CreateDir::Immediate,
        };
        let expected = written.flatten();
        let target = path.clone();
        let published = tokio::task::spawn_blocking(move || {
            projection::publish_with(&target, &content, expected.as_deref(), create)
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
            tracing::warn!(path = %path.display(), state, detail = detail.as_deref().unwrap_or(""), "memory projection not written");
        }
        Ok(ProjectionReport {
            path: Some(path.display().to_string()),
            state: state.to_owned(),
            detail,
        })
    }

    async fn record_projection(
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
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_projection (document_id, path, written_digest, written_revision, state, detail, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (document_id) DO UPDATE SET path = excluded.path, \
                   written_digest = COALESCE(excluded.written_digest, memory_projection.written_digest), \
                   written_revision = COALESCE(excluded.written_revision, memory_projection.written_revision), \
                   state = excluded.state, detail = excluded.detail, updated_at = excluded.updated_at")
            .bind(document_id).bind(path.display().to_string()).bind(digest).bind(revision).bind(state).bind(detail).bind(now)
            .execute(conn).await.map(|done| done.rows_affected())
        })?;
        tx.commit().await?;
        Ok(())
    }

    /// Existing files are adopted once: before the first write, a file that exists and holds
    /// entries becomes the document's first revision (`adopt`), owned by the user.
    async fn adopt_existing_file(
        &self,
        scope: Scope,
        project_id: Option<&str>,
    ) -> Result<(), MemoryError> {
        let Some(path) = self.projection_path(scope, project_id).await? else {
            return Ok(());
        };
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let document = store::document_in(&mut tx, scope, project_id, now).await?;
        let known: Option<i64> = crate::on_tx!(&mut tx, |conn| sqlx::query_scalar(
            "SELECT CAST(1 AS BIGINT) FROM memory_projection WHERE document_id = $1"
        )
        .bind(&document.id)
        .fetch_optional(conn)
        .await)?;
        if known.is_some() || document.revision > 0 {
            tx.commit().await?;
            return Ok(());
        }
        let target = path.clone();
        let file = tokio::task::spawn_blocking(move || projection::read(&target))
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
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query("UPDATE memory_entry SET owner = 'imported' WHERE document_id = $1 AND created_revision = $2")
            .bind(&document.id).bind(revision).execute(conn).await.map(|done| done.rows_affected())
        })?;
        tx.commit().await?;
        self.record_projection(
            &document.id,
            &path,
            "synced",
            Some(&file.digest),
            Some(revision),
            Some("adopted the existing file"),
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
        let state: Option<(String, Option<String>)> = match &view {
            Some(_) => crate::on_tx!(&mut tx, |conn| {
                sqlx::query_as(
                    "SELECT p.state, p.detail FROM memory_projection p JOIN memory_document d ON d.id = p.document_id \
                     WHERE d.scope = $1 AND COALESCE(d.project_id, '') = COALESCE($2, '')")
                .bind(scope.as_str()).bind(if scope == Scope::Project { project_id } else { None }).fetch_optional(conn).await
            })?,
            None => None,
        };
        let document_id: Option<String> = crate::on_tx!(&mut tx, |conn| {
            sqlx::query_scalar(
                "SELECT id FROM memory_document WHERE scope = $1 AND COALESCE(project_id, '') = COALESCE($2, '')")
            .bind(scope.as_str()).bind(if scope == Scope::Project { project_id } else { None }).fetch_optional(conn).await
        })?;
        let accepted = match &document_id {
            Some(id) => contents(&store::entries_in(&mut tx, id).await?),
            None => Vec::new(),
        };
        tx.rollback().await?;
        let path = self.projection_path(scope, project_id).await?;
        let (file, mut detail) = match &path {
            Some(path) => {
                let target = path.clone();
                match tokio::task::spawn_blocking(move || projection::read(&target))
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
                    .map(|entry| projection::visible_entry(entry)))
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
        let file = tokio::task::spawn_blocking(move || projection::read(&target))
            .await
            .map_err(|e| MemoryError::Conflict(e.to_string()))?
            .map_err(|error| WriteRefusal::Invalid {
                field: "projection",
                reason: error.to_string(),
            })?
            .ok_or_else(|| MemoryError::NotFound(format!("{} does not exist", path.display())))?;
        for entry in &file.entries {
            validate::check_text("content", entry)?;
        }
        validate::check_cap(scope, &file.entries, &self.config.memory)?;
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let document = store::document_in(&mut tx, scope, project_id, now).await?;
        let candidate_id = crate::ids::new_id("mcand");
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_candidate (id, document_id, project_id, target, action, content, reason, confidence, origin, state, \
                   base_revision, before_entries, after_entries, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, 'replace', $5, 'imported from the edited file', 1.0, 'user', 'pending', $6, $7, $8, $9, $9)")
            .bind(&candidate_id).bind(&document.id).bind(project_id).bind(scope.as_str()).bind(&file.content)
            .bind(document.revision).bind(json(&contents(&document.entries))).bind(json(&file.entries)).bind(now)
            .execute(conn).await.map(|done| done.rows_affected())
        })?;
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
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query("UPDATE memory_entry SET owner = 'user' WHERE document_id = $1 AND created_revision = $2")
            .bind(&document.id).bind(revision).execute(conn).await.map(|done| done.rows_affected())
        })?;
        crate::on_tx!(&mut tx, |conn| sqlx::query(
            "UPDATE memory_candidate SET state = 'applied', applied_revision = $2 WHERE id = $1"
        )
        .bind(&candidate_id)
        .bind(revision)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
        let candidate = store::candidate_in(&mut tx, &candidate_id)
            .await?
            .expect("inserted");
        tx.commit().await?;
        // The file now is the accepted version: record its digest so the next write proceeds.
        self.record_projection(
            &document.id,
            &path,
            "synced",
            Some(&file.digest),
            Some(revision),
            Some("imported"),
        )
        .await?;
        let projection = Some(self.publish(&document.id).await?);
        Ok(Outcome {
            candidate,
            applied: true,
            revision,
            projection,
        })
    }

    /// Start-up reconciliation: historical `applying`/`undoing` candidates are classified from
    /// their exact snapshots (after = applied, before = not applied, anything else = uncertain;
    /// never replayed), and missing projections are restored from their recorded revision.
    pub async fn reconcile(&self) -> Result<ReconcileReport, MemoryError> {
        let mut report = ReconcileReport::default();
        let now = self.now();
        let historical: Vec<Candidate> =
            crate::on_db!(self.db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(
                format!(
                    "SELECT {} FROM memory_candidate WHERE state IN ('applying', 'undoing')",
                    store::CANDIDATE_COLUMNS
                )
                .as_str()
            ))
            .fetch_all(pool)
            .await)?;
        for candidate in historical {
            let mut tx = self.db.begin().await?;
            let document = self
                .document_by_id_in(&mut tx, &candidate.document_id)
                .await?;
            let current = contents(&document.entries);
            let before: Vec<String> =
                serde_json::from_str(candidate.before_entries.as_deref().unwrap_or("null"))
                    .unwrap_or_default();
            let after: Vec<String> =
                serde_json::from_str(candidate.after_entries.as_deref().unwrap_or("null"))
                    .unwrap_or_default();
            let undoing = candidate.state == MemoryCandidateState::Undoing;
            // An undo's target is the apply's `before`.
            let (done, not_done) = if undoing {
                (&before, &after)
            } else {
                (&after, &before)
            };
            let (state, bucket) = if &current == done {
                (
                    if undoing {
                        MemoryCandidateState::Undone
                    } else {
                        MemoryCandidateState::Applied
                    },
                    &mut report.applied,
                )
            } else if &current == not_done {
                (
                    if undoing {
                        MemoryCandidateState::Applied
                    } else {
                        MemoryCandidateState::Pending
                    },
                    &mut report.not_applied,
                )
            } else {
                (MemoryCandidateState::Uncertain, &mut report.uncertain)
            };
            crate::on_tx!(&mut tx, |conn| sqlx::query(
                "UPDATE memory_candidate SET state = $2, detail = $3, updated_at = $4 WHERE id = $1"
            )
            .bind(&candidate.id)
            .bind(state.as_str())
            .bind(format!(
                "reconciled at start-up from `{}`: the document matched {}",
                candidate.state,
                if state == MemoryCandidateState::Uncertain {
                    "neither snapshot; inspect before deciding"
                } else if bucket_is_done(state, undoing) {
                    "the completed snapshot"
                } else {
                    "the prior snapshot"
                }
            ))
            .bind(now)
            .execute(conn)
            .await
            .map(|done| done.rows_affected()))?;
            tx.commit().await?;
            bucket.push(candidate.id);
        }
        let documents: Vec<(String, i64, Option<String>, Option<String>)> =
            crate::on_db!(self.db, |pool| sqlx::query_as(
                "SELECT d.id, d.revision, p.path, p.written_digest FROM memory_document d \
                 LEFT JOIN memory_projection p ON p.document_id = d.id WHERE d.revision > 0"
            )
            .fetch_all(pool)
            .await)?;
        for (document_id, _, path, written) in documents {
            let Some(path) = path else { continue };
            let target = PathBuf::from(&path);
            let state = tokio::task::spawn_blocking(move || projection::read(&target))
                .await
                .map_err(|e| MemoryError::Conflict(e.to_string()))?;
            match state {
                Ok(None) => {
                    let published = self.publish(&document_id).await?;
                    if published.state == "synced" {
                        report.restored_projections.push(path);
                    }
                }
                Ok(Some(file)) if written.as_deref().is_some_and(|w| w != file.digest) => {
                    self.record_projection(&document_id, std::path::Path::new(&path), "external_edit", None, None,
                        Some("the file changed outside Zuno; it was preserved — compare with inspect-memory, accept with import-memory")).await?;
                    report.external_edits.push(path);
                }
                Ok(Some(_)) => {}
                Err(error) => {
                    self.record_projection(
                        &document_id,
                        std::path::Path::new(&path),
                        "error",
                        None,
                        None,
                        Some(&error.to_string()),
                    )
                    .await?;
                }
            }
        }
        Ok(report)
    }
}

/// Carries out a consolidation in the caller's transaction once the write's entries exist:
/// merged entries' evidence moves onto the entry kept for their rule, and every text that
/// left is recorded so the same evidence cannot bring it back. `created` maps the write's
/// new texts to their new entry ids. Returns the consolidation with every kept entry's id.
async fn settle_consolidation_in(
    tx: &mut Tx,
    document_id: &str,
    mut consolidation: Consolidation,
    created: &HashMap<String, String>,
    new_evidence: &[String],
    revision: i64,
    now: i64,
) -> Result<Consolidation, MemoryError> {
    for merged in &mut consolidation.merged {
        if merged.into_entry_id.is_none() {
            merged.into_entry_id = created.get(&merged.into).cloned();
        }
        let Some(into) = merged.into_entry_id.clone() else {
            return Err(StoreError::Corrupt(format!(
                "consolidation kept `{}`, which the write did not create",
                merged.into
            ))
            .into());
        };
        match &merged.entry_id {
            Some(from) => {
                crate::on_tx!(tx, |conn| {
                    sqlx::query(
                        "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) \
                         SELECT $2, experience_id, experience_kind FROM memory_provenance WHERE entry_id = $1 \
                         ON CONFLICT DO NOTHING")
                    .bind(from).bind(&into).execute(conn).await.map(|done| done.rows_affected())
                })?;
            }
            None => support_in(tx, &into, new_evidence).await?,
        }
        store::record_dropped_in(
            tx,
            document_id,
            &merged.content,
            &merged.evidence,
            revision,
            now,
        )
        .await?;
    }
    for dropped in &consolidation.dropped {
        store::record_dropped_in(
            tx,
            document_id,
            &dropped.content,
            &dropped.evidence,
            revision,
            now,
        )
        .await?;
    }
    Ok(consolidation)
}

/// Records `evidence` as support of `entry_id`.
async fn support_in(tx: &mut Tx, entry_id: &str, evidence: &[String]) -> Result<(), MemoryError> {
    for experience_id in evidence {
        crate::on_tx!(tx, |conn| sqlx::query(
            "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) \
                 SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING"
        )
        .bind(entry_id)
        .bind(experience_id)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    }
    Ok(())
}

fn bucket_is_done(state: MemoryCandidateState, undoing: bool) -> bool {
    matches!(
        (state, undoing),
        (MemoryCandidateState::Applied, false) | (MemoryCandidateState::Undone, true)
    )
}

/// `forget`: in the caller's transaction, retracts derived entries that lost all their support
/// (independent support, imported notes and user entries survive) and rejects pending candidates
/// that cite the forgotten experience. Returns the documents whose projection must be
/// republished after commit.
pub async fn retract_unsupported_in(
    tx: &mut Tx,
    experience_id: &str,
    now: i64,
) -> Result<Vec<String>, StoreError> {
    let affected: Vec<(String, String)> = crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT m.id, m.document_id FROM memory_entry m JOIN memory_provenance p ON p.entry_id = m.id \
             WHERE p.experience_id = $1 AND m.retracted_revision IS NULL AND m.derived = TRUE AND m.owner = 'automatic'")
        .bind(experience_id).fetch_all(conn).await
    })?;
    let mut documents: Vec<String> = Vec::new();
    for (entry_id, document_id) in affected {
        let support: i64 = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM memory_provenance p JOIN experience_record e ON e.id = p.experience_id \
                 WHERE p.entry_id = $1 AND e.status = 'active'")
            .bind(&entry_id).fetch_one(conn).await
        })?;
        if support > 0 {
            continue;
        }
        let revision: i64 = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "UPDATE memory_document SET revision = revision + 1, updated_at = $2 WHERE id = $1 RETURNING revision")
            .bind(&document_id).bind(now).fetch_one(conn).await
        })?;
        let content: String = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "UPDATE memory_entry SET retracted_revision = $2 WHERE id = $1 RETURNING content"
        )
        .bind(&entry_id)
        .bind(revision)
        .fetch_one(conn)
        .await)?;
        let remaining: Vec<String> = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT content FROM memory_entry WHERE document_id = $1 AND retracted_revision IS NULL ORDER BY position, id")
            .bind(&document_id).fetch_all(conn).await
        })?;
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_revision (document_id, revision, entries, change, at) VALUES ($1, $2, $3, 'retract', $4)")
            .bind(&document_id).bind(revision).bind(json(&remaining)).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_forgotten_text (document_id, content_digest, reason, at) VALUES ($1, $2, 'forgotten', $3) ON CONFLICT DO NOTHING")
            .bind(&document_id).bind(sha256(&content)).bind(now).execute(conn).await.map(|done| done.rows_affected())
        })?;
        if !documents.contains(&document_id) {
            documents.push(document_id);
        }
    }
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE memory_candidate SET state = 'rejected', detail = 'its evidence was forgotten', updated_at = $2 \
             WHERE state = 'pending' AND id IN (SELECT candidate_id FROM memory_candidate_evidence WHERE experience_id = $1)")
        .bind(experience_id).bind(now).execute(conn).await.map(|done| done.rows_affected())
    })?;
    Ok(documents)
}

impl From<ProjectionError> for MemoryError {
    fn from(error: ProjectionError) -> MemoryError {
        MemoryError::Refused(WriteRefusal::Invalid {
            field: "projection",
            reason: error.to_string(),
        })
    }
}
