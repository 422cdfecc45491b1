//! Skill candidates and the evidence they rest on.

use super::{parse_rules, rules_json};
use crate::db::{StoreError, Tx};
use crate::skills::candidate::{
    Candidate, CandidateOperation, EvaluationState, SkillCandidateState, SourceKind,
};

#[derive(sqlx::FromRow)]
struct CandidateRow {
    id: String,
    project_id: String,
    pattern_id: Option<String>,
    pattern_version: Option<i64>,
    revokes_id: Option<String>,
    name: String,
    #[sqlx(try_from = "String")]
    operation: CandidateOperation,
    source_path: String,
    #[sqlx(try_from = "String")]
    source_kind: SourceKind,
    source_digest: Option<String>,
    target_path: String,
    writable: bool,
    companion: bool,
    content: Option<String>,
    content_digest: Option<String>,
    diff: String,
    rules: String,
    #[sqlx(try_from = "String")]
    state: SkillCandidateState,
    #[sqlx(try_from = "String")]
    evaluation_state: EvaluationState,
    operation_id: Option<String>,
    detail: Option<String>,
    created_at: i64,
    updated_at: i64,
}

const COLUMNS: &str = "id, project_id, pattern_id, pattern_version, revokes_id, name, \
    operation, source_path, source_kind, source_digest, target_path, writable, companion, \
    content, content_digest, diff, rules, state, evaluation_state, operation_id, detail, \
    created_at, updated_at";

/// A pending candidate to write: an apply of a pattern's Skill or a revocation.
#[derive(Debug, Clone, Copy)]
pub struct CandidateRecord<'a> {
    pub id: &'a str,
    pub project_id: &'a str,
    pub pattern_id: Option<&'a str>,
    pub pattern_version: Option<i64>,
    pub revokes_id: Option<&'a str>,
    pub name: &'a str,
    pub operation: CandidateOperation,
    pub source_path: &'a str,
    pub source_kind: SourceKind,
    pub source_digest: Option<&'a str>,
    pub target_path: &'a str,
    pub companion: bool,
    pub content: Option<&'a str>,
    pub content_digest: Option<&'a str>,
    pub diff: &'a str,
    pub rules: &'a [String],
    pub detail: Option<&'a str>,
}

pub async fn get_in(tx: &mut Tx, id: &str) -> Result<Option<Candidate>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM skill_candidate WHERE id = $1");
    let row: Option<CandidateRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(id)
            .fetch_optional(conn)
            .await)?;
    match row {
        Some(row) => Ok(Some(hydrate_in(tx, row).await?)),
        None => Ok(None),
    }
}

async fn hydrate_in(tx: &mut Tx, row: CandidateRow) -> Result<Candidate, StoreError> {
    let evidence: Vec<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT experience_id FROM skill_candidate_evidence WHERE candidate_id = $1 \
         ORDER BY experience_id"
    )
    .bind(&row.id)
    .fetch_all(conn)
    .await)?;
    Ok(Candidate {
        rules: parse_rules(&row.rules)?,
        evidence,
        id: row.id,
        project_id: row.project_id,
        pattern_id: row.pattern_id,
        pattern_version: row.pattern_version,
        revokes_id: row.revokes_id,
        name: row.name,
        operation: row.operation,
        source_path: row.source_path,
        source_kind: row.source_kind,
        source_digest: row.source_digest,
        target_path: row.target_path,
        writable: row.writable,
        companion: row.companion,
        content: row.content,
        content_digest: row.content_digest,
        diff: row.diff,
        state: row.state,
        evaluation_state: row.evaluation_state,
        operation_id: row.operation_id,
        detail: row.detail,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

/// The newest candidate of a pattern, if any.
pub async fn latest_for_pattern_in(
    tx: &mut Tx,
    pattern_id: &str,
) -> Result<Option<Candidate>, StoreError> {
    let id: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM skill_candidate WHERE pattern_id = $1 \
         ORDER BY created_at DESC, id DESC LIMIT 1"
    )
    .bind(pattern_id)
    .fetch_optional(conn)
    .await)?;
    match id {
        Some(id) => get_in(tx, &id).await,
        None => Ok(None),
    }
}

