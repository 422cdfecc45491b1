//! Database access for resident Memory: documents (one global, one per project) with a
//! revision, current entries, revision history, candidates and provenance.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::audit::MarkedStale;
use super::consolidate::{Consolidation, EntryValue};
use crate::db::{Db, StoreError, Tx};
use crate::text::sha256;

/// Store functions whose whole work is one statement in the caller's transaction, their
/// arguments bound to `$1`, `$2`, … in the order they are declared.
macro_rules! statement_in {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),* $(,)?) => $sql:expr;)*) => {$(
        $(#[$doc])*
        pub async fn $name(tx: &mut Tx, $($arg: $ty),*) -> Result<(), StoreError> {
            crate::db::execute_in(tx, $sql, &[$($arg.into()),*]).await?;
            Ok(())
        }
    )*};
}

zuno_queue::text_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Scope {
        Global = "global",
        Project = "project",
    }
}

impl Scope {
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
    let id = match found {
        Some((id, _)) => id,
        None => {
            let id = crate::ids::new_id("mdoc");
            let sql = "INSERT INTO memory_document (id, scope, project_id, revision, updated_at) VALUES ($1, $2, $3, 0, $4) ON CONFLICT DO NOTHING";
            crate::db::execute_in(
                tx,
                sql,
                &[
                    (&id).into(),
                    scope.as_str().into(),
                    project_id.into(),
                    now.into(),
                ],
            )
            .await?;
            let (id, _): (String, i64) = crate::on_tx!(tx, |conn| sqlx::query_as(find)
                .bind(scope.as_str())
                .bind(project_id)
                .fetch_one(conn)
                .await)?;
            id
        }
    };
    let (revision, entries) = snapshot_in(tx, &id).await?;
    Ok(Document {
        id,
        scope,
        project_id: project_id.map(str::to_owned),
        revision,
        entries,
    })
}

/// A document's revision and its current entries, read by ONE statement. On Postgres (read
/// committed) two statements can straddle another writer's commit and pair revision 1 with the
/// entries of revision 2; a writer planning a change against that pair would then be refused for
/// a missing entry instead of being told its revision is stale.
pub async fn snapshot_in(tx: &mut Tx, document_id: &str) -> Result<(i64, Vec<Entry>), StoreError> {
    type Row = (
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<bool>,
        Option<i64>,
        Option<i64>,
    );
    let sql = "SELECT d.revision, e.id, e.content, e.owner, e.derived, e.position, e.created_revision \
               FROM memory_document d LEFT JOIN memory_entry e \
                 ON e.document_id = d.id AND e.retracted_revision IS NULL \
               WHERE d.id = $1 ORDER BY e.position, e.id";
    let rows: Vec<Row> = crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(document_id)
        .fetch_all(conn)
        .await)?;
    let Some(revision) = rows.first().map(|row| row.0) else {
        return Err(StoreError::Corrupt(format!(
            "memory document `{document_id}` vanished inside its transaction"
        )));
    };
    let entries = rows
        .into_iter()
        .filter_map(
            |(_, id, content, owner, derived, position, created_revision)| {
                Some(Entry {
                    id: id?,
                    content: content?,
                    owner: owner?,
                    derived: derived?,
                    position: position?,
                    created_revision: created_revision?,
                })
            },
        )
        .collect();
    Ok((revision, entries))
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
    let derived: Vec<&str> = entries
        .iter()
        .filter(|e| e.derived)
        .map(|e| e.id.as_str())
        .collect();
    if derived.is_empty() {
        return Ok(Vec::new());
    }
    // One statement for the whole document: the prompt reads it before every request.
    let mut supported = std::collections::HashSet::new();
    for chunk in derived.chunks(400) {
        let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT DISTINCT p.entry_id FROM memory_provenance p JOIN experience_record e ON e.id = p.experience_id \
             WHERE p.entry_id IN ({}) AND {}",
            placeholders.join(", "),
            crate::learning::experience::store::live_experience!("e")
        );
        let live: Vec<String> = crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()));
            for id in chunk {
                query = query.bind(*id);
            }
            query.fetch_all(conn).await
        })?;
        supported.extend(live);
    }
    Ok(derived
        .into_iter()
        .filter(|id| !supported.contains(*id))
        .map(str::to_owned)
        .collect())
}

