//! Patterns: repeated, verified evidence grouped under one rule set.
//!
//! The durable identity of a pattern is its evidence, not the semantic concept a model chose: a
//! group is merged into the pattern of this project it shares evidence with. A rejected pattern
//! keeps the version and evidence digest it was rejected at; the same evidence stays suppressed,
//! additional evidence reopens it. Unchanged rules and evidence preserve a pattern's state and
//! version.

use std::collections::BTreeSet;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::candidate::{self, Candidate};
use super::{SkillError, SkillService};
use crate::db::{StoreError, Tx};

/// Which experiences may be pattern evidence: verified, live, with a current source, and never
/// an unresolved issue (an issue nobody solved teaches no rule).
pub const ELIGIBLE: &str = crate::learning::experience::store::evidence_experience!("e");

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pattern {
    pub id: String,
    /// `project` or `global`.
    pub scope: String,
    pub project_id: Option<String>,
    /// The semantic concept the model named (untrusted text; never an identity).
    pub concept: String,
    /// At most `learning.skill.max_learned_rules` (15).
    pub rules: Vec<String>,
    /// `mined` or `promote` (an explicit one-evidence promotion).
    pub origin: String,
    pub state: PatternState,
    pub version: i64,
    pub evidence_digest: String,
    pub evidence_count: i64,
    /// Independent supporting sessions.
    pub session_count: i64,
    /// Independent supporting projects.
    pub project_count: i64,
    pub rejected_version: Option<i64>,
    pub rejected_digest: Option<String>,
    pub experience_ids: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

crate::states::stored_states! {
    /// Where a mined pattern is: open to evidence, promoted to a Skill candidate, or rejected.
    pub enum PatternState in "learning_pattern"."state" {
        Open = "open",
        Promoted = "promoted",
        Rejected = "rejected",
    }
}

crate::states::stored_states! {
    /// Where a pattern applies: one project's evidence, or promoted patterns across projects.
    pub enum PatternScope in "learning_pattern"."scope" {
        Project = "project",
        Global = "global",
    }
}

crate::states::stored_states! {
    /// How a pattern came to be: mined from evidence, or an explicit one-evidence promotion.
    pub enum PatternOrigin in "learning_pattern"."origin" {
        Mined = "mined",
        Promote = "promote",
    }
}

/// A pattern to create with [`create_in`].
#[derive(Debug, Clone, Copy)]
pub struct NewPattern<'a> {
    pub scope: PatternScope,
    /// The project of a project pattern; `None` for a global one.
    pub project_id: Option<&'a str>,
    pub concept: &'a str,
    pub rules: &'a [String],
    pub origin: PatternOrigin,
    pub state: PatternState,
    /// Each supporting experience and, for a global pattern, the project pattern it came from.
    pub evidence: &'a [(String, Option<String>)],
    /// The job that mined it, if any.
    pub job_id: Option<&'a str>,
}

#[derive(sqlx::FromRow)]
struct PatternRow {
    id: String,
    scope: String,
    project_id: Option<String>,
    concept: String,
    rules: String,
    origin: String,
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

const PATTERN_COLUMNS: &str = "id, scope, project_id, concept, rules, origin, state, version, evidence_digest, \
    evidence_count, session_count, project_count, rejected_version, rejected_digest, created_at, updated_at";

fn rules_json(rules: &[String]) -> String {
    serde_json::to_string(rules).unwrap_or_else(|_| String::from("[]"))
}

pub(crate) fn parse_rules(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("pattern rules: {e}")))
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

pub async fn evidence_ids_in(tx: &mut Tx, pattern_id: &str) -> Result<Vec<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT experience_id FROM learning_pattern_evidence WHERE pattern_id = $1 ORDER BY experience_id")
        .bind(pattern_id).fetch_all(conn).await
    })?)
}

pub async fn pattern_in(tx: &mut Tx, id: &str) -> Result<Option<Pattern>, StoreError> {
    let sql = format!("SELECT {PATTERN_COLUMNS} FROM learning_pattern WHERE id = $1");
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
pub async fn patterns_in(
    tx: &mut Tx,
    project_id: Option<&str>,
) -> Result<Vec<Pattern>, StoreError> {
    let sql = format!(
        "SELECT {PATTERN_COLUMNS} FROM learning_pattern WHERE COALESCE(project_id, '') = COALESCE($1, '') \
         ORDER BY updated_at DESC, id DESC"
    );
    let rows: Vec<PatternRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .fetch_all(conn)
            .await)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(hydrate_in(tx, row).await?);
    }
    Ok(out)
}

