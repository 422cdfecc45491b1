//! Database access for resident Memory: documents (one global, one per project) with a
//! revision, current entries, revision history, candidates and provenance.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::consolidate::{Consolidation, EntryValue};
use crate::db::{Db, StoreError, Tx};
use crate::learning::manifest::sha256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Global,
    Project,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Project => "project",
        }
    }

    pub fn parse(value: &str) -> Option<Scope> {
        match value {
            "global" => Some(Scope::Global),
            "project" => Some(Scope::Project),
            _ => None,
        }
    }

    /// The prompt section this scope renders as.
    pub fn section(self) -> &'static str {
        match self {
            Scope::Global => "memory.global",
            Scope::Project => "memory.project",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub id: String,
    pub content: String,
    /// `user`, `automatic` or `imported`.
    pub owner: String,
    pub derived: bool,
    pub position: i64,
    pub created_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    pub id: String,
    pub scope: Scope,
    pub project_id: Option<String>,
    pub revision: i64,
    pub entries: Vec<Entry>,
}

/// What prompts may show of a document: entries whose support still stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentView {
    pub scope: Scope,
    pub revision: i64,
    pub entries: Vec<Entry>,
    /// Derived entries withheld because every source supporting them is gone, forgotten or
    /// changed.
    pub withheld: usize,
}

/// The document for a scope, created (empty, revision 0) on first use. Creating the row writes
/// no file: projections are created by their first accepted write.
pub async fn document_in(
    tx: &mut Tx,
    scope: Scope,
    project_id: Option<&str>,
    now: i64,
) -> Result<Document, StoreError> {
    let project_id = match scope {
        Scope::Global => None,
        Scope::Project => project_id,
    };
    let find = "SELECT id, revision FROM memory_document WHERE scope = $1 AND COALESCE(project_id, '') = COALESCE($2, '')";
    let found: Option<(String, i64)> = crate::on_tx!(tx, |conn| sqlx::query_as(find)
        .bind(scope.as_str())
        .bind(project_id)
        .fetch_optional(conn)
        .await)?;
    let (id, revision) = match found {
        Some(found) => found,
        None => {
            let id = crate::ids::new_id("mdoc");
            let sql = "INSERT INTO memory_document (id, scope, project_id, revision, updated_at) VALUES ($1, $2, $3, 0, $4) ON CONFLICT DO NOTHING";
            crate::on_tx!(tx, |conn| sqlx::query(sql)
                .bind(&id)
                .bind(scope.as_str())
                .bind(project_id)
                .bind(now)
                .execute(conn)
                .await
                .map(|done| done.rows_affected()))?;
            crate::on_tx!(tx, |conn| sqlx::query_as(find)
                .bind(scope.as_str())
                .bind(project_id)
                .fetch_one(conn)
                .await)?
        }
    };
    let entries = entries_in(tx, &id).await?;
    Ok(Document {
        id,
        scope,
        project_id: project_id.map(str::to_owned),
        revision,
        entries,
    })
}

pub async fn entries_in(tx: &mut Tx, document_id: &str) -> Result<Vec<Entry>, StoreError> {
    let sql = "SELECT id, content, owner, derived, position, created_revision FROM memory_entry \
               WHERE document_id = $1 AND retracted_revision IS NULL ORDER BY position, id";
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(document_id)
        .fetch_all(conn)
        .await)?)
}

/// Entry ids, among `entries`, that are derived and have lost all their support.
pub async fn unsupported_in(tx: &mut Tx, entries: &[Entry]) -> Result<Vec<String>, StoreError> {
    let mut unsupported = Vec::new();
    for entry in entries.iter().filter(|e| e.derived) {
        let live: i64 = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM memory_provenance p JOIN experience_record e ON e.id = p.experience_id \
                 WHERE p.entry_id = $1 AND e.status = 'active' AND e.source_state = 'current'")
            .bind(&entry.id).fetch_one(conn).await
        })?;
        if live == 0 {
            unsupported.push(entry.id.clone());
        }
    }
    Ok(unsupported)
}

