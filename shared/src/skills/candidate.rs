//! Skill candidates: rendering, the exact source identity, companions for read-only Skills, and
//! storage.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::pattern::{Pattern, PatternScope, parse_rules};
use super::{SkillError, SkillService, diff, skill_path};
use crate::db::{StoreError, Tx};
use crate::managed_file::{self, ManagedFileError};

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub id: String,
    pub project_id: String,
    pub pattern_id: Option<String>,
    pub pattern_version: Option<i64>,
    /// For a revocation: the applied candidate it revokes.
    pub revokes_id: Option<String>,
    pub name: String,
    /// `apply` or `revoke`.
    pub operation: String,
    /// The existing Skill this candidate is based on (exact source identity).
    pub source_path: String,
    /// `absent`, `writable` or `read_only`.
    pub source_kind: String,
    /// SHA-256 of the source's exact bytes when it existed.
    pub source_digest: Option<String>,
    /// Where the file is written: the source itself, or a distinctly named companion.
    pub target_path: String,
    /// Whether the source is writable (absent counts as writable).
    pub writable: bool,
    /// True when the source is read-only and the target is a companion.
    pub companion: bool,
    /// The complete proposed SKILL.md (`None` for a revocation: the file is removed).
    pub content: Option<String>,
    pub content_digest: Option<String>,
    pub diff: String,
    pub rules: Vec<String>,
    pub evidence: Vec<String>,
    pub state: SkillCandidateState,
    pub evaluation_state: EvaluationState,
    /// The last apply/undo operation.
    pub operation_id: Option<String>,
    pub detail: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

crate::states::stored_states! {
    /// Where a Skill candidate is in its review and apply/undo life.
    pub enum SkillCandidateState in "skill_candidate"."state" {
        Pending = "pending",
        Evaluating = "evaluating",
        Approved = "approved",
        Rejected = "rejected",
        Stale = "stale",
        Applying = "applying",
        Applied = "applied",
        Undoing = "undoing",
        Undone = "undone",
        Uncertain = "uncertain",
    }
}

crate::states::stored_states! {
    /// The outcome of a Skill candidate's latest offline evaluation.
    pub enum EvaluationState in "skill_candidate"."evaluation_state" {
        None = "none",
        Running = "running",
        Passed = "passed",
        Failed = "failed",
        Expired = "expired",
        Cancelled = "cancelled",
    }
}

#[derive(sqlx::FromRow)]
struct CandidateRow {
    id: String,
    project_id: String,
    pattern_id: Option<String>,
    pattern_version: Option<i64>,
    revokes_id: Option<String>,
    name: String,
    operation: String,
    source_path: String,
    source_kind: String,
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

const CANDIDATE_COLUMNS: &str = "id, project_id, pattern_id, pattern_version, revokes_id, name, operation, source_path, \
    source_kind, source_digest, target_path, writable, companion, content, content_digest, diff, rules, state, \
    evaluation_state, operation_id, detail, created_at, updated_at";

pub async fn candidate_in(tx: &mut Tx, id: &str) -> Result<Option<Candidate>, StoreError> {
    let sql = format!("SELECT {CANDIDATE_COLUMNS} FROM skill_candidate WHERE id = $1");
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
    let evidence: Vec<String> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT experience_id FROM skill_candidate_evidence WHERE candidate_id = $1 ORDER BY experience_id")
        .bind(&row.id).fetch_all(conn).await
    })?;
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

pub async fn latest_for_pattern_in(
    tx: &mut Tx,
    pattern_id: &str,
) -> Result<Option<Candidate>, StoreError> {
    let id: Option<String> = crate::on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT id FROM skill_candidate WHERE pattern_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1")
        .bind(pattern_id).fetch_optional(conn).await
    })?;
    match id {
        Some(id) => candidate_in(tx, &id).await,
        None => Ok(None),
    }
}

/// The project's absolute worktree, if it has one.
pub async fn worktree_in(tx: &mut Tx, project_id: &str) -> Result<Option<PathBuf>, StoreError> {
    let worktree: Option<Option<String>> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT worktree FROM project WHERE id = $1"
    )
    .bind(project_id)
    .fetch_optional(conn)
    .await)?;
    Ok(worktree
        .flatten()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute()))
}