/// Every promoted project pattern of every project, by id: what global aggregation groups.
pub async fn promoted_project_patterns_in(tx: &mut Tx) -> Result<Vec<Pattern>, StoreError> {
    let sql = format!(
        "SELECT {PATTERN_COLUMNS} FROM learning_pattern WHERE scope = 'project' AND state = 'promoted' ORDER BY id"
    );
    let rows: Vec<PatternRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_all(conn)
            .await)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(hydrate_in(tx, row).await?);
    }
    Ok(out)
}

/// SHA-256 over the sorted, de-duplicated ids, one per line: the evidence identity.
pub fn evidence_digest<S: AsRef<str>>(ids: &[S]) -> String {
    let set: BTreeSet<&str> = ids.iter().map(AsRef::as_ref).collect();
    let mut hasher = Sha256::new();
    for id in set {
        hasher.update(id.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// One experience offered to the miner.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Input {
    pub id: String,
    /// The project's commit-ordered experience sequence (see [`watermark_in`]).
    pub seq: i64,
    pub kind: String,
    pub session_id: Option<String>,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub created_at: i64,
}

/// The scope key of a project's aggregation watermark.
pub fn project_key(project_id: &str) -> String {
    format!("project:{project_id}")
}

/// The project's watermark: the last experience `seq` a completed aggregation read (0 before
/// the first). `seq` is assigned by the database in commit order per project, so every
/// experience past the watermark is one no aggregation has read, whatever the hosts' clocks say.
pub async fn watermark_in(tx: &mut Tx, key: &str) -> Result<i64, StoreError> {
    let mark: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT watermark_seq FROM learning_aggregation WHERE scope_key = $1"
    )
    .bind(key)
    .fetch_optional(conn)
    .await)?;
    Ok(mark.unwrap_or(0))
}

/// The scope key of the global aggregation (its serialisation row; it has no watermark).
pub const GLOBAL_KEY: &str = "global";

/// Serialises the settlements of one aggregation scope (`project:<id>` or [`GLOBAL_KEY`]):
/// upserts the scope's `learning_aggregation` row, whose lock is held until the caller's
/// transaction ends. Two checks of one scope (a follow-up and the run it follows, or several
/// hosts) may run at once; without this, both could find no pattern for the same evidence under
/// Postgres' read-committed isolation and each create one. Admission of a project check and an
/// aggregation's read of its inputs take the same lock, so evidence committed with an admission
/// that found a job still queued is read by that job. A missing row reads as "no watermark", so
/// the row it inserts changes nothing else. (SQLite's write transactions are already serial.)
pub async fn lock_scope_in(tx: &mut Tx, key: &str, now: i64) -> Result<(), StoreError> {
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO learning_aggregation (scope_key, watermark_seq, updated_at) VALUES ($1, 0, $2) \
             ON CONFLICT (scope_key) DO UPDATE SET updated_at = excluded.updated_at")
        .bind(key).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok(())
}