/// The documents a project's prompts show, as `(section name, view)`: global first.
///
/// One statement (so one snapshot on either backend) for both documents, their entries and
/// whether each derived entry still has support: it runs before every prompt.
pub async fn prompt_documents(
    db: &Db,
    project_id: &str,
) -> Result<Vec<(&'static str, DocumentView)>, StoreError> {
    type Row = (
        String,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<bool>,
        Option<i64>,
        Option<i64>,
        Option<bool>,
    );
    let sql = concat!(
        "SELECT d.scope, d.revision, e.id, e.content, e.owner, e.derived, e.position, e.created_revision, \
                 (e.derived AND NOT EXISTS (SELECT 1 FROM memory_provenance p \
                    JOIN experience_record x ON x.id = p.experience_id \
                    WHERE p.entry_id = e.id AND ",
        crate::learning::experience::store::live_experience!("x"),
        ")) AS unsupported \
               FROM memory_document d LEFT JOIN memory_entry e \
                 ON e.document_id = d.id AND e.retracted_revision IS NULL \
               WHERE (d.scope = 'global' AND COALESCE(d.project_id, '') = '') \
                  OR (d.scope = 'project' AND d.project_id = $1) \
               ORDER BY d.scope, e.position, e.id"
    );
    let rows: Vec<Row> = crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(project_id)
        .fetch_all(pool)
        .await)?;
    let mut views: Vec<(&'static str, DocumentView)> = Vec::new();
    for (scope, revision, id, content, owner, derived, position, created, unsupported) in rows {
        let scope = Scope::parse(&scope)
            .ok_or_else(|| StoreError::Corrupt(format!("memory_document scope `{scope}`")))?;
        if views.last().is_none_or(|(_, view)| view.scope != scope) {
            views.push((
                scope.section(),
                DocumentView {
                    scope,
                    revision,
                    entries: Vec::new(),
                    withheld: 0,
                },
            ));
        }
        let view = &mut views.last_mut().expect("pushed above").1;
        let (Some(id), Some(content), Some(owner), Some(derived), Some(position), Some(created)) =
            (id, content, owner, derived, position, created)
        else {
            continue;
        };
        if unsupported == Some(true) {
            view.withheld += 1;
            continue;
        }
        view.entries.push(Entry {
            id,
            content,
            owner,
            derived,
            position,
            created_revision: created,
        });
    }
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
    let Some((id, _)) = found else {
        return Ok(None);
    };
    let (revision, entries) = snapshot_in(tx, &id).await?;
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
    /// Whether the candidate changes the global document (its `target` column is a [`Scope`]).
    pub fn targets_global(&self) -> bool {
        Scope::parse(&self.target) == Some(Scope::Global)
    }
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
    let sql = concat!(
        "SELECT p.entry_id, p.experience_id, \
                 CASE WHEN ",
        crate::learning::experience::store::live_experience!("e"),
        " THEN 1 ELSE 0 END, \
                 e.use_count + e.reinforcements, e.violations \
               FROM memory_provenance p \
               JOIN memory_entry m ON m.id = p.entry_id \
               JOIN experience_record e ON e.id = p.experience_id \
               WHERE m.document_id = $1 AND m.retracted_revision IS NULL \
               ORDER BY p.entry_id, p.experience_id"
    );
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
    let evidence: Option<String> = crate::on_tx!(tx, |conn| {
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
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_dropped_text (document_id, content_digest, evidence, revision, at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (document_id, content_digest) DO UPDATE SET evidence = excluded.evidence, revision = excluded.revision, at = excluded.at",
        &[
            document_id.into(),
            (&sha256(content)).into(),
            (&json).into(),
            revision.into(),
            now.into(),
        ],
    )
    .await?;
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
            let experience_ids = entry_support_in(&mut tx, &entry.id).await?;
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

// ---------------------------------------------------------------------------------------------
// Projection records and start-up reconciliation (the memory service's file ↔ database sync)
// ---------------------------------------------------------------------------------------------

/// The experiences an entry rests on (its provenance), by id.
pub async fn entry_support_in(tx: &mut Tx, entry_id: &str) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT experience_id FROM memory_provenance WHERE entry_id = $1 ORDER BY experience_id"
    )
    .bind(entry_id)
    .fetch_all(conn)
    .await)?)
}