/// Refuses a symbolic link (or a non-directory) at `.agents`, `.agents/skills` and
/// `.agents/skills/<name>` under the worktree, so a managed Skill path can never be redirected
/// outside it. Absent components are fine (they are created by the first apply).
pub fn check_managed_dirs(worktree: &Path, path: &Path) -> Result<(), ManagedFileError> {
    let Ok(relative) = path.strip_prefix(worktree) else {
        return Err(ManagedFileError::NotRegular {
            path: path.to_path_buf(),
        });
    };
    let mut current = worktree.to_path_buf();
    let components: Vec<_> = relative.components().collect();
    for component in &components[..components.len().saturating_sub(1)] {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(ManagedFileError::Symlink { path: current });
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(ManagedFileError::NotRegular { path: current });
            }
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => {
                return Err(ManagedFileError::Io {
                    path: current,
                    reason: error.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// A Skill file as found: its exact content and whether it is read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    pub content: String,
    pub digest: String,
    pub read_only: bool,
}

/// Reads a managed Skill file without following links (`None` when absent).
pub fn read_skill(worktree: &Path, path: &Path) -> Result<Option<SkillFile>, ManagedFileError> {
    check_managed_dirs(worktree, path)?;
    let Some(file) = managed_file::read(path)? else {
        return Ok(None);
    };
    let read_only = std::fs::symlink_metadata(path)
        .map(|m| m.permissions().readonly())
        .unwrap_or(false);
    Ok(Some(SkillFile {
        content: file.content,
        digest: file.digest,
        read_only,
    }))
}

/// Where a candidate for Skill `name` goes: the source itself when it is absent or writable,
/// otherwise a distinctly named companion (`<name>-learned`); built-in or read-only Skills are
/// never overwritten.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub name: String,
    pub source_path: PathBuf,
    pub source: Option<SkillFile>,
    pub target_path: PathBuf,
    pub companion: bool,
}

pub fn resolve_target(worktree: &Path, name: &str) -> Result<Resolved, SkillError> {
    let source_path = skill_path(worktree, name)?;
    let source = read_skill(worktree, &source_path)?;
    if source.as_ref().is_some_and(|s| s.read_only) {
        let mut companion = format!("{}-learned", name.trim_end_matches('-'));
        if companion.len() > super::MAX_NAME_LEN {
            companion = format!(
                "{}-learned",
                &name[..super::MAX_NAME_LEN - 8].trim_end_matches('-')
            );
        }
        let target_path = skill_path(worktree, &companion)?;
        return Ok(Resolved {
            name: companion,
            source_path,
            source,
            target_path,
            companion: true,
        });
    }
    Ok(Resolved {
        name: name.to_owned(),
        target_path: source_path.clone(),
        source_path,
        source,
        companion: false,
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The complete SKILL.md: front matter, the learned rules and the evidence they rest on.
pub fn render(name: &str, concept: &str, rules: &[String], evidence: &[String]) -> String {
    let description: String = one_line(concept)
        .replace("---", "—")
        .chars()
        .take(200)
        .collect();
    let mut out = format!(
        "---\nname: {name}\ndescription: {}\n---\n\n# {}\n\nLearned by Zuno from repeated, verified evidence in this project; reviewed and evaluated before it was applied.\n\n## Rules\n\n",
        serde_json::to_string(&description).unwrap_or_default(),
        description
    );
    for rule in rules {
        out.push_str(&format!("- {}\n", one_line(rule)));
    }
    out.push_str(&format!(
        "\n<!-- zuno evidence: {} -->\n",
        evidence.join(", ")
    ));
    out
}

fn sha(text: &str) -> String {
    managed_file::digest(text.as_bytes())
}

/// Creates the candidate of `pattern` in `project_id` (companion for a read-only source). `None`
/// when the project has no worktree (there is nowhere a Skill could live).
pub async fn create_for_pattern_in(
    service: &SkillService,
    tx: &mut Tx,
    project_id: &str,
    pattern: &Pattern,
    now: i64,
) -> Result<Option<Candidate>, SkillError> {
    let Some(worktree) = worktree_in(tx, project_id).await? else {
        return Ok(None);
    };
    let name = super::slug(&pattern.concept);
    let target = {
        let worktree = worktree.clone();
        tokio::task::spawn_blocking(move || resolve_target(&worktree, &name))
            .await
            .map_err(|e| SkillError::Conflict(e.to_string()))??
    };
    let rules = learned_rules(service, pattern)?;
    let evidence = eligible_evidence_in(tx, &pattern.id).await?;
    if evidence.is_empty() {
        return Ok(None);
    }
    let content = render(&target.name, &pattern.concept, &rules, &evidence);
    let base = if target.companion {
        None
    } else {
        target.source.as_ref().map(|s| s.content.as_str())
    };
    let label = target
        .target_path
        .strip_prefix(&worktree)
        .unwrap_or(&target.target_path)
        .display()
        .to_string();
    let diff = diff::unified(&label, base, Some(&content));
    // A new version supersedes earlier unapplied candidates of the same pattern.
    if PatternScope::parse(&pattern.scope) == Some(PatternScope::Project) {
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'stale', detail = 'superseded by a newer pattern version', updated_at = $2 \
                 WHERE pattern_id = $1 AND operation = 'apply' AND state IN ('pending', 'approved')")
            .bind(&pattern.id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
    }
    let id = crate::ids::new_id("skc");
    let candidate = NewCandidate {
        id: &id,
        project_id,
        pattern,
        target: &target,
        content: &content,
        diff: &diff,
        rules: &rules,
    };
    insert_candidate_in(tx, &candidate, &evidence, now).await?;
    Ok(candidate_in(tx, &id).await?)
}

/// The pattern's rules a Skill may state: each passes the Memory write check, and at most the
/// configured number are kept.
fn learned_rules(service: &SkillService, pattern: &Pattern) -> Result<Vec<String>, SkillError> {
    for rule in &pattern.rules {
        crate::memory::write_check::check_text("rules", rule).map_err(|e| SkillError::Invalid {
            field: "rules",
            reason: e.to_string(),
        })?;
    }
    let max_rules = service.config().learning.skill.max_learned_rules as usize;
    Ok(pattern.rules.iter().take(max_rules).cloned().collect())
}

/// The pattern's eligible evidence: an unresolved issue or forgotten record never supports a
/// Skill.
async fn eligible_evidence_in(tx: &mut Tx, pattern_id: &str) -> Result<Vec<String>, StoreError> {
    let sql = format!(
        "SELECT v.experience_id FROM learning_pattern_evidence v JOIN experience_record e ON e.id = v.experience_id \
         WHERE v.pattern_id = $1 AND {} ORDER BY v.experience_id",
        super::pattern::ELIGIBLE
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(pattern_id)
    .fetch_all(conn)
    .await)?)
}

/// A candidate about to be written.
struct NewCandidate<'a> {
    id: &'a str,
    project_id: &'a str,
    pattern: &'a Pattern,
    target: &'a Resolved,
    content: &'a str,
    diff: &'a str,
    rules: &'a [String],
}

/// Writes a pending candidate and links the experiences it rests on.
async fn insert_candidate_in(
    tx: &mut Tx,
    candidate: &NewCandidate<'_>,
    evidence: &[String],
    now: i64,
) -> Result<(), StoreError> {
    let NewCandidate {
        id,
        project_id,
        pattern,
        target,
        content,
        diff,
        rules,
    } = candidate;
    let source_kind = match &target.source {
        None => "absent",
        Some(s) if s.read_only => "read_only",
        Some(_) => "writable",
    };
    let pattern_version = (PatternScope::parse(&pattern.scope) == Some(PatternScope::Project))
        .then_some(pattern.version);
    crate::on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO skill_candidate (id, project_id, pattern_id, pattern_version, name, operation, source_path, source_kind, \
               source_digest, target_path, writable, companion, content, content_digest, diff, rules, state, evaluation_state, \
               created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 'apply', $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 'pending', 'none', $16, $16)")
        .bind(*id).bind(*project_id).bind(&pattern.id).bind(pattern_version).bind(&target.name)
        .bind(target.source_path.display().to_string()).bind(source_kind)
        .bind(target.source.as_ref().map(|s| s.digest.clone()))
        .bind(target.target_path.display().to_string()).bind(source_kind != "read_only")
        .bind(target.companion)
        .bind(*content).bind(sha(content)).bind(*diff)
        .bind(serde_json::to_string(rules).unwrap_or_default())
        .bind(now).execute(conn).await.map(|d| d.rows_affected())
    })?;
    for experience_id in evidence {
        crate::on_tx!(tx, |conn| sqlx::query(
            "INSERT INTO skill_candidate_evidence (candidate_id, experience_id, experience_kind) \
                 SELECT $1, id, kind FROM experience_record WHERE id = $2 ON CONFLICT DO NOTHING"
        )
        .bind(*id)
        .bind(experience_id)
        .execute(conn)
        .await
        .map(|d| d.rows_affected()))?;
    }
    Ok(())
}

/// Applied candidates of `project_id` whose evidence disappeared (no eligible experience left)
/// and that have no open or settled revocation yet: what the next check proposes to revoke.
pub async fn orphaned_applied_in(tx: &mut Tx, project_id: &str) -> Result<Vec<String>, StoreError> {
    let sql = format!(
        "SELECT c.id FROM skill_candidate c WHERE c.project_id = $1 AND c.state = 'applied' AND c.operation = 'apply' \
           AND NOT EXISTS (SELECT 1 FROM skill_candidate_evidence v JOIN experience_record e ON e.id = v.experience_id \
                           WHERE v.candidate_id = c.id AND {}) \
           AND NOT EXISTS (SELECT 1 FROM skill_candidate r WHERE r.revokes_id = c.id AND r.state NOT IN ('rejected', 'stale'))",
        super::pattern::ELIGIBLE
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        sqlx::AssertSqlSafe(sql.as_str())
    )
    .bind(project_id)
    .fetch_all(conn)
    .await)?)
}