/// Moves the watermark forward to `seq` (never back: a follow-up that settles first keeps its
/// further mark).
pub async fn advance_watermark_in(
    tx: &mut Tx,
    key: &str,
    seq: i64,
    now: i64,
) -> Result<(), StoreError> {
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO learning_aggregation (scope_key, watermark_seq, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (scope_key) DO UPDATE SET watermark_seq = CASE \
               WHEN excluded.watermark_seq > learning_aggregation.watermark_seq THEN excluded.watermark_seq \
               ELSE learning_aggregation.watermark_seq END, updated_at = excluded.updated_at")
        .bind(key).bind(seq).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok(())
}

/// What one aggregation read of a project's new experiences saw.
#[derive(Debug, Clone, PartialEq)]
pub struct NewInputs {
    /// The newest `seq` of the project when the read began: the read covers exactly the
    /// experiences in `(watermark, horizon]`, so anything committed later waits for the next run.
    pub horizon: i64,
    /// Live experiences in the covered range (any verification).
    pub new_records: i64,
    /// The eligible ones, oldest first, at most the read's limit.
    pub inputs: Vec<Input>,
    limit: i64,
}

impl NewInputs {
    /// Where the watermark moves once these inputs are consumed: after the last grouped input
    /// when the batch was full (the rest of the range waits for the next run), else to the
    /// horizon (the read passed every experience up to it, eligible or not).
    pub fn consumed_through(&self) -> i64 {
        match self.inputs.last() {
            Some(last) if self.inputs.len() as i64 >= self.limit => last.seq,
            _ => self.horizon,
        }
    }
}

/// New project experiences past the watermark up to the project's newest `seq` at the start of
/// the read: how many live ones there are (any verification), and the eligible ones (at most
/// `limit`), oldest first.
pub async fn new_inputs_in(
    tx: &mut Tx,
    project_id: &str,
    limit: i64,
) -> Result<NewInputs, StoreError> {
    let watermark = watermark_in(tx, &project_key(project_id)).await?;
    let newest: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT MAX(seq) FROM experience_record WHERE project_id = $1"
    )
    .bind(project_id)
    .fetch_one(conn)
    .await)?;
    let horizon = newest.unwrap_or(0).max(watermark);
    let new_records: i64 = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_record e WHERE e.project_id = $1 AND e.status = 'active' \
             AND e.seq > $2 AND e.seq <= $3"
    )
    .bind(project_id)
    .bind(watermark)
    .bind(horizon)
    .fetch_one(conn)
    .await
    })?;
    let sql = format!(
        "SELECT e.id, e.seq, e.kind, e.session_id, e.title, e.summary, e.resolution, e.created_at FROM experience_record e \
         WHERE e.project_id = $1 AND {ELIGIBLE} AND e.seq > $2 AND e.seq <= $3 \
         ORDER BY e.seq LIMIT $4"
    );
    let inputs: Vec<Input> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .bind(watermark)
            .bind(horizon)
            .bind(limit)
            .fetch_all(conn)
            .await)?;
    Ok(NewInputs {
        horizon,
        new_records,
        inputs,
        limit,
    })
}

/// A group proposed by the miner (already validated: every cited id is known).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// An existing pattern of the same scope the model placed the group in.
    pub pattern_id: Option<String>,
    pub concept: String,
    pub rules: Vec<String>,
    pub experience_ids: Vec<String>,
}

/// What merging one group did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Merge {
    Created,
    Updated,
    /// A rejected pattern received new evidence and is open for review again.
    Reopened,
    /// Same evidence and rules: state and version preserved.
    Unchanged,
    /// A rejected pattern's evidence came back unchanged.
    Suppressed,
}

fn normalize(rule: &str) -> String {
    rule.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// `existing` then the new rules not already present (compared normalised), capped.
fn union_rules(existing: &[String], new: &[String], cap: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for rule in existing.iter().chain(new) {
        let rule = rule.split_whitespace().collect::<Vec<_>>().join(" ");
        if rule.is_empty() || out.iter().any(|r| normalize(r) == normalize(&rule)) {
            continue;
        }
        out.push(rule);
    }
    out.truncate(cap);
    out
}

async fn insert_evidence_in(
    tx: &mut Tx,
    pattern_id: &str,
    experience_id: &str,
    source_pattern_id: Option<&str>,
) -> Result<(), StoreError> {
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO learning_pattern_evidence (pattern_id, experience_id, experience_kind, project_id, session_id, source_pattern_id) \
             SELECT $1, id, kind, project_id, session_id, $3 FROM experience_record WHERE id = $2 AND kind <> 'unresolved_issue' \
             ON CONFLICT DO NOTHING")
        .bind(pattern_id).bind(experience_id).bind(source_pattern_id).execute(conn)
        .await.map(|d| d.rows_affected())
    })?;
    Ok(())
}

/// Recomputes a pattern's evidence digest and independent session/project counts.
async fn recount_in(tx: &mut Tx, pattern_id: &str) -> Result<(String, i64, i64, i64), StoreError> {
    let ids = evidence_ids_in(tx, pattern_id).await?;
    let (sessions, projects): (i64, i64) = crate::on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT COUNT(DISTINCT session_id), COUNT(DISTINCT project_id) FROM learning_pattern_evidence WHERE pattern_id = $1")
        .bind(pattern_id).fetch_one(conn).await
    })?;
    Ok((evidence_digest(&ids), ids.len() as i64, sessions, projects))
}

