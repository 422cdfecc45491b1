//! The guard store: guards, their states and their audit trail.

use serde::Serialize;

use super::matcher::Matcher;
use crate::db::{Db, StoreError, Tx};

/// A guard as stored and listed.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Guard {
    pub id: String,
    /// `None`: compiled from global Memory; it applies in every project.
    pub project_id: Option<String>,
    pub matcher: Matcher,
    /// What the lesson says to do instead, when it names it.
    pub alternative: Option<String>,
    /// The lesson's text: the reason the hook gives.
    pub reason: String,
    /// The Memory entry it was compiled from.
    pub source_entry_id: Option<String>,
    /// The experiences that entry rests on (the citation).
    pub evidence: Vec<String>,
    /// `rules`, `model` or `user`.
    #[schema(value_type = String)]
    pub origin: GuardOrigin,
    /// `pending`, `active`, `disabled`, `rejected` or `retired` (its lesson left Memory).
    #[schema(value_type = String)]
    pub state: GuardState,
    /// `ask` or `deny`.
    #[schema(value_type = String)]
    pub decision: GuardDecision,
    /// Calls it stopped through a hook.
    pub blocks: i64,
    /// Imported transcripts in which the agent ran what it forbids.
    pub violations: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

crate::states::stored_states! {
    /// Where a guard is: proposed, enforced, switched off by a person, refused by a person, or
    /// retired because its lesson left Memory.
    pub enum GuardState in "guard"."state" {
        Pending = "pending",
        Active = "active",
        Disabled = "disabled",
        Rejected = "rejected",
        Retired = "retired",
    }
}

crate::states::stored_states! {
    /// What proposed a guard: the rule compiler, a model, or a person.
    pub enum GuardOrigin in "guard"."origin" {
        Rules = "rules",
        Model = "model",
        User = "user",
    }
}

crate::states::stored_states! {
    /// What the hook answers for a call a guard matches: ask the person, or refuse the call.
    /// `guards.decision = "deny"` hardens every guard to `deny`.
    #[derive(Default)]
    pub enum GuardDecision in "guard"."decision" {
        #[default]
        Ask = "ask",
        Deny = "deny",
    }
}

impl GuardState {
    /// Whether the guard still stands for its lesson (proposed or enforced).
    pub fn is_live(self) -> bool {
        matches!(self, GuardState::Pending | GuardState::Active)
    }
}

type Row = (
    String,
    Option<String>,
    String,
    Option<String>,
    String,
    Option<String>,
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    i64,
);

const COLUMNS: &str = "id, project_id, matcher, alternative, reason, source_entry_id, evidence, \
                       origin, state, decision, blocks, violations, created_at, updated_at";

fn guard_of(row: Row) -> Result<Guard, StoreError> {
    let (id, project_id, matcher, alternative, reason, source_entry_id, evidence, origin, state) = (
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    );
    Ok(Guard {
        matcher: serde_json::from_str(&matcher)
            .map_err(|e| StoreError::Corrupt(format!("guard `{id}` matcher: {e}")))?,
        id,
        project_id,
        alternative,
        reason,
        source_entry_id,
        evidence: serde_json::from_str(&evidence).unwrap_or_default(),
        origin: GuardOrigin::try_from(origin).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        state: GuardState::try_from(state).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        decision: GuardDecision::try_from(row.9).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        blocks: row.10,
        violations: row.11,
        created_at: row.12,
        updated_at: row.13,
    })
}

/// A guard to propose.
pub struct NewGuard<'a> {
    pub project_id: Option<&'a str>,
    pub matcher: &'a Matcher,
    pub alternative: Option<&'a str>,
    pub reason: &'a str,
    pub source_entry_id: Option<&'a str>,
    pub evidence: &'a [String],
    pub origin: GuardOrigin,
    pub state: GuardState,
    pub decision: GuardDecision,
}

/// Inserts `guard` unless one already guards the same thing in the same scope; returns the new
/// guard's id, or `None` when it existed (whatever its state: a rejected guard is not proposed
/// again).
pub async fn insert_in(
    tx: &mut Tx,
    guard: &NewGuard<'_>,
    now: i64,
) -> Result<Option<String>, StoreError> {
    let id = crate::ids::new_id("grd");
    let matcher = serde_json::to_string(guard.matcher).expect("a matcher serialises");
    let evidence = serde_json::to_string(guard.evidence).expect("ids serialise");
    let inserted = crate::db::execute_in(
        tx,
        "INSERT INTO guard (id, project_id, matcher, matcher_key, alternative, reason, source_entry_id, \
           evidence, origin, state, decision, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12) \
         ON CONFLICT (COALESCE(project_id, ''), matcher_key) DO NOTHING",
        &[
            (&id).into(),
            guard.project_id.into(),
            (&matcher).into(),
            (&guard.matcher.key()).into(),
            guard.alternative.into(),
            guard.reason.into(),
            guard.source_entry_id.into(),
            (&evidence).into(),
            guard.origin.as_str().into(),
            guard.state.as_str().into(),
            guard.decision.as_str().into(),
            now.into(),
        ],
    )
    .await?;
    Ok((inserted == 1).then_some(id))
}