/// A project's recorded worktree: `None` for an unknown project, `Some(None)` for a project
/// without one.
pub async fn project_worktree(
    db: &Db,
    project_id: &str,
) -> Result<Option<Option<String>>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_scalar(
        PROJECT_WORKTREE
    )
    .bind(project_id)
    .fetch_optional(pool)
    .await)?)
}

/// [`project_worktree`] in the caller's transaction.
pub async fn project_worktree_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<Option<Option<String>>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        PROJECT_WORKTREE
    )
    .bind(project_id)
    .fetch_optional(conn)
    .await)?)
}

const PROJECT_WORKTREE: &str = "SELECT worktree FROM project WHERE id = $1";

/// The id of a project's Memory document when it holds at least one revision.
pub async fn written_project_document(
    db: &Db,
    project_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT id FROM memory_document WHERE project_id = $1 AND revision > 0"
    )
    .bind(project_id)
    .fetch_optional(pool)
    .await)?)
}

/// The digest of the projection bytes Zuno last wrote or adopted for a document, if any.
pub async fn written_digest_in(
    tx: &mut Tx,
    document_id: &str,
) -> Result<Option<String>, StoreError> {
    let written: Option<Option<String>> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT written_digest FROM memory_projection WHERE document_id = $1"
    )
    .bind(document_id)
    .fetch_optional(conn)
    .await)?;
    Ok(written.flatten())
}

/// Whether a document's projection has ever been recorded (written, adopted or refused).
pub async fn projection_known_in(tx: &mut Tx, document_id: &str) -> Result<bool, StoreError> {
    let known: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT CAST(1 AS BIGINT) FROM memory_projection WHERE document_id = $1"
    )
    .bind(document_id)
    .fetch_optional(conn)
    .await)?;
    Ok(known.is_some())
}

/// What became of a document's projection. `digest` and `revision` are kept from the last
/// record when `None` (a failed write leaves the last written bytes as the ones to compare).
pub struct ProjectionRecord<'a> {
    pub path: &'a str,
    pub state: &'a str,
    pub digest: Option<&'a str>,
    pub revision: Option<i64>,
    pub detail: Option<&'a str>,
}

/// Records a document's projection state (see [`ProjectionRecord`]).
pub async fn record_projection_in(
    tx: &mut Tx,
    document_id: &str,
    record: &ProjectionRecord<'_>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_projection (document_id, path, written_digest, written_revision, state, detail, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (document_id) DO UPDATE SET path = excluded.path, \
               written_digest = COALESCE(excluded.written_digest, memory_projection.written_digest), \
               written_revision = COALESCE(excluded.written_revision, memory_projection.written_revision), \
               state = excluded.state, detail = excluded.detail, updated_at = excluded.updated_at",
        &[
            document_id.into(),
            record.path.into(),
            record.digest.into(),
            record.revision.into(),
            record.state.into(),
            record.detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

statement_in! {
    /// Gives the entries a revision created to `owner` (`imported` for an adopted file, `user` for
    /// an accepted edit).
    set_owner_in(document_id: &str, revision: i64, owner: &str)
        => "UPDATE memory_entry SET owner = $3 WHERE document_id = $1 AND created_revision = $2";
}

/// The recorded projection state and detail of a scope's document.
pub async fn projection_state_in(
    tx: &mut Tx,
    scope: Scope,
    project_id: Option<&str>,
) -> Result<Option<(String, Option<String>)>, StoreError> {
    let project_id = if scope == Scope::Project {
        project_id
    } else {
        None
    };
    Ok(crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT p.state, p.detail FROM memory_projection p JOIN memory_document d ON d.id = p.document_id \
             WHERE d.scope = $1 AND COALESCE(d.project_id, '') = COALESCE($2, '')")
        .bind(scope.as_str()).bind(project_id).fetch_optional(conn).await
    })?)
}

/// A scope's document id without creating the document.
pub async fn document_id_in(
    tx: &mut Tx,
    scope: Scope,
    project_id: Option<&str>,
) -> Result<Option<String>, StoreError> {
    let project_id = if scope == Scope::Project {
        project_id
    } else {
        None
    };
    Ok(crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT id FROM memory_document WHERE scope = $1 AND COALESCE(project_id, '') = COALESCE($2, '')")
        .bind(scope.as_str()).bind(project_id).fetch_optional(conn).await
    })?)
}