/// Creates a pattern with its evidence (the caller checked the evidence is eligible).
pub async fn create_in(
    tx: &mut Tx,
    pattern: NewPattern<'_>,
    now: i64,
) -> Result<String, StoreError> {
    let NewPattern {
        scope,
        project_id,
        concept,
        rules,
        origin,
        state,
        evidence,
        job_id,
    } = pattern;
    let id = crate::ids::new_id("pat");
    let digest = evidence_digest(&evidence.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>());
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO learning_pattern (id, scope, project_id, concept, rules, origin, state, version, evidence_digest, \
               evidence_count, session_count, project_count, job_id, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, 1, 0, 0, $9, $10, $10)")
        .bind(&id).bind(scope.as_str()).bind(project_id).bind(concept).bind(rules_json(rules))
        .bind(origin.as_str()).bind(state.as_str())
        .bind(&digest).bind(job_id).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    for (experience_id, source_pattern) in evidence {
        insert_evidence_in(tx, &id, experience_id, source_pattern.as_deref()).await?;
    }
    let (digest, count, sessions, projects) = recount_in(tx, &id).await?;
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE learning_pattern SET evidence_digest = $2, evidence_count = $3, session_count = $4, project_count = $5 WHERE id = $1")
        .bind(&id).bind(digest).bind(count).bind(sessions).bind(projects).execute(conn)
        .await.map(|d| d.rows_affected())
    })?;
    Ok(id)
}

/// The project pattern a group merges into: the one the model named, if it is this project's;
/// else the most recently updated one sharing evidence with the group.
async fn project_target_in(
    tx: &mut Tx,
    project_id: &str,
    group: &Group,
) -> Result<Option<Pattern>, StoreError> {
    if let Some(id) = &group.pattern_id
        && let Some(pattern) = pattern_in(tx, id).await?
        && pattern.project_id.as_deref() == Some(project_id)
    {
        return Ok(Some(pattern));
    }
    for experience_id in &group.experience_ids {
        let found: Option<String> = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT p.id FROM learning_pattern p JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
                 WHERE p.project_id = $1 AND p.scope = 'project' AND v.experience_id = $2 ORDER BY p.updated_at DESC LIMIT 1")
            .bind(project_id).bind(experience_id).fetch_optional(conn).await
        })?;
        if let Some(id) = found {
            return pattern_in(tx, &id).await;
        }
    }
    Ok(None)
}

/// The experiences of the promoted project patterns `sources`, each once, with the source it
/// came from first.
async fn flattened_evidence_in(
    tx: &mut Tx,
    sources: &[String],
) -> Result<Vec<(String, Option<String>)>, StoreError> {
    let mut evidence: Vec<(String, Option<String>)> = Vec::new();
    for source in sources {
        for experience_id in evidence_ids_in(tx, source).await? {
            if !evidence.iter().any(|(e, _)| e == &experience_id) {
                evidence.push((experience_id, Some(source.clone())));
            }
        }
    }
    Ok(evidence)
}

