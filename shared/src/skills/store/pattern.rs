//! Patterns and their evidence.

use super::{parse_rules, rules_json};
use crate::db::{StoreError, Tx};
use crate::skills::pattern::{
    NewPattern, Pattern, PatternOrigin, PatternScope, PatternState, evidence_digest,
};

#[derive(sqlx::FromRow)]
struct PatternRow {
    id: String,
    #[sqlx(try_from = "String")]
    scope: PatternScope,
    project_id: Option<String>,
    concept: String,
    rules: String,
    #[sqlx(try_from = "String")]
    origin: PatternOrigin,
    #[sqlx(try_from = "String")]
    state: PatternState,
    version: i64,
    evidence_digest: String,
    evidence_count: i64,
    session_count: i64,
    project_count: i64,
    rejected_version: Option<i64>,
    rejected_digest: Option<String>,
    created_at: i64,
    updated_at: i64,
}

const COLUMNS: &str = "id, scope, project_id, concept, rules, origin, state, version, \
    evidence_digest, evidence_count, session_count, project_count, rejected_version, \
    rejected_digest, created_at, updated_at";

/// A pattern's evidence as counted: its identity and independent support.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceTally {
    pub digest: String,
    pub count: i64,
    pub sessions: i64,
    pub projects: i64,
}

/// The next version of a pattern: new rules (and concept), a state, and its recounted evidence.
#[derive(Debug, Clone, Copy)]
pub struct NextVersion<'a> {
    pub id: &'a str,
    /// `None` keeps the concept.
    pub concept: Option<&'a str>,
    pub rules: &'a [String],
    pub state: PatternState,
    pub tally: &'a EvidenceTally,
    pub job_id: Option<&'a str>,
}

async fn hydrate_in(tx: &mut Tx, row: PatternRow) -> Result<Pattern, StoreError> {
    let experience_ids = evidence_ids_in(tx, &row.id).await?;
    Ok(Pattern {
        rules: parse_rules(&row.rules)?,
        id: row.id,
        scope: row.scope,
        project_id: row.project_id,
        concept: row.concept,
        origin: row.origin,
        state: row.state,
        version: row.version,
        evidence_digest: row.evidence_digest,
        evidence_count: row.evidence_count,
        session_count: row.session_count,
        project_count: row.project_count,
        rejected_version: row.rejected_version,
        rejected_digest: row.rejected_digest,
        experience_ids,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

async fn hydrate_all_in(tx: &mut Tx, rows: Vec<PatternRow>) -> Result<Vec<Pattern>, StoreError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(hydrate_in(tx, row).await?);
    }
    Ok(out)
}

pub async fn evidence_ids_in(tx: &mut Tx, pattern_id: &str) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT experience_id FROM learning_pattern_evidence WHERE pattern_id = $1 \
         ORDER BY experience_id"
    )
    .bind(pattern_id)
    .fetch_all(conn)
    .await)?)
}

pub async fn get_in(tx: &mut Tx, id: &str) -> Result<Option<Pattern>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM learning_pattern WHERE id = $1");
    let row: Option<PatternRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(id)
            .fetch_optional(conn)
            .await)?;
    match row {
        Some(row) => Ok(Some(hydrate_in(tx, row).await?)),
        None => Ok(None),
    }
}

/// Patterns of a project (`Some`) or the global ones (`None`), newest first.
pub async fn of_project_in(
    tx: &mut Tx,
    project_id: Option<&str>,
) -> Result<Vec<Pattern>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM learning_pattern \
         WHERE COALESCE(project_id, '') = COALESCE($1, '') ORDER BY updated_at DESC, id DESC"
    );
    let rows: Vec<PatternRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .fetch_all(conn)
            .await)?;
    hydrate_all_in(tx, rows).await
}

/// Every pattern of `scope` in `state`, by id.
pub async fn in_state_in(
    tx: &mut Tx,
    scope: PatternScope,
    state: PatternState,
) -> Result<Vec<Pattern>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM learning_pattern WHERE scope = $1 AND state = $2 ORDER BY id"
    );
    let rows: Vec<PatternRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(scope.as_str())
            .bind(state.as_str())
            .fetch_all(conn)
            .await)?;
    hydrate_all_in(tx, rows).await
}

/// Links one experience to a pattern (an unresolved issue never becomes evidence).
pub async fn insert_evidence_in(
    tx: &mut Tx,
    pattern_id: &str,
    experience_id: &str,
    source_pattern_id: Option<&str>,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO learning_pattern_evidence \
           (pattern_id, experience_id, experience_kind, project_id, session_id, source_pattern_id) \
         SELECT $1, id, kind, project_id, session_id, $3 FROM experience_record \
         WHERE id = $2 AND kind <> 'unresolved_issue' ON CONFLICT DO NOTHING",
        &[
            pattern_id.into(),
            experience_id.into(),
            source_pattern_id.into(),
        ],
    )
    .await?;
    Ok(())
}

pub async fn delete_evidence_in(tx: &mut Tx, pattern_id: &str) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "DELETE FROM learning_pattern_evidence WHERE pattern_id = $1",
        &[pattern_id.into()],
    )
    .await?;
    Ok(())
}