/// The documents a project's prompts show, as `(section name, view)`.
pub async fn prompt_documents(
    db: &Db,
    project_id: &str,
) -> Result<Vec<(&'static str, DocumentView)>, StoreError> {
    let mut tx = db.begin_read().await?;
    let mut views = Vec::new();
    for scope in [Scope::Global, Scope::Project] {
        if let Some(view) = view_in(&mut tx, scope, Some(project_id)).await? {
            views.push((scope.section(), view));
        }
    }
    tx.rollback().await?;
    Ok(views)
}

/// A document's prompt view without creating it.
pub async fn view_in(
    tx: &mut Tx,
    scope: Scope,
    project_id: Option<&str>,
) -> Result<Option<DocumentView>, StoreError> {
    let project_id = match scope {
        Scope::Global => None,
        Scope::Project => project_id,
    };
    let found: Option<(String, i64)> = crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT id, revision FROM memory_document WHERE scope = $1 AND COALESCE(project_id, '') = COALESCE($2, '')")
        .bind(scope.as_str()).bind(project_id).fetch_optional(conn).await
    })?;
    let Some((id, revision)) = found else {
        return Ok(None);
    };
    let entries = entries_in(tx, &id).await?;
    let unsupported = unsupported_in(tx, &entries).await?;
    let withheld = unsupported.len();
    let entries = entries
        .into_iter()
        .filter(|e| !unsupported.contains(&e.id))
        .collect();
    Ok(Some(DocumentView {
        scope,
        revision,
        entries,
        withheld,
    }))
}

crate::states::stored_states! {
    /// Where a memory candidate is in its life. `applying` and `undoing` are historical: a change
    /// in flight when a process died, which start-up reconciliation settles.
    pub enum MemoryCandidateState in "memory_candidate"."state" {
        Pending = "pending",
        Applying = "applying",
        Applied = "applied",
        Rejected = "rejected",
        Undoing = "undoing",
        Undone = "undone",
        Uncertain = "uncertain",
        Stale = "stale",
    }
}

/// A candidate as stored.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = MemoryCandidate)]
pub struct Candidate {
    pub id: String,
    pub document_id: String,
    pub project_id: Option<String>,
    pub target: String,
    pub action: String,
    pub content: Option<String>,
    pub old_text: Option<String>,
    pub reason: String,
    pub confidence: f64,
    pub origin: String,
    #[sqlx(try_from = "String")]
    pub state: MemoryCandidateState,
    pub base_revision: i64,
    /// JSON array of the document's entries before the change.
    pub before_entries: Option<String>,
    /// JSON array of the entries after the change.
    pub after_entries: Option<String>,
    pub applied_revision: Option<i64>,
    pub undone_revision: Option<i64>,
    pub detail: Option<String>,
    pub job_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// JSON object ([`Consolidation`]): what the change merged and dropped to fit the cap.
    pub consolidation: Option<String>,
}

impl Candidate {
    /// What the change merged and dropped to fit the cap, if anything.
    pub fn consolidation(&self) -> Option<Consolidation> {
        parse_consolidation(self.consolidation.as_deref())
    }
}

pub const CANDIDATE_COLUMNS: &str = "id, document_id, project_id, target, action, content, old_text, reason, confidence, origin, \
    state, base_revision, before_entries, after_entries, applied_revision, undone_revision, detail, job_id, created_at, updated_at, \
    consolidation";

pub async fn candidate_in(tx: &mut Tx, id: &str) -> Result<Option<Candidate>, StoreError> {
    let sql = format!("SELECT {CANDIDATE_COLUMNS} FROM memory_candidate WHERE id = $1");
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(id)
    .fetch_optional(conn)
    .await)?)
}