/// A project's candidate ids, newest first, optionally in one state.
pub async fn ids_of_project_in(
    tx: &mut Tx,
    project_id: &str,
    state: Option<SkillCandidateState>,
) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM skill_candidate WHERE project_id = $1 AND ($2 IS NULL OR state = $2) \
         ORDER BY created_at DESC, id DESC"
    )
    .bind(project_id)
    .bind(state.map(SkillCandidateState::as_str))
    .fetch_all(conn)
    .await)?)
}

/// Whether the apply candidate of this pattern version exists.
pub async fn exists_for_version_in(
    tx: &mut Tx,
    pattern_id: &str,
    version: i64,
) -> Result<bool, StoreError> {
    let found: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM skill_candidate WHERE pattern_id = $1 AND pattern_version = $2 \
         AND operation = $3"
    )
    .bind(pattern_id)
    .bind(version)
    .bind(CandidateOperation::Apply.as_str())
    .fetch_optional(conn)
    .await)?;
    Ok(found.is_some())
}

/// Marks the pattern's unapplied (pending or approved) apply candidates `stale` with `detail`.
pub async fn stale_unapplied_in(
    tx: &mut Tx,
    pattern_id: &str,
    detail: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = 'stale', detail = $2, updated_at = $3 \
         WHERE pattern_id = $1 AND operation = 'apply' AND state IN ('pending', 'approved')",
        &[pattern_id.into(), detail.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Writes a pending candidate (evaluation `none`) and links the experiences it rests on.
pub async fn insert_in(
    tx: &mut Tx,
    candidate: &CandidateRecord<'_>,
    evidence: &[String],
    now: i64,
) -> Result<(), StoreError> {
    let rules = rules_json(candidate.rules);
    crate::db::execute_in(
        tx,
        "INSERT INTO skill_candidate (id, project_id, pattern_id, pattern_version, revokes_id, \
           name, operation, source_path, source_kind, source_digest, target_path, writable, \
           companion, content, content_digest, diff, rules, state, evaluation_state, detail, \
           created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
           'pending', 'none', $18, $19, $19)",
        &[
            candidate.id.into(),
            candidate.project_id.into(),
            candidate.pattern_id.into(),
            candidate.pattern_version.into(),
            candidate.revokes_id.into(),
            candidate.name.into(),
            candidate.operation.as_str().into(),
            candidate.source_path.into(),
            candidate.source_kind.as_str().into(),
            candidate.source_digest.into(),
            candidate.target_path.into(),
            (candidate.source_kind != SourceKind::ReadOnly).into(),
            candidate.companion.into(),
            candidate.content.into(),
            candidate.content_digest.into(),
            candidate.diff.into(),
            (&rules).into(),
            candidate.detail.into(),
            now.into(),
        ],
    )
    .await?;
    for experience_id in evidence {
        crate::db::execute_in(
            tx,
            "INSERT INTO skill_candidate_evidence (candidate_id, experience_id, experience_kind) \
             SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING",
            &[candidate.id.into(), experience_id.into()],
        )
        .await?;
    }
    Ok(())
}

/// The pattern's evidence that is still eligible, by id.
pub async fn eligible_pattern_evidence_in(
    tx: &mut Tx,
    pattern_id: &str,
) -> Result<Vec<String>, StoreError> {
    const SQL: &str = concat!(
        "SELECT v.experience_id FROM learning_pattern_evidence v \
         JOIN experience_record e ON e.id = v.experience_id WHERE v.pattern_id = $1 AND ",
        crate::learning::experience::store::evidence_experience!("e"),
        " ORDER BY v.experience_id"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(SQL)
        .bind(pattern_id)
        .fetch_all(conn)
        .await)?)
}

/// Applied candidates of `project_id` with no eligible evidence left and no open or settled
/// revocation.
pub async fn orphaned_applied_in(tx: &mut Tx, project_id: &str) -> Result<Vec<String>, StoreError> {
    const SQL: &str = concat!(
        "SELECT c.id FROM skill_candidate c WHERE c.project_id = $1 AND c.state = 'applied' \
           AND c.operation = 'apply' \
           AND NOT EXISTS (SELECT 1 FROM skill_candidate_evidence v \
             JOIN experience_record e ON e.id = v.experience_id WHERE v.candidate_id = c.id AND ",
        crate::learning::experience::store::evidence_experience!("e"),
        ") AND NOT EXISTS (SELECT 1 FROM skill_candidate r WHERE r.revokes_id = c.id \
             AND r.state NOT IN ('rejected', 'stale'))"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(SQL)
        .bind(project_id)
        .fetch_all(conn)
        .await)?)
}