/// Journals an accepted edit of the file as a pending user candidate replacing the whole
/// document; `before` and `after` are the entries as JSON arrays.
#[allow(clippy::too_many_arguments)]
pub async fn insert_import_candidate_in(
    tx: &mut Tx,
    candidate_id: &str,
    document: &Document,
    project_id: Option<&str>,
    content: &str,
    before: &str,
    after: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_candidate (id, document_id, project_id, target, action, content, reason, confidence, origin, state, \
               base_revision, before_entries, after_entries, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'replace', $5, 'imported from the edited file', 1.0, 'user', 'pending', $6, $7, $8, $9, $9)",
        &[
            candidate_id.into(),
            (&document.id).into(),
            project_id.into(),
            document.scope.as_str().into(),
            content.into(),
            document.revision.into(),
            before.into(),
            after.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

statement_in! {
    /// Marks a candidate applied as `revision`.
    mark_applied_in(candidate_id: &str, revision: i64)
        => "UPDATE memory_candidate SET state = 'applied', applied_revision = $2 WHERE id = $1";
}

/// Candidates a crash left `applying` or `undoing`.
pub async fn interrupted_candidates(db: &Db) -> Result<Vec<Candidate>, StoreError> {
    Ok(crate::on_db!(db, |pool| {
        sqlx::query_as(sqlx::AssertSqlSafe(
        format!(
            "SELECT {CANDIDATE_COLUMNS} FROM memory_candidate WHERE state IN ('applying', 'undoing')"
        )
        .as_str()
    ))
    .fetch_all(pool)
    .await
    })?)
}

/// Sets a candidate's state and detail without checking the state it leaves (reconciliation
/// decides from the document, not from the candidate).
pub async fn set_state_in(
    tx: &mut Tx,
    candidate_id: &str,
    state: MemoryCandidateState,
    detail: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE memory_candidate SET state = $2, detail = $3, updated_at = $4 WHERE id = $1",
        &[
            candidate_id.into(),
            state.as_str().into(),
            detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// Every document with at least one revision, with its projection path and written digest
/// when one was recorded.
pub async fn published_documents(
    db: &Db,
) -> Result<Vec<(String, Option<String>, Option<String>)>, StoreError> {
    let documents: Vec<(String, i64, Option<String>, Option<String>)> =
        crate::on_db!(db, |pool| sqlx::query_as(
            "SELECT d.id, d.revision, p.path, p.written_digest FROM memory_document d \
             LEFT JOIN memory_projection p ON p.document_id = d.id WHERE d.revision > 0"
        )
        .fetch_all(pool)
        .await)?;
    Ok(documents
        .into_iter()
        .map(|(id, _, path, written)| (id, path, written))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Retraction when evidence is forgotten
// ---------------------------------------------------------------------------------------------

fn entries_json(entries: &[String]) -> String {
    serde_json::to_string(entries).unwrap_or_else(|_| String::from("[]"))
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
        crate::db::execute_in(
            tx,
            "INSERT INTO memory_revision (document_id, revision, entries, change, at) VALUES ($1, $2, $3, 'retract', $4)",
            &[
                (&document_id).into(),
                revision.into(),
                (&entries_json(&remaining)).into(),
                now.into(),
            ],
        )
        .await?;
        crate::db::execute_in(
            tx,
            "INSERT INTO memory_forgotten_text (document_id, content_digest, reason, at) VALUES ($1, $2, 'forgotten', $3) ON CONFLICT DO NOTHING",
            &[(&document_id).into(), (&sha256(&content)).into(), now.into()],
        )
        .await?;
        if !documents.contains(&document_id) {
            documents.push(document_id);
        }
    }
    crate::db::execute_in(
        tx,
        "UPDATE memory_candidate SET state = 'rejected', detail = 'its evidence was forgotten', updated_at = $2 \
             WHERE state = 'pending' AND id IN (SELECT candidate_id FROM memory_candidate_evidence WHERE experience_id = $1)",
        &[experience_id.into(), now.into()],
    )
    .await?;
    Ok(documents)
}

// ---------------------------------------------------------------------------------------------
// Revisions, entries and candidates as the memory service writes them
// ---------------------------------------------------------------------------------------------

/// A document by id with its current entries, without creating anything.
pub async fn document_by_id_in(
    tx: &mut Tx,
    document_id: &str,
) -> Result<Option<Document>, StoreError> {
    let row: Option<(String, Option<String>)> = crate::on_tx!(tx, |conn| sqlx::query_as(
        "SELECT scope, project_id FROM memory_document WHERE id = $1"
    )
    .bind(document_id)
    .fetch_optional(conn)
    .await)?;
    let Some((scope, project_id)) = row else {
        return Ok(None);
    };
    let (revision, entries) = snapshot_in(tx, document_id).await?;
    Ok(Some(Document {
        id: document_id.to_owned(),
        scope: Scope::parse(&scope)
            .ok_or_else(|| StoreError::Corrupt(format!("memory scope `{scope}`")))?,
        project_id,
        revision,
        entries,
    }))
}

/// `UPDATE … WHERE revision = <read revision>`: moves the document from `revision` to the next
/// one, or returns the revision it is at when another writer moved it first (two writers
/// cannot both replace one revision).
pub async fn advance_revision_in(
    tx: &mut Tx,
    document_id: &str,
    revision: i64,
    now: i64,
) -> Result<Result<i64, i64>, StoreError> {
    let advanced = crate::db::execute_in(
        tx,
        "UPDATE memory_document SET revision = revision + 1, updated_at = $3 WHERE id = $1 AND revision = $2",
        &[document_id.into(), revision.into(), now.into()],
    )
    .await?;
    if advanced == 1 {
        return Ok(Ok(revision + 1));
    }
    let current: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT revision FROM memory_document WHERE id = $1"
    )
    .bind(document_id)
    .fetch_one(conn)
    .await)?;
    Ok(Err(current))
}

/// One row of a document's revision history.
pub struct RevisionRow<'a> {
    pub document_id: &'a str,
    pub revision: i64,
    /// The entries after the change, as a JSON array.
    pub entries: &'a str,
    /// `apply`, `undo`, `adopt`, `import`, …
    pub change: &'a str,
    pub consolidation: Option<&'a str>,
    pub candidate_id: Option<&'a str>,
}

pub async fn insert_revision_in(
    tx: &mut Tx,
    row: &RevisionRow<'_>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_revision (document_id, revision, entries, change, candidate_id, at, consolidation) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            row.document_id.into(),
            row.revision.into(),
            row.entries.into(),
            row.change.into(),
            row.candidate_id.into(),
            now.into(),
            row.consolidation.into(),
        ],
    )
    .await?;
    Ok(())
}