/// Proposes revoking applied candidates of `project_id` whose evidence disappeared (no eligible
/// experience left). A revocation is itself a reviewed candidate; nothing is removed here.
pub async fn propose_revocations_in(
    tx: &mut Tx,
    project_id: &str,
    now: i64,
) -> Result<Vec<String>, StoreError> {
    let orphaned = orphaned_applied_in(tx, project_id).await?;
    let mut created = Vec::new();
    for applied_id in orphaned {
        let Some(applied) = candidate_in(tx, &applied_id).await? else {
            continue;
        };
        let id = crate::ids::new_id("skc");
        // The same worktree-relative label as the apply diff (`.agents/skills/<name>/SKILL.md`).
        let target = PathBuf::from(&applied.target_path);
        let label = match worktree_in(tx, project_id).await? {
            Some(worktree) => target
                .strip_prefix(&worktree)
                .unwrap_or(&target)
                .display()
                .to_string(),
            None => applied.target_path.clone(),
        };
        let diff = diff::unified(&label, applied.content.as_deref(), None);
        crate::on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO skill_candidate (id, project_id, pattern_id, revokes_id, name, operation, source_path, source_kind, \
                   source_digest, target_path, writable, companion, content, content_digest, diff, rules, state, evaluation_state, \
                   detail, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, 'revoke', $6, 'writable', $7, $6, TRUE, $8, NULL, NULL, $9, $10, 'pending', 'none', \
                   'the evidence of the applied Skill disappeared', $11, $11)")
            .bind(&id).bind(project_id).bind(&applied.pattern_id).bind(&applied.id)
            .bind(&applied.name)
            .bind(&applied.target_path).bind(&applied.content_digest).bind(applied.companion)
            .bind(&diff)
            .bind(serde_json::to_string(&applied.rules).unwrap_or_default()).bind(now)
            .execute(conn).await.map(|d| d.rows_affected())
        })?;
        created.push(id);
    }
    Ok(created)
}

