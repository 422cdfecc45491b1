//! `ExperienceService` storage: Experience records with their evidence, raw memory hints, manual
//! records, forgetting and solving.

pub(crate) mod store;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::extraction::ExperienceKind;
use super::validate::{CheckedCitation, ValidExperience, ValidatedExtraction};
use crate::db::{Db, StoreError, Tx};
pub(crate) use store::{EXPERIENCE_COLUMNS, ExperienceRow, with_evidence, without_evidence};
use store::{EvidenceSlot, ExtractionJob};
pub use store::{
    any_forgotten_in, embedding_source_in, global_write_backed_in, hints_for_job, hints_of_in,
    maintenance_inputs_in, mark_without_global_write_in, user_backed_in,
};

crate::states::stored_states! {
    /// What recorded an experience: extraction from a turn, an explicit `remember`, or an issue.
    pub enum ExperienceOrigin in "experience_record"."origin" {
        Extraction = "extraction",
        Remember = "remember",
        Issue = "issue",
    }
}

crate::states::stored_states! {
    /// Whether an experience is verified: its citations checked out.
    pub enum Verification in "experience_record"."verification" {
        Verified = "verified",
        Unverified = "unverified",
    }
}

crate::states::stored_states! {
    /// Whether an experience is still recalled (`active`) or a person forgot it.
    pub enum ExperienceStatus in "experience_record"."status" {
        Active = "active",
        Forgotten = "forgotten",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    pub ordinal: i64,
    pub source_id: String,
    pub address: Option<String>,
    pub message_id: Option<String>,
    pub excerpt: String,
    pub raw_digest: Option<String>,
    pub redacted_digest: Option<String>,
    pub verified: bool,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Experience {
    pub id: String,
    pub project_id: String,
    pub session_id: Option<String>,
    pub job_id: Option<String>,
    pub ordinal: Option<i64>,
    #[schema(value_type = String)]
    pub origin: ExperienceOrigin,
    pub extractor_version: Option<String>,
    pub kind: ExperienceKind,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub confidence: f64,
    /// `verified` or `unverified` (an observation whose citations did not check out).
    #[schema(value_type = String)]
    pub verification: Verification,
    /// `active` or `forgotten`.
    #[schema(value_type = String)]
    pub status: ExperienceStatus,
    /// SHA-256 of kind, title, summary and resolution.
    pub content_digest: String,
    pub use_count: i64,
    pub last_used_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub forgotten_at: Option<i64>,
    /// Retrieval keywords: searched with the text, never rendered into prompts.
    pub keywords: Vec<String>,
    pub evidence: Vec<Evidence>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExperienceError {
    #[error("experience `{0}` was not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

pub fn content_digest(
    kind: ExperienceKind,
    title: &str,
    summary: &str,
    resolution: Option<&str>,
) -> String {
    let mut hasher = Sha256::new();
    for part in [kind.as_str(), title, summary, resolution.unwrap_or("")] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// What settlement stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredExtraction {
    /// `(extractor ordinal, experience id)` of every stored experience.
    pub experiences: Vec<(i64, String)>,
    pub verified: usize,
    pub unverified: usize,
    pub hints: usize,
    /// Experiences the session already holds (the same content from an earlier extraction of
    /// the same turn, e.g. before feedback arrived): not stored twice, their hints not repeated.
    pub existing: usize,
    /// `(extractor ordinal, existing experience id)`: lessons that restate an experience the
    /// project already holds (same rule, other words, another session). The new citations joined
    /// the existing experience's evidence and reinforced it; nothing new was stored.
    pub reinforced: Vec<(i64, String)>,
}

/// Pending records a writer indexes in its own transaction (its own and any left behind).
const INDEX_BATCH: i64 = 256;
/// Inserts an extraction's accepted experiences, evidence and hints in the caller's (settlement)
/// transaction, and reinforces the experiences it restates. `(job, ordinal)` is unique, so a
/// resumed attempt stores nothing twice.
pub async fn insert_extraction_in(
    tx: &mut Tx,
    job_id: &str,
    project_id: &str,
    session_id: &str,
    extractor_version: &str,
    validated: &ValidatedExtraction,
    now: i64,
) -> Result<StoredExtraction, StoreError> {
    let (stored, reinforcements) = stage_extraction_in(
        tx,
        job_id,
        project_id,
        session_id,
        extractor_version,
        validated,
        now,
    )
    .await?;
    reinforcements.apply_in(tx).await?;
    Ok(stored)
}

/// Existing experiences an extraction restates, to reinforce with its citations.
#[must_use = "the restatements are recorded only when applied"]
pub struct Reinforcements<'v> {
    job_id: String,
    restatements: Vec<(String, &'v ValidExperience)>,
}

impl Reinforcements<'_> {
    /// Reinforcing locks each existing record's row until commit, and a lesson restated across
    /// sessions makes that row hot: callers apply these as the last writes before settling, so
    /// the lock is held briefly; in id order, so two jobs reinforcing the same two records
    /// cannot deadlock.
    pub async fn apply_in(mut self, tx: &mut Tx) -> Result<(), StoreError> {
        self.restatements.sort_by(|(a, _), (b, _)| a.cmp(b));
        for (existing, experience) in &self.restatements {
            reinforce_in(tx, existing, &self.job_id, &experience.citations).await?;
        }
        Ok(())
    }
}

/// [`insert_extraction_in`] without the reinforcements, which it returns for the caller to
/// apply last in the same transaction.
pub async fn stage_extraction_in<'v>(
    tx: &mut Tx,
    job_id: &str,
    project_id: &str,
    session_id: &str,
    extractor_version: &str,
    validated: &'v ValidatedExtraction,
    now: i64,
) -> Result<(StoredExtraction, Reinforcements<'v>), StoreError> {
    let job = ExtractionJob {
        job_id,
        project_id,
        session_id,
        extractor_version,
    };
    let mut stored = StoredExtraction::default();
    let mut ids = std::collections::HashMap::new();
    let mut restatements: Vec<(String, &ValidExperience)> = Vec::new();
    for experience in &validated.experiences {
        let digest = content_digest(
            experience.kind,
            &experience.title,
            &experience.summary,
            experience.resolution.as_deref(),
        );
        if store::stored_by_another_job_in(tx, session_id, job_id, &digest).await? {
            stored.existing += 1;
            continue;
        }
        if experience.verified
            && let Some(existing) = restated_in(tx, project_id, job_id, &experience.summary).await?
        {
            restatements.push((existing.clone(), experience));
            stored.reinforced.push((experience.ordinal, existing));
            continue;
        }
        // A retry of the same job finds the row it stored before.
        let id = store::insert_extracted_in(tx, &job, experience, &digest, now).await?;
        insert_evidence_in(tx, &id, 0, &experience.citations, None).await?;
        if experience.verified {
            stored.verified += 1;
        } else {
            stored.unverified += 1;
        }
        ids.insert(experience.ordinal, (id.clone(), experience.kind));
        stored.experiences.push((experience.ordinal, id));
    }
    for hint in &validated.hints {
        let Some((experience_id, kind)) = ids.get(&hint.experience_ordinal) else {
            continue;
        };
        store::insert_hint_in(tx, &job, hint, (experience_id.as_str(), *kind), now).await?;
        stored.hints += 1;
    }
    // The new records join the recall index in the transaction that stores them, so recall
    // rarely has to score pending records from their text (records left pending by others are
    // the background drain's, when this stores none).
    if !stored.experiences.is_empty() {
        crate::learning::recall::index::catch_up_in(tx, INDEX_BATCH).await?;
    }
    Ok((
        stored,
        Reinforcements {
            job_id: job_id.to_owned(),
            restatements,
        },
    ))
}

/// How many of the project's most recent experiences a new lesson is compared with.
const RESTATEMENT_WINDOW: i64 = 500;

/// The active experience of `project_id` (from another job) whose summary states the same rule
/// as `summary`, if any.
async fn restated_in(
    tx: &mut Tx,
    project_id: &str,
    job_id: &str,
    summary: &str,
) -> Result<Option<String>, StoreError> {
    let rule = crate::memory::dedupe::RuleSignature::of(summary);
    if rule.is_empty() {
        return Ok(None);
    }
    let recent = store::recent_summaries_in(tx, project_id, job_id, RESTATEMENT_WINDOW).await?;
    Ok(recent
        .into_iter()
        .find(|other| crate::memory::dedupe::RuleSignature::of(&other.summary).same_rule_as(&rule))
        .map(|other| other.id))
}

/// Adds `citations` (of job `job_id`) to `experience_id`'s evidence and counts a reinforcement.
async fn reinforce_in(
    tx: &mut Tx,
    experience_id: &str,
    job_id: &str,
    citations: &[CheckedCitation],
) -> Result<(), StoreError> {
    // The counter's update locks the record's row first: a concurrent reinforcer waits here
    // until this transaction ends, and its next statement then sees the ordinals this one
    // took. Reading the next ordinal before holding the lock let two jobs pick the same one,
    // and the later insert was dropped as a conflict (lost evidence on Postgres).
    super::retrieval::adjust_in(tx, experience_id, super::retrieval::ranking::REINFORCE).await?;
    let slot = EvidenceSlot {
        experience_id,
        ordinal: None,
        job_id: Some(job_id),
    };
    for citation in citations {
        store::insert_evidence_in(tx, &slot, citation).await?;
    }
    Ok(())
}

/// Writes `citations` as evidence rows of `experience_id` from ordinal `first` on; `job_id`
/// names the reinforcing job (none for the experience's own citations).
async fn insert_evidence_in(
    tx: &mut Tx,
    experience_id: &str,
    first: i64,
    citations: &[CheckedCitation],
    job_id: Option<&str>,
) -> Result<(), StoreError> {
    for (index, citation) in citations.iter().enumerate() {
        let slot = EvidenceSlot {
            experience_id,
            ordinal: Some(first + index as i64),
            job_id,
        };
        store::insert_evidence_in(tx, &slot, citation).await?;
    }
    Ok(())
}

/// A manual record (`remember`, `issue`): explicit user evidence, verified by construction.
pub async fn insert_manual_in(
    tx: &mut Tx,
    project_id: &str,
    session_id: Option<&str>,
    origin: ExperienceOrigin,
    text: &str,
    now: i64,
) -> Result<Result<Experience, ExperienceError>, StoreError> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > 4000 {
        return Ok(Err(ExperienceError::Invalid {
            field: "text",
            reason: String::from("must be 1–4000 characters"),
        }));
    }
    if let Some(c) = crate::text::codepoints::unresolvable_codepoint(text) {
        return Ok(Err(ExperienceError::Invalid {
            field: "text",
            reason: format!(
                "contains U+{:04X}, an encoding a model reads differently from a person",
                c as u32
            ),
        }));
    }
    let kind = match origin {
        ExperienceOrigin::Issue => ExperienceKind::UnresolvedIssue,
        ExperienceOrigin::Remember | ExperienceOrigin::Extraction => ExperienceKind::Feedback,
    };
    let title: String = text
        .lines()
        .next()
        .unwrap_or(text)
        .chars()
        .take(80)
        .collect();
    let id = crate::ids::new_id("exp");
    let digest = content_digest(kind, &title, text, None);
    let record = store::ManualRecord {
        id: &id,
        project_id,
        session_id,
        origin,
        kind,
        title: &title,
        text,
        digest: &digest,
    };
    store::insert_manual_in(tx, &record, now).await?;
    crate::learning::recall::index::catch_up_in(tx, INDEX_BATCH).await?;
    Ok(Ok(get_in(tx, &id).await?.expect("inserted above")))
}

/// Experience `id` with its evidence, in the caller's transaction.
pub async fn get_in(tx: &mut Tx, id: &str) -> Result<Option<Experience>, StoreError> {
    store::experience_in(tx, id).await
}

pub async fn get(db: &Db, id: &str) -> Result<Option<Experience>, StoreError> {
    let mut tx = db.begin_read().await?;
    let experience = get_in(&mut tx, id).await;
    tx.rollback().await?;
    experience
}

/// Page of a project's experiences, newest first (`/learn list [offset]`, 100 per page).
pub async fn list(
    db: &Db,
    project_id: &str,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Experience>, i64), StoreError> {
    store::page(db, project_id, offset, limit).await
}

/// Experiences an extraction job stored (or a session produced).
pub async fn for_session(db: &Db, session_id: &str) -> Result<Vec<Experience>, StoreError> {
    store::of_session(db, session_id).await
}

/// `forget`: marks the experience forgotten and records its cited sources so unchanged evidence
/// can never resurrect it.
pub async fn forget_in(
    tx: &mut Tx,
    id: &str,
    now: i64,
) -> Result<Result<Experience, ExperienceError>, StoreError> {
    let Some(experience) = get_in(tx, id).await? else {
        return Ok(Err(ExperienceError::NotFound(id.to_owned())));
    };
    if experience.status == ExperienceStatus::Forgotten {
        return Ok(Ok(experience));
    }
    store::set_forgotten_in(tx, id, now).await?;
    store::remember_forgotten_sources_in(tx, &experience, now).await?;
    Ok(Ok(get_in(tx, id).await?.expect("exists")))
}

/// `solved`: an unresolved issue gains its resolution and becomes a solved problem.
pub async fn solve_in(
    tx: &mut Tx,
    id: &str,
    resolution: &str,
    now: i64,
) -> Result<Result<Experience, ExperienceError>, StoreError> {
    let resolution = resolution.trim();
    if resolution.is_empty()
        || resolution.chars().count() > 4000
        || crate::text::codepoints::unresolvable_codepoint(resolution).is_some()
    {
        return Ok(Err(ExperienceError::Invalid {
            field: "resolution",
            reason: String::from("must be 1–4000 characters of plain text"),
        }));
    }
    let Some(experience) = get_in(tx, id).await? else {
        return Ok(Err(ExperienceError::NotFound(id.to_owned())));
    };
    if experience.kind != ExperienceKind::UnresolvedIssue {
        return Ok(Err(ExperienceError::Conflict(format!(
            "experience `{id}` is a {}, not an unresolved issue",
            experience.kind.as_str()
        ))));
    }
    let digest = content_digest(
        ExperienceKind::Problem,
        &experience.title,
        &experience.summary,
        Some(resolution),
    );
    store::set_solved_in(tx, id, resolution, &digest, now).await?;
    Ok(Ok(get_in(tx, id).await?.expect("exists")))
}

/// Raw memory hints an extraction stored.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHint {
    pub job_id: String,
    pub ordinal: i64,
    pub experience_id: String,
    pub project_id: String,
    pub target: String,
    pub action: String,
    pub content: Option<String>,
    pub old_text: Option<String>,
    pub reason: String,
    pub confidence: f64,
    pub created_at: i64,
}

// Memory maintenance inputs: what the maintenance job plans from.

/// A validated experience memory maintenance may plan from.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MaintenanceInput {
    pub id: String,
    pub kind: String,
    /// `remember` for an explicit user record.
    #[sqlx(try_from = "String")]
    pub origin: ExperienceOrigin,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub created_at: i64,
    /// The project's commit-order number (what the maintenance watermark counts).
    pub seq: i64,
}

// Semantic recall input: the text an `embed` job computes a vector from.

/// The fields of an experience its embedding text is made from.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EmbeddingSource {
    pub project_id: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub keywords: String,
    #[sqlx(try_from = "String")]
    pub status: ExperienceStatus,
}