/// The global pattern sharing evidence with `evidence` (the most recently updated one).
async fn global_sharing_in(
    tx: &mut Tx,
    evidence: &[(String, Option<String>)],
) -> Result<Option<Pattern>, StoreError> {
    for (experience_id, _) in evidence {
        let found: Option<String> = crate::on_tx!(tx, |conn| {
            sqlx::query_scalar(
                "SELECT p.id FROM learning_pattern p JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
                 WHERE p.scope = 'global' AND v.experience_id = $1 ORDER BY p.updated_at DESC LIMIT 1")
            .bind(experience_id).fetch_optional(conn).await
        })?;
        if let Some(id) = found {
            return pattern_in(tx, &id).await;
        }
    }
    Ok(None)
}

/// Merges one validated group into the project's patterns, in the caller's transaction.
pub async fn merge_project_group_in(
    tx: &mut Tx,
    project_id: &str,
    group: &Group,
    max_rules: usize,
    job_id: Option<&str>,
    now: i64,
) -> Result<(Merge, String), StoreError> {
    let target = project_target_in(tx, project_id, group).await?;
    let rules = union_rules(&[], &group.rules, max_rules);
    let Some(pattern) = target else {
        let evidence: Vec<(String, Option<String>)> = group
            .experience_ids
            .iter()
            .map(|id| (id.clone(), None))
            .collect();
        let pattern = NewPattern {
            scope: PatternScope::Project,
            project_id: Some(project_id),
            concept: &group.concept,
            rules: &rules,
            origin: PatternOrigin::Mined,
            state: PatternState::Open,
            evidence: &evidence,
            job_id,
        };
        let id = create_in(tx, pattern, now).await?;
        return Ok((Merge::Created, id));
    };
    let mut union: Vec<String> = pattern.experience_ids.clone();
    union.extend(group.experience_ids.iter().cloned());
    let new_digest = evidence_digest(&union);
    let new_rules = union_rules(&pattern.rules, &rules, max_rules);
    let evidence_changed = new_digest != pattern.evidence_digest;
    let rules_changed = new_rules != pattern.rules;
    if pattern.state == PatternState::Rejected && !evidence_changed {
        return Ok((Merge::Suppressed, pattern.id));
    }
    if !evidence_changed && !rules_changed {
        return Ok((Merge::Unchanged, pattern.id));
    }
    for experience_id in &group.experience_ids {
        insert_evidence_in(tx, &pattern.id, experience_id, None).await?;
    }
    let (digest, count, sessions, projects) = recount_in(tx, &pattern.id).await?;
    let (state, merge) = match pattern.state {
        PatternState::Rejected => (PatternState::Open, Merge::Reopened),
        PatternState::Promoted if !rules_changed => (PatternState::Promoted, Merge::Updated),
        PatternState::Open | PatternState::Promoted => (PatternState::Open, Merge::Updated),
    };
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE learning_pattern SET rules = $2, state = $3, version = version + 1, evidence_digest = $4, evidence_count = $5, \
               session_count = $6, project_count = $7, job_id = $8, updated_at = $9 WHERE id = $1")
        .bind(&pattern.id).bind(rules_json(&new_rules)).bind(state.as_str()).bind(digest)
        .bind(count).bind(sessions).bind(projects)
        .bind(job_id).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok((merge, pattern.id))
}

/// Upserts a global pattern over promoted project patterns (`sources`): its evidence is the
/// flattened set of their experiences. A global pattern sharing evidence with the group is the
/// same pattern: unchanged evidence and rules keep its state and version (a rejected one stays
/// suppressed), anything new moves it to the next version.
pub async fn upsert_global_in(
    tx: &mut Tx,
    concept: &str,
    rules: &[String],
    sources: &[String],
    max_rules: usize,
    job_id: Option<&str>,
    now: i64,
) -> Result<(Merge, String), StoreError> {
    let evidence = flattened_evidence_in(tx, sources).await?;
    let rules = union_rules(&[], rules, max_rules);
    let existing = global_sharing_in(tx, &evidence).await?;
    let Some(pattern) = existing else {
        let pattern = NewPattern {
            scope: PatternScope::Global,
            project_id: None,
            concept,
            rules: &rules,
            origin: PatternOrigin::Mined,
            state: PatternState::Open,
            evidence: &evidence,
            job_id,
        };
        let id = create_in(tx, pattern, now).await?;
        return Ok((Merge::Created, id));
    };
    let digest = evidence_digest(&evidence.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>());
    if digest == pattern.evidence_digest
        && (rules == pattern.rules || pattern.state == PatternState::Rejected)
    {
        let merge = if pattern.state == PatternState::Rejected {
            Merge::Suppressed
        } else {
            Merge::Unchanged
        };
        return Ok((merge, pattern.id));
    }
    crate::on_tx!(tx, |conn| sqlx::query(
        "DELETE FROM learning_pattern_evidence WHERE pattern_id = $1"
    )
    .bind(&pattern.id)
    .execute(conn)
    .await
    .map(|d| d.rows_affected()))?;
    for (experience_id, source) in &evidence {
        insert_evidence_in(tx, &pattern.id, experience_id, source.as_deref()).await?;
    }
    let (digest, count, sessions, projects) = recount_in(tx, &pattern.id).await?;
    let merge = if pattern.state == PatternState::Rejected {
        Merge::Reopened
    } else {
        Merge::Updated
    };
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE learning_pattern SET concept = $2, rules = $3, state = 'open', version = version + 1, evidence_digest = $4, \
               evidence_count = $5, session_count = $6, project_count = $7, job_id = $8, updated_at = $9 WHERE id = $1")
        .bind(&pattern.id).bind(concept).bind(rules_json(&rules)).bind(digest).bind(count)
        .bind(sessions).bind(projects)
        .bind(job_id).bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    Ok((merge, pattern.id))
}

/// Creates the automatic candidate of a project pattern when the gate allows: not rejected, at
/// least `min_independent_sessions` independent sessions (unless `explicit`), and no candidate
/// yet for this pattern version.
pub async fn candidate_gate_in(
    service: &SkillService,
    tx: &mut Tx,
    pattern_id: &str,
    explicit: bool,
    now: i64,
) -> Result<Option<Candidate>, SkillError> {
    let Some(pattern) = pattern_in(tx, pattern_id).await? else {
        return Ok(None);
    };
    let Some(project_id) = pattern.project_id.clone() else {
        return Ok(None);
    };
    let min_sessions = i64::from(service.config().learning.skill.min_independent_sessions);
    if pattern.state == PatternState::Rejected
        || (!explicit && pattern.session_count < min_sessions)
    {
        return Ok(None);
    }
    let exists: Option<String> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT id FROM skill_candidate WHERE pattern_id = $1 AND pattern_version = $2 AND operation = 'apply'")
        .bind(&pattern.id).bind(pattern.version).fetch_optional(conn).await
    })?;
    if exists.is_some() {
        return Ok(None);
    }
    candidate::create_for_pattern_in(service, tx, &project_id, &pattern, now).await
}