impl SkillService {
    pub async fn candidate(&self, id: &str) -> Result<Candidate, SkillError> {
        let mut tx = self.db.begin_read().await?;
        let candidate = candidate_in(&mut tx, id).await?;
        tx.rollback().await?;
        candidate
            .ok_or_else(|| SkillError::NotFound(format!("skill candidate `{id}` was not found")))
    }

    /// A project's candidates, newest first, optionally in one state.
    pub async fn candidates(
        &self,
        project_id: &str,
        state: Option<&str>,
    ) -> Result<Vec<Candidate>, SkillError> {
        let mut tx = self.db.begin_read().await?;
        let ids: Vec<String> = crate::on_tx!(&mut tx, |conn| {
            sqlx::query_scalar(
                "SELECT id FROM skill_candidate WHERE project_id = $1 AND ($2 IS NULL OR state = $2) ORDER BY created_at DESC, id DESC")
            .bind(project_id).bind(state).fetch_all(conn).await
        })?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(candidate) = candidate_in(&mut tx, &id).await? {
                out.push(candidate);
            }
        }
        tx.rollback().await?;
        Ok(out)
    }

    /// `skill-reject`: a candidate that was not applied is rejected (an evaluation in flight can
    /// no longer settle it: its ownership token is cleared).
    pub async fn reject(&self, id: &str) -> Result<Candidate, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let updated = crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE skill_candidate SET state = 'rejected', review_token = NULL, \
                   evaluation_state = CASE WHEN evaluation_state = 'running' THEN 'cancelled' ELSE evaluation_state END, \
                   updated_at = $2 WHERE id = $1 AND state IN ('pending', 'evaluating', 'approved', 'stale')")
            .bind(id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        if updated == 0 {
            let candidate = candidate_in(&mut tx, id).await?;
            return Err(match candidate {
                None => SkillError::NotFound(format!("skill candidate `{id}` was not found")),
                Some(c) => SkillError::Conflict(format!(
                    "skill candidate `{id}` is `{}`; only candidates that were not applied can be rejected",
                    c.state
                )),
            });
        }
        crate::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "UPDATE evaluation_run SET state = 'cancelled', diagnostic = 'the candidate was rejected during evaluation', \
                   finished_at = $2 WHERE candidate_id = $1 AND state = 'running'")
            .bind(id).bind(now).execute(conn).await.map(|d| d.rows_affected())
        })?;
        let candidate = candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(candidate)
    }
}