/// Rejects a candidate that was not applied (a running evaluation's state becomes
/// `cancelled`); `false` when it is in another state or absent.
pub async fn reject_in(tx: &mut Tx, id: &str, now: i64) -> Result<bool, StoreError> {
    let updated = crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = 'rejected', review_token = NULL, \
           evaluation_state = CASE WHEN evaluation_state = 'running' THEN 'cancelled' \
             ELSE evaluation_state END, \
           updated_at = $2 WHERE id = $1 AND state IN ('pending', 'evaluating', 'approved', 'stale')",
        &[id.into(), now.into()],
    )
    .await?;
    Ok(updated == 1)
}

/// Rejects every candidate of a rejected pattern that was not applied.
pub async fn reject_unapplied_of_pattern_in(
    tx: &mut Tx,
    pattern_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = 'rejected', detail = 'its pattern was rejected', \
           updated_at = $2 WHERE pattern_id = $1 AND state IN ('pending', 'approved', 'stale')",
        &[pattern_id.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// A candidate under review by evaluate job `job_id`: `evaluating`, its evaluation `running`
/// (`review_token` names the job).
pub async fn start_evaluation_in(
    tx: &mut Tx,
    id: &str,
    job_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = 'evaluating', evaluation_state = 'running', \
           review_token = $2, detail = NULL, updated_at = $3 WHERE id = $1",
        &[id.into(), job_id.into(), now.into()],
    )
    .await?;
    Ok(())
}

/// Where an evaluating candidate goes when its run ends.
#[derive(Debug, Clone, Copy)]
pub struct EvaluationEnd<'a> {
    pub state: SkillCandidateState,
    pub evaluation_state: EvaluationState,
    pub detail: &'a str,
}

/// Ends the evaluation of a candidate that is still `evaluating` (the caller holds its review
/// job's lease, or revoked the job).
pub async fn end_evaluation_in(
    tx: &mut Tx,
    id: &str,
    end: EvaluationEnd<'_>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = $2, evaluation_state = $3, review_token = NULL, \
           detail = $4, updated_at = $5 WHERE id = $1 AND state = 'evaluating'",
        &[
            id.into(),
            end.state.as_str().into(),
            end.evaluation_state.as_str().into(),
            end.detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// Moves a candidate from `from` to `to` by compare-and-set, recording `operation_id` when
/// given and `detail` (a state's explanation) when given; `false` when it was not in `from`.
pub async fn compare_and_set_in(
    tx: &mut Tx,
    id: &str,
    from: SkillCandidateState,
    to: SkillCandidateState,
    noted: Noted<'_>,
    now: i64,
) -> Result<bool, StoreError> {
    let moved = crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = $3, operation_id = COALESCE($4, operation_id), \
           detail = COALESCE($5, detail), updated_at = $6 WHERE id = $1 AND state = $2",
        &[
            id.into(),
            from.as_str().into(),
            to.as_str().into(),
            noted.operation_id.into(),
            noted.detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(moved == 1)
}

/// What a state change records beside the state.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noted<'a> {
    pub operation_id: Option<&'a str>,
    pub detail: Option<&'a str>,
}

/// Settles the candidate of operation `operation_id` (still `applying` or `undoing`).
pub async fn settle_operation_in(
    tx: &mut Tx,
    id: &str,
    operation_id: &str,
    state: SkillCandidateState,
    detail: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = $3, detail = $4, updated_at = $5 \
         WHERE id = $1 AND operation_id = $2 AND state IN ('applying', 'undoing')",
        &[
            id.into(),
            operation_id.into(),
            state.as_str().into(),
            detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// Moves the candidate a revocation `revocation_id` revokes from `from` to `to`.
pub async fn move_revoked_in(
    tx: &mut Tx,
    revocation_id: &str,
    from: SkillCandidateState,
    to: SkillCandidateState,
    detail: &str,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE skill_candidate SET state = $3, detail = $4, updated_at = $5 \
         WHERE id = (SELECT revokes_id FROM skill_candidate WHERE id = $1 AND operation = $6) \
           AND state = $2",
        &[
            revocation_id.into(),
            from.as_str().into(),
            to.as_str().into(),
            detail.into(),
            now.into(),
            CandidateOperation::Revoke.as_str().into(),
        ],
    )
    .await?;
    Ok(())
}