/// A new current entry.
pub struct NewEntry<'a> {
    pub id: &'a str,
    pub document_id: &'a str,
    pub content: &'a str,
    pub owner: &'a str,
    pub derived: bool,
    pub position: i64,
    pub revision: i64,
}

pub async fn insert_entry_in(
    tx: &mut Tx,
    entry: &NewEntry<'_>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_entry (id, document_id, content, owner, derived, position, created_revision, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            entry.id.into(),
            entry.document_id.into(),
            entry.content.into(),
            entry.owner.into(),
            entry.derived.into(),
            entry.position.into(),
            entry.revision.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

statement_in! {
    set_position_in(entry_id: &str, position: i64)
        => "UPDATE memory_entry SET position = $2 WHERE id = $1";

    /// Retracts an entry as of `revision` (it stays in history).
    retract_entry_in(entry_id: &str, revision: i64)
        => "UPDATE memory_entry SET retracted_revision = $2 WHERE id = $1";
}

/// The most recent entry, current or retracted, that held `content` in the document: its id,
/// owner and whether it was derived.
pub async fn latest_entry_with_in(
    tx: &mut Tx,
    document_id: &str,
    content: &str,
) -> Result<Option<(String, String, bool)>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT id, owner, derived FROM memory_entry WHERE document_id = $1 AND content = $2 ORDER BY created_revision DESC LIMIT 1")
        .bind(document_id).bind(content).fetch_optional(conn).await
    })?)
}

statement_in! {
    /// Copies the supporting experiences of entry `from` onto entry `to`.
    copy_support_in(from: &str, to: &str)
        => "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) \
           SELECT $2, experience_id, experience_kind FROM memory_provenance \
           WHERE entry_id = $1 \
           ON CONFLICT DO NOTHING";
}