pub async fn event_in(
    tx: &mut Tx,
    guard_id: &str,
    kind: &str,
    session_id: Option<&str>,
    detail: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO guard_event (id, guard_id, kind, session_id, detail, at) VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            (&crate::ids::new_id("gev")).into(),
            guard_id.into(),
            kind.into(),
            session_id.into(),
            detail.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// The guards of `project_id` and the global ones, optionally in one state, newest first.
pub async fn list(
    db: &Db,
    project_id: &str,
    state: Option<GuardState>,
) -> Result<Vec<Guard>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM guard WHERE (project_id = $1 OR project_id IS NULL) \
         AND ($2 IS NULL OR state = $2) ORDER BY created_at DESC, id"
    );
    let rows: Vec<Row> =
        crate::on_db!(db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .bind(state.map(GuardState::as_str))
            .fetch_all(pool)
            .await)?;
    rows.into_iter().map(guard_of).collect()
}

/// The guards in force for `project_id`: its own and the global ones that are `active`.
pub async fn enforced(db: &Db, project_id: &str) -> Result<Vec<Guard>, StoreError> {
    list(db, project_id, Some(GuardState::Active)).await
}

/// The current guards of `project_id` and the global ones, in the caller's transaction.
pub async fn of_project_in(tx: &mut Tx, project_id: &str) -> Result<Vec<Guard>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM guard WHERE project_id = $1 OR project_id IS NULL ORDER BY created_at, id"
    );
    let rows: Vec<Row> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .fetch_all(conn)
            .await)?;
    rows.into_iter().map(guard_of).collect()
}

pub async fn get_in(tx: &mut Tx, id: &str) -> Result<Option<Guard>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM guard WHERE id = $1");
    let row: Option<Row> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(id)
            .fetch_optional(conn)
            .await)?;
    row.map(guard_of).transpose()
}

/// Moves guard `id` from one of `from` to `to`; `false` when it was in none of them.
pub async fn transition_in(
    tx: &mut Tx,
    id: &str,
    from: &[GuardState],
    to: GuardState,
    now: i64,
) -> Result<bool, StoreError> {
    let placeholders: Vec<String> = (0..from.len()).map(|i| format!("${}", i + 4)).collect();
    let sql = format!(
        "UPDATE guard SET state = $2, updated_at = $3 WHERE id = $1 AND state IN ({})",
        placeholders.join(", ")
    );
    let mut args: Vec<crate::db::Arg<'_>> = vec![id.into(), to.as_str().into(), now.into()];
    args.extend(
        from.iter()
            .map(|state| crate::db::Arg::from(state.as_str())),
    );
    Ok(crate::db::execute_in(tx, sqlx::AssertSqlSafe(sql), &args).await? == 1)
}

/// Counts one more stopped call (`blocks`) or broken rule (`violations`) on guard `id`.
pub async fn count_in(tx: &mut Tx, id: &str, violation: bool, now: i64) -> Result<(), StoreError> {
    let sql = if violation {
        "UPDATE guard SET violations = violations + 1, updated_at = $2 WHERE id = $1"
    } else {
        "UPDATE guard SET blocks = blocks + 1, updated_at = $2 WHERE id = $1"
    };
    crate::db::execute_in(tx, sql, &[id.into(), now.into()]).await?;
    Ok(())
}

/// Points the guard of `new`'s scope and matcher at `new`'s entry, reason and evidence; a
/// retired one returns to `pending`. `false` when there is none (or it was rejected or
/// disabled: a person's decision stands).
pub async fn follow_entry_in(
    tx: &mut Tx,
    new: &NewGuard<'_>,
    now: i64,
) -> Result<bool, StoreError> {
    let evidence = serde_json::to_string(new.evidence).expect("ids serialise");
    let changed = crate::db::execute_in(
        tx,
        "UPDATE guard SET source_entry_id = $3, reason = $4, alternative = $5, evidence = $6, \
           state = CASE WHEN state = 'retired' THEN 'pending' ELSE state END, \
           updated_at = CASE WHEN source_entry_id = $3 THEN updated_at ELSE $7 END \
         WHERE COALESCE(project_id, '') = COALESCE($1, '') AND matcher_key = $2 \
           AND state IN ('pending', 'active', 'retired')",
        &[
            new.project_id.into(),
            (&new.matcher.key()).into(),
            new.source_entry_id.into(),
            new.reason.into(),
            new.alternative.into(),
            (&evidence).into(),
            now.into(),
        ],
    )
    .await?;
    if changed > 0 {
        return Ok(true);
    }
    let decided: Option<String> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
        "SELECT id FROM guard WHERE COALESCE(project_id, '') = COALESCE($1, '') AND matcher_key = $2"
    )
    .bind(new.project_id)
    .bind(new.matcher.key())
    .fetch_optional(conn)
    .await
    })?;
    Ok(decided.is_some())
}

/// The project of `session_id` and its worktree.
pub async fn session_project_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<(String, Option<String>)>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| {
        sqlx::query_as(
        "SELECT p.id, p.worktree FROM session s JOIN project p ON p.id = s.project_id WHERE s.id = $1"
    )
    .bind(session_id)
    .fetch_optional(conn)
    .await
    })?)
}

/// How often the experience `experience_id` was recalled and reinforced (`None`: no such
/// experience): what a guard's evidence has been worth in prompts.
pub async fn times_recalled(db: &Db, experience_id: &str) -> Result<Option<i64>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT use_count + reinforcements FROM experience_record WHERE id = $1"
    )
    .bind(experience_id)
    .fetch_optional(pool)
    .await)?)
}