pub async fn candidates(
    db: &Db,
    project_id: Option<&str>,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<Candidate>, StoreError> {
    let sql = format!(
        "SELECT {CANDIDATE_COLUMNS} FROM memory_candidate WHERE ($1 IS NULL OR project_id = $1 OR target = 'global') \
         AND ($2 IS NULL OR state = $2) ORDER BY created_at DESC, id DESC LIMIT $3"
    );
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(project_id)
    .bind(state)
    .bind(limit)
    .fetch_all(pool)
    .await)?)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub revision: i64,
    /// JSON array of the entries after this revision.
    pub entries: String,
    pub change: String,
    pub candidate_id: Option<String>,
    pub at: i64,
    /// JSON object ([`Consolidation`]): what this revision merged and dropped to fit the cap.
    pub consolidation: Option<String>,
}

impl Revision {
    /// What this revision merged and dropped to fit the cap, if anything.
    pub fn consolidation(&self) -> Option<Consolidation> {
        parse_consolidation(self.consolidation.as_deref())
    }
}

fn parse_consolidation(json: Option<&str>) -> Option<Consolidation> {
    json.and_then(|json| serde_json::from_str(json).ok())
}

pub async fn revisions(
    db: &Db,
    document_id: &str,
    limit: i64,
) -> Result<Vec<Revision>, StoreError> {
    let sql = "SELECT revision, entries, change, candidate_id, at, consolidation FROM memory_revision \
               WHERE document_id = $1 ORDER BY revision DESC LIMIT $2";
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(document_id)
        .bind(limit)
        .fetch_all(pool)
        .await)?)
}

/// The worth of a document's current entries that have supporting experiences, by entry id:
/// how many sources still stand, how often the experiences were recalled into a prompt or
/// reinforced, how often they were violated.
pub async fn entry_values_in(
    tx: &mut Tx,
    document_id: &str,
) -> Result<HashMap<String, EntryValue>, StoreError> {
    let sql = "SELECT p.entry_id, p.experience_id, \
                 CASE WHEN e.status = 'active' AND e.source_state = 'current' THEN 1 ELSE 0 END, \
                 e.use_count + e.reinforcements, e.violations \
               FROM memory_provenance p \
               JOIN memory_entry m ON m.id = p.entry_id \
               JOIN experience_record e ON e.id = p.experience_id \
               WHERE m.document_id = $1 AND m.retracted_revision IS NULL \
               ORDER BY p.entry_id, p.experience_id";
    let rows: Vec<(String, String, i32, i64, i64)> = crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(document_id)
        .fetch_all(conn)
        .await)?;
    let mut values: HashMap<String, EntryValue> = HashMap::new();
    for (entry_id, experience_id, live, uses, violations) in rows {
        let value = values.entry(entry_id).or_default();
        value.live_sources += i64::from(live);
        value.uses += uses;
        value.violations += violations;
        value.evidence.push(experience_id);
    }
    Ok(values)
}

/// The experiences that supported `content` when consolidation last dropped it from the
/// document, or `None` when it was never dropped.
pub async fn dropped_evidence_in(
    tx: &mut Tx,
    document_id: &str,
    content: &str,
) -> Result<Option<Vec<String>>, StoreError> {
    let evidence: Option<String> =
        crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
        "SELECT evidence FROM memory_dropped_text WHERE document_id = $1 AND content_digest = $2"
    )
    .bind(document_id)
    .bind(sha256(content))
    .fetch_optional(conn)
    .await
        })?;
    Ok(evidence.map(|json| serde_json::from_str(&json).unwrap_or_default()))
}