/// Counts a pattern's evidence: digest, size and independent sessions and projects.
pub async fn tally_in(tx: &mut Tx, pattern_id: &str) -> Result<EvidenceTally, StoreError> {
    let ids = evidence_ids_in(tx, pattern_id).await?;
    let (sessions, projects): (i64, i64) = crate::on_tx!(tx, |conn| sqlx::query_as(
        "SELECT COUNT(DISTINCT session_id), COUNT(DISTINCT project_id) \
         FROM learning_pattern_evidence WHERE pattern_id = $1"
    )
    .bind(pattern_id)
    .fetch_one(conn)
    .await)?;
    Ok(EvidenceTally {
        digest: evidence_digest(&ids),
        count: ids.len() as i64,
        sessions,
        projects,
    })
}

/// Creates a pattern with its evidence (the caller checked the evidence is eligible).
pub async fn create_in(
    tx: &mut Tx,
    pattern: NewPattern<'_>,
    now: i64,
) -> Result<String, StoreError> {
    let id = crate::ids::new_id("pat");
    let ids: Vec<&str> = pattern.evidence.iter().map(|(e, _)| e.as_str()).collect();
    let rules = rules_json(pattern.rules);
    crate::db::execute_in(
        tx,
        "INSERT INTO learning_pattern (id, scope, project_id, concept, rules, origin, state, \
           version, evidence_digest, evidence_count, session_count, project_count, job_id, \
           created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, 1, 0, 0, $9, $10, $10)",
        &[
            (&id).into(),
            pattern.scope.as_str().into(),
            pattern.project_id.into(),
            pattern.concept.into(),
            (&rules).into(),
            pattern.origin.as_str().into(),
            pattern.state.as_str().into(),
            (&evidence_digest(&ids)).into(),
            pattern.job_id.into(),
            now.into(),
        ],
    )
    .await?;
    for (experience_id, source_pattern) in pattern.evidence {
        insert_evidence_in(tx, &id, experience_id, source_pattern.as_deref()).await?;
    }
    let tally = tally_in(tx, &id).await?;
    crate::db::execute_in(
        tx,
        "UPDATE learning_pattern SET evidence_digest = $2, evidence_count = $3, \
           session_count = $4, project_count = $5 WHERE id = $1",
        &[
            (&id).into(),
            (&tally.digest).into(),
            tally.count.into(),
            tally.sessions.into(),
            tally.projects.into(),
        ],
    )
    .await?;
    Ok(id)
}

/// Moves a pattern to its next version.
pub async fn next_version_in(
    tx: &mut Tx,
    next: &NextVersion<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let rules = rules_json(next.rules);
    crate::db::execute_in(
        tx,
        "UPDATE learning_pattern SET concept = COALESCE($2, concept), rules = $3, state = $4, \
           version = version + 1, evidence_digest = $5, evidence_count = $6, session_count = $7, \
           project_count = $8, job_id = $9, updated_at = $10 WHERE id = $1",
        &[
            next.id.into(),
            next.concept.into(),
            (&rules).into(),
            next.state.as_str().into(),
            (&next.tally.digest).into(),
            next.tally.count.into(),
            next.tally.sessions.into(),
            next.tally.projects.into(),
            next.job_id.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// The most recently updated pattern of `scope` (and, for a project pattern, of `project_id`)
/// whose evidence includes `experience_id`.
pub async fn sharing_evidence_in(
    tx: &mut Tx,
    scope: PatternScope,
    project_id: Option<&str>,
    experience_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT p.id FROM learning_pattern p \
         JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
         WHERE p.scope = $1 AND COALESCE(p.project_id, '') = COALESCE($2, '') \
           AND v.experience_id = $3 ORDER BY p.updated_at DESC LIMIT 1"
    )
    .bind(scope.as_str())
    .bind(project_id)
    .bind(experience_id)
    .fetch_optional(conn)
    .await)?)
}

/// The explicit one-evidence promotion of `experience_id` in `project_id`, if it exists.
pub async fn promotion_of_in(
    tx: &mut Tx,
    project_id: &str,
    experience_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT p.id FROM learning_pattern p \
         JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
         WHERE p.project_id = $1 AND p.origin = $2 AND p.evidence_count = 1 \
           AND v.experience_id = $3"
    )
    .bind(project_id)
    .bind(PatternOrigin::Promote.as_str())
    .bind(experience_id)
    .fetch_optional(conn)
    .await)?)
}

pub async fn set_state_in(
    tx: &mut Tx,
    id: &str,
    state: PatternState,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE learning_pattern SET state = $2, updated_at = $3 WHERE id = $1",
        &[id.into(), state.as_str().into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Rejects a pattern, keeping the version and evidence digest it was rejected at; `false` when
/// there is no such pattern.
pub async fn reject_in(tx: &mut Tx, id: &str, now: i64) -> Result<bool, StoreError> {
    let updated = crate::db::execute_in(
        tx,
        "UPDATE learning_pattern SET state = $2, rejected_version = version, \
           rejected_digest = evidence_digest, updated_at = $3 WHERE id = $1",
        &[
            id.into(),
            PatternState::Rejected.as_str().into(),
            now.into(),
        ],
    )
    .await?;
    Ok(updated == 1)
}

/// Each (pattern, experience) pair of the promoted project patterns, ordered.
pub async fn promoted_evidence_in(tx: &mut Tx) -> Result<Vec<(String, String)>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(
        "SELECT p.id, v.experience_id FROM learning_pattern p \
         JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
         WHERE p.scope = $1 AND p.state = $2 ORDER BY p.id, v.experience_id"
    )
    .bind(PatternScope::Project.as_str())
    .bind(PatternState::Promoted.as_str())
    .fetch_all(conn)
    .await)?)
}