/// Records `evidence` as support of `entry_id`.
pub async fn support_in(
    tx: &mut Tx,
    entry_id: &str,
    evidence: &[String],
) -> Result<(), StoreError> {
    for experience_id in evidence {
        crate::db::execute_in(
            tx,
            "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) \
                 SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING",
            &[entry_id.into(), experience_id.into()],
        )
        .await?;
    }
    Ok(())
}

/// Remembers that `content` left the document on purpose (`forgotten`, `undone`, `rejected`)
/// so automatic writes do not bring it back.
pub async fn remember_forgotten_in(
    tx: &mut Tx,
    document_id: &str,
    content: &str,
    reason: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_forgotten_text (document_id, content_digest, reason, at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        &[document_id.into(), (&sha256(content)).into(), reason.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Whether `content` left the document on purpose (see [`remember_forgotten_in`]).
pub async fn is_forgotten_in(
    tx: &mut Tx,
    document_id: &str,
    content: &str,
) -> Result<bool, StoreError> {
    let forgotten: Option<i64> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT CAST(1 AS BIGINT) FROM memory_forgotten_text WHERE document_id = $1 AND content_digest = $2")
        .bind(document_id).bind(sha256(content)).fetch_optional(conn).await
    })?;
    Ok(forgotten.is_some())
}

statement_in! {
    /// Settles a candidate as applied at `revision` with its consolidation (JSON).
    record_applied_in(candidate_id: &str, revision: i64, consolidation: Option<&str>, now: i64)
        => "UPDATE memory_candidate SET state = 'applied', applied_revision = $2, \
           consolidation = $3, updated_at = $4 \
           WHERE id = $1";

    /// Settles a candidate whose write changed nothing as applied at the unchanged `revision`,
    /// saying why in `detail`.
    record_unchanged_in(
        candidate_id: &str,
        revision: i64,
        detail: &str,
        consolidation: Option<&str>,
        now: i64,
    )
        => "UPDATE memory_candidate SET state = 'applied', applied_revision = $2, \
           detail = $3, \
           consolidation = $4, updated_at = $5 \
           WHERE id = $1";

    record_undone_in(candidate_id: &str, revision: i64, now: i64)
        => "UPDATE memory_candidate SET state = 'undone', undone_revision = $2, updated_at = $3 \
           WHERE id = $1";
}

/// A proposed change as journaled: `pending` until the promotion policy or a review applies it.
pub struct NewCandidate<'a> {
    pub id: &'a str,
    pub document_id: &'a str,
    pub project_id: Option<&'a str>,
    pub target: Scope,
    pub action: &'a str,
    pub content: Option<&'a str>,
    pub old_text: Option<&'a str>,
    pub reason: &'a str,
    pub confidence: f64,
    pub origin: &'a str,
    pub base_revision: i64,
    /// The entries before and after, as JSON arrays.
    pub before_entries: &'a str,
    pub after_entries: &'a str,
    pub job_id: Option<&'a str>,
    pub consolidation: Option<&'a str>,
}

/// Journals a candidate and the experiences cited as its evidence.
pub async fn insert_candidate_in(
    tx: &mut Tx,
    candidate: &NewCandidate<'_>,
    evidence: &[String],
    now: i64,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO memory_candidate (id, document_id, project_id, target, action, content, old_text, reason, confidence, \
                 origin, state, base_revision, before_entries, after_entries, job_id, created_at, updated_at, consolidation) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14, $15, $15, $16)";
    crate::db::execute_in(
        tx,
        sql,
        &[
            candidate.id.into(),
            candidate.document_id.into(),
            candidate.project_id.into(),
            candidate.target.as_str().into(),
            candidate.action.into(),
            candidate.content.into(),
            candidate.old_text.into(),
            candidate.reason.into(),
            candidate.confidence.into(),
            candidate.origin.into(),
            candidate.base_revision.into(),
            candidate.before_entries.into(),
            candidate.after_entries.into(),
            candidate.job_id.into(),
            now.into(),
            candidate.consolidation.into(),
        ],
    )
    .await?;
    for experience_id in evidence {
        crate::db::execute_in(
            tx,
            "INSERT INTO memory_candidate_evidence (candidate_id, experience_id, experience_kind) \
                 SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING",
            &[candidate.id.into(), experience_id.into()],
        )
        .await?;
    }
    Ok(())
}

