//! Skill candidates: rendering, the exact source identity, companions for read-only Skills, and
//! storage.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::pattern::{Pattern, PatternScope};
use super::store::candidate::{self as store, CandidateRecord};
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
    #[schema(value_type = String)]
    pub operation: CandidateOperation,
    /// The existing Skill this candidate is based on (exact source identity).
    pub source_path: String,
    /// `absent`, `writable` or `read_only`.
    #[schema(value_type = String)]
    pub source_kind: SourceKind,
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

crate::states::stored_states! {
    /// What applying a candidate does: write its Skill, or revoke an applied one.
    pub enum CandidateOperation in "skill_candidate"."operation" {
        Apply = "apply",
        Revoke = "revoke",
    }
}

crate::states::stored_states! {
    /// What a candidate's source Skill file was when it was proposed.
    pub enum SourceKind in "skill_candidate"."source_kind" {
        Absent = "absent",
        Writable = "writable",
        ReadOnly = "read_only",
    }
}

pub use super::store::candidate::{get_in as candidate_in, latest_for_pattern_in};

/// The project's absolute worktree, if it has one.
pub async fn worktree_in(tx: &mut Tx, project_id: &str) -> Result<Option<PathBuf>, StoreError> {
    let worktree = super::store::aggregation::worktree_in(tx, project_id).await?;
    Ok(worktree.map(PathBuf::from).filter(|p| p.is_absolute()))
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
    // An unresolved issue or forgotten record never supports a Skill.
    let evidence = store::eligible_pattern_evidence_in(tx, &pattern.id).await?;
    if evidence.is_empty() {
        return Ok(None);
    }
    let content = render(&target.name, &pattern.concept, &rules, &evidence);
    let base = if target.companion {
        None
    } else {
        target.source.as_ref().map(|s| s.content.as_str())
    };
    let diff = diff::unified(
        &worktree_label(&worktree, &target.target_path),
        base,
        Some(&content),
    );
    let is_project_pattern = pattern.scope == PatternScope::Project;
    // A new version supersedes earlier unapplied candidates of the same pattern.
    if is_project_pattern {
        let detail = "superseded by a newer pattern version";
        store::stale_unapplied_in(tx, &pattern.id, detail, now).await?;
    }
    let id = crate::ids::new_id("skc");
    let source_kind = match &target.source {
        None => SourceKind::Absent,
        Some(s) if s.read_only => SourceKind::ReadOnly,
        Some(_) => SourceKind::Writable,
    };
    let (source_path, target_path) = (
        target.source_path.display().to_string(),
        target.target_path.display().to_string(),
    );
    let content_digest = sha(&content);
    let record = CandidateRecord {
        id: &id,
        project_id,
        pattern_id: Some(&pattern.id),
        pattern_version: is_project_pattern.then_some(pattern.version),
        revokes_id: None,
        name: &target.name,
        operation: CandidateOperation::Apply,
        source_path: &source_path,
        source_kind,
        source_digest: target.source.as_ref().map(|s| s.digest.as_str()),
        target_path: &target_path,
        companion: target.companion,
        content: Some(&content),
        content_digest: Some(&content_digest),
        diff: &diff,
        rules: &rules,
        detail: None,
    };
    store::insert_in(tx, &record, &evidence, now).await?;
    Ok(candidate_in(tx, &id).await?)
}

/// A Skill path as its diffs label it: relative to the worktree (`.agents/skills/<n>/SKILL.md`).
fn worktree_label(worktree: &Path, path: &Path) -> String {
    path.strip_prefix(worktree)
        .unwrap_or(path)
        .display()
        .to_string()
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

pub use super::store::candidate::orphaned_applied_in;

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
        // The same worktree-relative label as the apply diff.
        let label = match worktree_in(tx, project_id).await? {
            Some(worktree) => worktree_label(&worktree, Path::new(&applied.target_path)),
            None => applied.target_path.clone(),
        };
        let diff = diff::unified(&label, applied.content.as_deref(), None);
        let record = CandidateRecord {
            id: &id,
            project_id,
            pattern_id: applied.pattern_id.as_deref(),
            pattern_version: None,
            revokes_id: Some(&applied.id),
            name: &applied.name,
            operation: CandidateOperation::Revoke,
            source_path: &applied.target_path,
            source_kind: SourceKind::Writable,
            source_digest: applied.content_digest.as_deref(),
            target_path: &applied.target_path,
            companion: applied.companion,
            content: None,
            content_digest: None,
            diff: &diff,
            rules: &applied.rules,
            detail: Some("the evidence of the applied Skill disappeared"),
        };
        store::insert_in(tx, &record, &[], now).await?;
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
        state: Option<SkillCandidateState>,
    ) -> Result<Vec<Candidate>, SkillError> {
        let mut tx = self.db.begin_read().await?;
        let ids = store::ids_of_project_in(&mut tx, project_id, state).await?;
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
    /// no longer settle it: its job is revoked).
    pub async fn reject(&self, id: &str) -> Result<Candidate, SkillError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let updated = store::reject_in(&mut tx, id, now).await?;
        if !updated {
            let candidate = candidate_in(&mut tx, id).await?;
            return Err(match candidate {
                None => SkillError::NotFound(format!("skill candidate `{id}` was not found")),
                Some(c) => SkillError::Conflict(format!(
                    "skill candidate `{id}` is `{}`; only candidates that were not applied can be rejected",
                    c.state
                )),
            });
        }
        let diagnostic = "the candidate was rejected during evaluation";
        self.cancel_review_in(&mut tx, id, diagnostic, now).await?;
        let candidate = candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        Ok(candidate)
    }
}