/// Records that consolidation dropped (or merged away) `content`, supported by `evidence`; a
/// text dropped before keeps the evidence recorded then too.
pub async fn record_dropped_in(
    tx: &mut Tx,
    document_id: &str,
    content: &str,
    evidence: &[String],
    revision: i64,
    now: i64,
) -> Result<(), StoreError> {
    let mut all = dropped_evidence_in(tx, document_id, content)
        .await?
        .unwrap_or_default();
    for id in evidence {
        if !all.contains(id) {
            all.push(id.clone());
        }
    }
    let json = serde_json::to_string(&all).unwrap_or_else(|_| String::from("[]"));
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO memory_dropped_text (document_id, content_digest, evidence, revision, at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (document_id, content_digest) DO UPDATE SET evidence = excluded.evidence, revision = excluded.revision, at = excluded.at")
        .bind(document_id).bind(sha256(content)).bind(json).bind(revision).bind(now)
        .execute(conn).await.map(|done| done.rows_affected())
    })?;
    Ok(())
}

/// A current resident entry with the experiences that support it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedEntry {
    pub scope: Scope,
    pub entry: Entry,
    pub experience_ids: Vec<String>,
}

/// The current entries of the global document and of `project_id`'s document, each with its
/// supporting experiences (for audits and the learning-quality harness).
pub async fn supported_entries(
    db: &Db,
    project_id: &str,
) -> Result<Vec<SupportedEntry>, StoreError> {
    let mut tx = db.begin_read().await?;
    let mut found = Vec::new();
    for scope in [Scope::Global, Scope::Project] {
        let Some(view) = view_in(&mut tx, scope, Some(project_id)).await? else {
            continue;
        };
        for entry in view.entries {
            let experience_ids: Vec<String> = crate::on_tx!(&mut tx, |conn| {
                sqlx::query_scalar(
                    "SELECT experience_id FROM memory_provenance WHERE entry_id = $1 ORDER BY experience_id")
                .bind(&entry.id).fetch_all(conn).await
            })?;
            found.push(SupportedEntry {
                scope,
                entry,
                experience_ids,
            });
        }
    }
    tx.rollback().await?;
    Ok(found)
}

// Maintenance reads and writes: the maintenance job's watermark and its stale-plan check.

/// The maintenance watermark of `project_id`: the `(created_at, experience id)` of the newest
/// input a completed maintenance job has considered.
pub async fn maintenance_watermark_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<Option<(i64, String)>, StoreError> {
    let sql = "SELECT watermark_at, watermark_id FROM memory_maintenance WHERE project_id = $1";
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(project_id)
        .fetch_optional(conn)
        .await)?)
}

/// Moves the maintenance watermark of `project_id` to `(at, experience_id)`, in the caller's
/// transaction (the job's settlement, so it advances only with the plan it belongs to).
pub async fn advance_maintenance_watermark_in(
    tx: &mut Tx,
    project_id: &str,
    (at, experience_id): (i64, &str),
    now: i64,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO memory_maintenance (project_id, watermark_at, watermark_id, updated_at) VALUES ($1, $2, $3, $4) \
               ON CONFLICT (project_id) DO UPDATE SET watermark_at = excluded.watermark_at, \
               watermark_id = excluded.watermark_id, updated_at = excluded.updated_at";
    crate::on_tx!(tx, |conn| sqlx::query(sql)
        .bind(project_id)
        .bind(at)
        .bind(experience_id)
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// The current revisions of the global document and of `project_id`'s document, 0 for a
/// document that does not exist yet. One statement for both.
pub async fn revisions_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<HashMap<Scope, i64>, StoreError> {
    let sql = "SELECT scope, revision FROM memory_document \
               WHERE (scope = 'global' AND COALESCE(project_id, '') = '') \
                  OR (scope = 'project' AND COALESCE(project_id, '') = $1)";
    let rows: Vec<(String, i64)> = crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(project_id)
        .fetch_all(conn)
        .await)?;
    let mut revisions = HashMap::from([(Scope::Global, 0), (Scope::Project, 0)]);
    for (scope, revision) in rows {
        let scope = Scope::parse(&scope)
            .ok_or_else(|| StoreError::Corrupt(format!("memory_document scope `{scope}`")))?;
        revisions.insert(scope, revision);
    }
    Ok(revisions)
}