/// The experiences a candidate cites.
pub async fn candidate_evidence_in(
    tx: &mut Tx,
    candidate_id: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT experience_id FROM memory_candidate_evidence WHERE candidate_id = $1"
    )
    .bind(candidate_id)
    .fetch_all(conn)
    .await)?)
}

statement_in! {
    /// Marks a candidate `stale`: the document moved past the revision it was planned against.
    mark_stale_in(candidate_id: &str, detail: &str, now: i64)
        => "UPDATE memory_candidate SET state = 'stale', \
           detail = $2, updated_at = $3 \
           WHERE id = $1";

    /// Records the content a reviewer edited on approval.
    record_edit_in(candidate_id: &str, content: Option<&str>)
        => "UPDATE memory_candidate SET content = $2, detail = 'edited on approval' WHERE id = $1";

    /// Replaces a candidate's planned `after` entries (JSON array), re-planned at approval.
    set_after_entries_in(candidate_id: &str, after: &str)
        => "UPDATE memory_candidate SET after_entries = $2 WHERE id = $1";

    record_rejected_in(candidate_id: &str, now: i64)
        => "UPDATE memory_candidate SET state = 'rejected', updated_at = $2 WHERE id = $1";
}

// Maintenance reads and writes: the maintenance job's watermark and its stale-plan check.

/// The maintenance watermark of `project_id`: the `seq` of the newest input a completed
/// maintenance job has considered (0: none yet). `seq` follows commit order, so every input
/// past it is new whatever the writing host's clock said.
pub async fn maintenance_watermark_in(tx: &mut Tx, project_id: &str) -> Result<i64, StoreError> {
    let sql = "SELECT watermark_seq FROM memory_maintenance WHERE project_id = $1";
    let mark: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(sql)
        .bind(project_id)
        .fetch_optional(conn)
        .await)?;
    Ok(mark.unwrap_or(0))
}

/// Moves the maintenance watermark of `project_id` forward to `(seq, experience_id)` in the
/// caller's transaction (the job's settlement, so it advances only with the plan it belongs
/// to); never back, so a job that planned from fewer inputs and settles later keeps the mark.
pub async fn advance_maintenance_watermark_in(
    tx: &mut Tx,
    project_id: &str,
    (seq, experience_id): (i64, &str),
    now: i64,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO memory_maintenance (project_id, watermark_seq, watermark_id, updated_at) VALUES ($1, $2, $3, $4) \
               ON CONFLICT (project_id) DO UPDATE SET \
                 watermark_seq = CASE WHEN excluded.watermark_seq > memory_maintenance.watermark_seq \
                   THEN excluded.watermark_seq ELSE memory_maintenance.watermark_seq END, \
                 watermark_id = CASE WHEN excluded.watermark_seq > memory_maintenance.watermark_seq \
                   THEN excluded.watermark_id ELSE memory_maintenance.watermark_id END, \
                 updated_at = excluded.updated_at";
    crate::db::execute_in(
        tx,
        sql,
        &[
            project_id.into(),
            seq.into(),
            experience_id.into(),
            now.into(),
        ],
    )
    .await?;
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

// ---------------------------------------------------------------------------------------------
// Stale entries (maintenance withholds them; a person may restore one)
// ---------------------------------------------------------------------------------------------

/// A derived entry maintenance may withhold as stale, with what it rests on.
#[derive(Debug, Clone)]
pub struct StaleCandidate {
    pub entry: Entry,
    /// The newest of: the entry's creation, a supporting experience's creation or last use.
    pub last_active_at: i64,
    pub evidence: Vec<String>,
}

/// The current derived, automatic entries of a document (a person's and imported entries are
/// never withheld automatically) with their last activity and evidence.
pub async fn stale_candidates_in(
    tx: &mut Tx,
    document_id: &str,
) -> Result<Vec<StaleCandidate>, StoreError> {
    type Row = (
        String,
        String,
        i64,
        i64,
        i64,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let sql = "SELECT m.id, m.content, m.position, m.created_revision, m.created_at, \
                 p.experience_id, x.created_at, x.last_used_at \
               FROM memory_entry m \
               LEFT JOIN memory_provenance p ON p.entry_id = m.id \
               LEFT JOIN experience_record x ON x.id = p.experience_id \
               WHERE m.document_id = $1 AND m.retracted_revision IS NULL \
                 AND m.derived = TRUE AND m.owner = 'automatic' \
               ORDER BY m.position, m.id, p.experience_id";
    let rows: Vec<Row> = crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(document_id)
        .fetch_all(conn)
        .await)?;
    let mut found: Vec<StaleCandidate> = Vec::new();
    for (id, content, position, created_revision, created_at, experience, made, used) in rows {
        if found.last().is_none_or(|last| last.entry.id != id) {
            found.push(StaleCandidate {
                entry: Entry {
                    id,
                    content,
                    owner: String::from("automatic"),
                    derived: true,
                    position,
                    created_revision,
                },
                last_active_at: created_at,
                evidence: Vec::new(),
            });
        }
        let current = found.last_mut().expect("pushed above");
        current.last_active_at = current
            .last_active_at
            .max(made.unwrap_or(0))
            .max(used.unwrap_or(0));
        current.evidence.extend(experience);
    }
    Ok(found)
}

/// Why maintenance withheld an entry.
pub struct StaleMark<'a> {
    pub candidate_id: &'a str,
    pub document_id: &'a str,
    pub content: &'a str,
    /// `missing_files` or `unused`.
    pub reason: &'a str,
    pub missing_paths: &'a [String],
}

