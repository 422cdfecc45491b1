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
use super::store::pattern::{self as store, EvidenceTally, NextVersion};
use super::{SkillError, SkillService};
use crate::db::{StoreError, Tx};
use crate::learning::experience::store::{self as experience, SeqWindow};
use crate::learning::extraction::ExperienceKind;

pub use super::store::aggregation::{advance_watermark_in, lock_scope_in, watermark_in};
pub use super::store::pattern::{create_in, evidence_ids_in};
/// One experience offered to the miner.
pub use crate::learning::experience::store::MiningInput as Input;

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pattern {
    pub id: String,
    /// `project` or `global`.
    #[schema(value_type = String)]
    pub scope: PatternScope,
    pub project_id: Option<String>,
    /// The semantic concept the model named (untrusted text; never an identity).
    pub concept: String,
    /// At most `learning.skill.max_learned_rules` (15).
    pub rules: Vec<String>,
    /// `mined` or `promote` (an explicit one-evidence promotion).
    #[schema(value_type = String)]
    pub origin: PatternOrigin,
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

pub async fn pattern_in(tx: &mut Tx, id: &str) -> Result<Option<Pattern>, StoreError> {
    store::get_in(tx, id).await
}

/// Patterns of a project (`Some`) or the global ones (`None`), newest first.
pub async fn patterns_in(
    tx: &mut Tx,
    project_id: Option<&str>,
) -> Result<Vec<Pattern>, StoreError> {
    store::of_project_in(tx, project_id).await
}

/// Every promoted project pattern of every project, by id: what global aggregation groups.
pub async fn promoted_project_patterns_in(tx: &mut Tx) -> Result<Vec<Pattern>, StoreError> {
    store::in_state_in(tx, PatternScope::Project, PatternState::Promoted).await
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

/// The scope key of a project's aggregation watermark.
pub fn project_key(project_id: &str) -> String {
    format!("project:{project_id}")
}

/// The scope key of the global aggregation (its serialisation row; it has no watermark).
pub const GLOBAL_KEY: &str = "global";

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
    let newest = experience::newest_seq_in(tx, project_id).await?;
    let horizon = newest.unwrap_or(0).max(watermark);
    let window = SeqWindow {
        project_id,
        after: watermark,
        through: horizon,
    };
    let new_records = experience::active_count_in(tx, window).await?;
    let inputs = experience::evidence_inputs_in(tx, window, limit).await?;
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
        let found =
            store::sharing_evidence_in(tx, PatternScope::Project, Some(project_id), experience_id)
                .await?;
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
        let found =
            store::sharing_evidence_in(tx, PatternScope::Global, None, experience_id).await?;
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
        store::insert_evidence_in(tx, &pattern.id, experience_id, None).await?;
    }
    let tally = store::tally_in(tx, &pattern.id).await?;
    let (state, merge) = match pattern.state {
        PatternState::Rejected => (PatternState::Open, Merge::Reopened),
        PatternState::Promoted if !rules_changed => (PatternState::Promoted, Merge::Updated),
        PatternState::Open | PatternState::Promoted => (PatternState::Open, Merge::Updated),
    };
    let next = NextVersion {
        id: &pattern.id,
        concept: None,
        rules: &new_rules,
        state,
        tally: &tally,
        job_id,
    };
    store::next_version_in(tx, &next, now).await?;
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
    store::delete_evidence_in(tx, &pattern.id).await?;
    for (experience_id, source) in &evidence {
        store::insert_evidence_in(tx, &pattern.id, experience_id, source.as_deref()).await?;
    }
    let tally: EvidenceTally = store::tally_in(tx, &pattern.id).await?;
    let merge = if pattern.state == PatternState::Rejected {
        Merge::Reopened
    } else {
        Merge::Updated
    };
    let next = NextVersion {
        id: &pattern.id,
        concept: Some(concept),
        rules: &rules,
        state: PatternState::Open,
        tally: &tally,
        job_id,
    };
    store::next_version_in(tx, &next, now).await?;
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
    if super::store::candidate::exists_for_version_in(tx, &pattern.id, pattern.version).await? {
        return Ok(None);
    }
    candidate::create_for_pattern_in(service, tx, &project_id, &pattern, now).await
}

/// The experience `experience_id` of `project_id` when it may be pattern evidence.
async fn promotable_in(
    tx: &mut Tx,
    project_id: &str,
    experience_id: &str,
) -> Result<experience::EvidenceFacts, SkillError> {
    let facts = experience::evidence_facts_in(tx, experience_id)
        .await?
        .filter(|facts| facts.project_id == project_id)
        .ok_or_else(|| {
            SkillError::NotFound(format!("experience `{experience_id}` was not found"))
        })?;
    if ExperienceKind::parse(&facts.kind) == Some(ExperienceKind::UnresolvedIssue) {
        return Err(SkillError::Conflict(String::from(
            "an unresolved issue cannot become pattern evidence",
        )));
    }
    if !facts.verified_and_live {
        return Err(SkillError::Conflict(format!(
            "experience `{experience_id}` is not verified, live evidence ({}, {}, source {})",
            facts.verification, facts.status, facts.source_state
        )));
    }
    Ok(facts)
}

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
        let facts = promotable_in(&mut tx, project_id, experience_id).await?;
        let existing = store::promotion_of_in(&mut tx, project_id, experience_id).await?;
        let pattern_id = match existing {
            Some(id) => id,
            None => {
                let rule = facts.resolution.unwrap_or(facts.summary);
                crate::memory::write_check::check_text("rules", &rule).map_err(|e| {
                    SkillError::Invalid {
                        field: "rules",
                        reason: e.to_string(),
                    }
                })?;
                let pattern = NewPattern {
                    scope: PatternScope::Project,
                    project_id: Some(project_id),
                    concept: &facts.title,
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
        let candidate = if pattern.scope == PatternScope::Global {
            let project_id = project_id.ok_or_else(|| SkillError::Invalid {
                field: "projectId",
                reason: String::from(
                    "promoting a global pattern needs the project to receive the companion Skill",
                ),
            })?;
            candidate::create_for_pattern_in(self, &mut tx, project_id, &pattern, now).await?
        } else {
            if pattern.state != PatternState::Promoted {
                store::set_state_in(&mut tx, id, PatternState::Promoted, now).await?;
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
        if !store::reject_in(&mut tx, id, now).await? {
            return Err(SkillError::NotFound(format!(
                "pattern `{id}` was not found"
            )));
        }
        super::store::candidate::reject_unapplied_of_pattern_in(&mut tx, id, now).await?;
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