/// project, kind, title, summary, resolution, verification, status, source state.
type ExperienceFacts = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    String,
);

/// The result of an explicit promotion.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Promoted {
    pub pattern: Pattern,
    /// The companion candidate (absent for a project without a worktree).
    pub candidate: Option<Candidate>,
}

impl SkillService {
    pub async fn patterns(&self, project_id: Option<&str>) -> Result<Vec<Pattern>, SkillError> {
        let mut tx = self.db.begin_read().await?;
        let patterns = patterns_in(&mut tx, project_id).await?;
        tx.rollback().await?;
        Ok(patterns)
    }

    pub async fn pattern(&self, id: &str) -> Result<Pattern, SkillError> {
        let mut tx = self.db.begin_read().await?;
        let pattern = pattern_in(&mut tx, id).await?;
        tx.rollback().await?;
        pattern.ok_or_else(|| SkillError::NotFound(format!("pattern `{id}` was not found")))
    }

    /// `promote <experience-id>`: a one-evidence project pattern and its companion candidate,
    /// bypassing the automatic evidence-count gate (never review or evaluation). Repeating it
    /// returns the existing pattern.
    pub async fn promote_experience(
        &self,
        project_id: &str,
        experience_id: &str,
    ) -> Result<Promoted, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let row: Option<ExperienceFacts> = crate::on_tx!(&mut tx, |conn| {
            sqlx::query_as(
                "SELECT project_id, kind, title, summary, resolution, verification, status, source_state FROM experience_record WHERE id = $1")
            .bind(experience_id).fetch_optional(conn).await
        })?;
        let Some((owner, kind, title, summary, resolution, verification, status, source_state)) =
            row
        else {
            return Err(SkillError::NotFound(format!(
                "experience `{experience_id}` was not found"
            )));
        };
        if owner != project_id {
            return Err(SkillError::NotFound(format!(
                "experience `{experience_id}` was not found"
            )));
        }
        if kind == "unresolved_issue" {
            return Err(SkillError::Conflict(String::from(
                "an unresolved issue cannot become pattern evidence",
            )));
        }
        if verification != "verified" || status != "active" || source_state != "current" {
            return Err(SkillError::Conflict(format!(
                "experience `{experience_id}` is not verified, live evidence ({verification}, {status}, source {source_state})"
            )));
        }
        let existing: Option<String> = crate::on_tx!(&mut tx, |conn| {
            sqlx::query_scalar(
                "SELECT p.id FROM learning_pattern p JOIN learning_pattern_evidence v ON v.pattern_id = p.id \
                 WHERE p.project_id = $1 AND p.origin = 'promote' AND p.evidence_count = 1 AND v.experience_id = $2")
            .bind(project_id).bind(experience_id).fetch_optional(conn).await
        })?;
        let pattern_id = match existing {
            Some(id) => id,
            None => {
                let rule = resolution.unwrap_or(summary);
                crate::memory::write_check::check_text("rules", &rule).map_err(|e| {
                    SkillError::Invalid {
                        field: "rules",
                        reason: e.to_string(),
                    }
                })?;
                let pattern = NewPattern {
                    scope: PatternScope::Project,
                    project_id: Some(project_id),
                    concept: &title,
                    rules: &[rule],
                    origin: PatternOrigin::Promote,
                    state: PatternState::Promoted,
                    evidence: &[(experience_id.to_owned(), None)],
                    job_id: None,
                };
                create_in(&mut tx, pattern, now).await?
            }
        };
        let mut candidate = candidate_gate_in(self, &mut tx, &pattern_id, true, now).await?;
        if candidate.is_none() {
            candidate = candidate::latest_for_pattern_in(&mut tx, &pattern_id).await?;
        }
        let pattern = pattern_in(&mut tx, &pattern_id)
            .await?
            .expect("created above");
        tx.commit().await?;
        Ok(Promoted { pattern, candidate })
    }

    /// `pattern-promote`: an open (or rejected) project pattern becomes `promoted` and gets its
    /// companion candidate; a global pattern creates a companion candidate in `project_id`, whose
    /// evaluation evidence is the flattened set of the cited project experiences. Promotion
    /// admits a global aggregation check over the promoted evidence.
    pub async fn promote_pattern(
        &self,
        id: &str,
        project_id: Option<&str>,
    ) -> Result<Promoted, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let pattern = pattern_in(&mut tx, id)
            .await?
            .ok_or_else(|| SkillError::NotFound(format!("pattern `{id}` was not found")))?;
        let candidate = if PatternScope::parse(&pattern.scope) == Some(PatternScope::Global) {
            let project_id = project_id.ok_or_else(|| SkillError::Invalid {
                field: "projectId",
                reason: String::from(
                    "promoting a global pattern needs the project to receive the companion Skill",
                ),
            })?;
            candidate::create_for_pattern_in(self, &mut tx, project_id, &pattern, now).await?
        } else {
            if pattern.state != PatternState::Promoted {
                crate::on_tx!(&mut tx, |conn| sqlx::query(
                    "UPDATE learning_pattern SET state = 'promoted', updated_at = $2 WHERE id = $1"
                )
                .bind(id)
                .bind(now)
                .execute(conn)
                .await
                .map(|d| d.rows_affected()))?;
            }
            let created = candidate_gate_in(self, &mut tx, id, true, now).await?;
            match created {
                Some(candidate) => Some(candidate),
                None => candidate::latest_for_pattern_in(&mut tx, id).await?,
            }
        };
        super::schedule::admit_global_check_in(self, &mut tx).await?;
        let pattern = pattern_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(Promoted { pattern, candidate })
    }

    /// `pattern-reject`: stores the evidence version and digest (suppressing the same evidence on
    /// later runs) and rejects the pattern's candidates that were not applied.
    pub async fn reject_pattern(&self, id: &str) -> Result<Pattern, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let updated = crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE learning_pattern SET state = 'rejected', rejected_version = version, rejected_digest = evidence_digest, \
                   updated_at = $2 WHERE id = $1")
            .bind(id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        if updated == 0 {
            return Err(SkillError::NotFound(format!(
                "pattern `{id}` was not found"
            )));
        }
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'rejected', detail = 'its pattern was rejected', updated_at = $2 \
                 WHERE pattern_id = $1 AND state IN ('pending', 'approved', 'stale')")
            .bind(id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        let pattern = pattern_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(pattern)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evidence_digest_ignores_order_and_duplicates() {
        assert_eq!(
            evidence_digest(&["b", "a"]),
            evidence_digest(&["a", "b", "a"])
        );
        assert_ne!(evidence_digest(&["a"]), evidence_digest(&["a", "b"]));
    }

    #[test]
    fn rule_unions_deduplicate_and_cap() {
        let existing = vec![String::from("Use pnpm")];
        let new = vec![String::from("use   PNPM"), String::from("Run lint")];
        assert_eq!(
            union_rules(&existing, &new, 15),
            vec!["Use pnpm", "Run lint"]
        );
        let many: Vec<String> = (0..20).map(|i| format!("rule {i}")).collect();
        assert_eq!(union_rules(&[], &many, 15).len(), 15);
    }
}