pub async fn insert_stale_mark_in(
    tx: &mut Tx,
    mark: &StaleMark<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let paths = serde_json::to_string(mark.missing_paths).unwrap_or_else(|_| "[]".into());
    crate::db::execute_in(
        tx,
        "INSERT INTO memory_stale_entry (candidate_id, document_id, content, reason, missing_paths, marked_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            mark.candidate_id.into(),
            mark.document_id.into(),
            mark.content.into(),
            mark.reason.into(),
            (&paths).into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

type MarkedRow = (String, String, String, String, String, i64, Option<String>);

fn marked_stale_of(row: MarkedRow) -> Result<MarkedStale, StoreError> {
    let (candidate_id, scope, content, reason, paths, marked_at, restored_candidate_id) = row;
    Ok(MarkedStale {
        candidate_id,
        scope: Scope::parse(&scope)
            .ok_or_else(|| StoreError::Corrupt(format!("memory_document scope `{scope}`")))?,
        content,
        reason,
        missing_paths: serde_json::from_str(&paths).unwrap_or_default(),
        marked_at,
        restored_candidate_id,
    })
}

const MARKED_COLUMNS: &str = "s.candidate_id, d.scope, s.content, s.reason, s.missing_paths, \
                              s.marked_at, s.restored_candidate_id";

/// The entries withheld as stale from the global document and `project_id`'s, newest first.
pub async fn marked_stale(db: &Db, project_id: &str) -> Result<Vec<MarkedStale>, StoreError> {
    let sql = format!(
        "SELECT {MARKED_COLUMNS} FROM memory_stale_entry s JOIN memory_document d ON d.id = s.document_id \
         WHERE d.scope = 'global' OR d.project_id = $1 ORDER BY s.marked_at DESC, s.candidate_id"
    );
    let rows: Vec<MarkedRow> =
        crate::on_db!(db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .fetch_all(pool)
            .await)?;
    rows.into_iter().map(marked_stale_of).collect()
}

/// One stale mark with its document, by the candidate that withheld the entry.
pub async fn stale_mark_in(
    tx: &mut Tx,
    candidate_id: &str,
) -> Result<Option<(String, MarkedStale)>, StoreError> {
    let sql = format!(
        "SELECT s.document_id, {MARKED_COLUMNS} FROM memory_stale_entry s \
         JOIN memory_document d ON d.id = s.document_id WHERE s.candidate_id = $1"
    );
    type Row = (
        String,
        String,
        String,
        String,
        String,
        String,
        i64,
        Option<String>,
    );
    let row: Option<Row> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(candidate_id)
            .fetch_optional(conn)
            .await)?;
    row.map(|(document_id, a, b, c, d, e, f, g)| {
        marked_stale_of((a, b, c, d, e, f, g)).map(|mark| (document_id, mark))
    })
    .transpose()
}

statement_in! {
    record_stale_restored_in(candidate_id: &str, restored_by: &str)
        => "UPDATE memory_stale_entry SET restored_candidate_id = $2 WHERE candidate_id = $1";
}
