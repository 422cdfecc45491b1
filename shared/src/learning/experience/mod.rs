//! `ExperienceService` storage: Experience records with their evidence, raw memory hints, manual
//! records, forgetting and solving.

pub(crate) mod store;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::extraction::ExperienceKind;
use super::validate::{ValidExperience, ValidHint, ValidatedExtraction};
use crate::db::{Db, StoreError, Tx};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExperienceOrigin {
    Extraction,
    Remember,
    Issue,
}

impl ExperienceOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            ExperienceOrigin::Extraction => "extraction",
            ExperienceOrigin::Remember => "remember",
            ExperienceOrigin::Issue => "issue",
        }
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
    pub origin: String,
    pub extractor_version: Option<String>,
    pub kind: ExperienceKind,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub confidence: f64,
    /// `verified` or `unverified` (an observation whose citations did not check out).
    pub verification: String,
    /// `active` or `forgotten`.
    pub status: String,
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

#[derive(sqlx::FromRow)]
/// One `experience_record` row as [`EXPERIENCE_COLUMNS`] selects it; [`with_evidence`]
/// turns rows into [`Experience`]s.
pub(crate) struct ExperienceRow {
    pub(crate) id: String,
    pub(crate) project_id: String,
    pub(crate) session_id: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(crate) ordinal: Option<i64>,
    pub(crate) origin: String,
    pub(crate) extractor_version: Option<String>,
    pub(crate) kind: String,
    pub(crate) title: String,
    pub(crate) summary: String,
    pub(crate) resolution: Option<String>,
    pub(crate) confidence: f64,
    pub(crate) verification: String,
    pub(crate) status: String,
    pub(crate) content_digest: String,
    pub(crate) use_count: i64,
    pub(crate) last_used_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) forgotten_at: Option<i64>,
    pub(crate) keywords: String,
}

#[derive(sqlx::FromRow)]
struct EvidenceRow {
    experience_id: String,
    ordinal: i64,
    source_id: String,
    address: Option<String>,
    message_id: Option<String>,
    excerpt: String,
    raw_digest: Option<String>,
    redacted_digest: Option<String>,
    verified: bool,
    detail: Option<String>,
}

pub(crate) const EXPERIENCE_COLUMNS: &str = "id, project_id, session_id, job_id, ordinal, origin, extractor_version, kind, \
    title, summary, resolution, confidence, verification, status, content_digest, use_count, last_used_at, created_at, \
    updated_at, forgotten_at, keywords";

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
        if stored_by_another_job_in(tx, &job, &digest).await? {
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
        let id = insert_experience_in(tx, &job, experience, &digest, now).await?;
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
        insert_hint_in(tx, &job, hint, experience_id, *kind, now).await?;
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

/// The extraction job whose answer is being stored.
struct ExtractionJob<'a> {
    job_id: &'a str,
    project_id: &'a str,
    session_id: &'a str,
    extractor_version: &'a str,
}

/// Whether another job already stored an active experience with this content for the session.
async fn stored_by_another_job_in(
    tx: &mut Tx,
    job: &ExtractionJob<'_>,
    digest: &str,
) -> Result<bool, StoreError> {
    let already: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM experience_record WHERE session_id = $1 AND content_digest = $2 \
             AND status = 'active' AND job_id <> $3 ORDER BY created_at, id LIMIT 1"
    )
    .bind(job.session_id)
    .bind(digest)
    .bind(job.job_id)
    .fetch_optional(conn)
    .await)?;
    Ok(already.is_some())
}

/// Stores one experience with its citations; a retry of the same job finds the row it stored
/// before. Returns the experience id.
async fn insert_experience_in(
    tx: &mut Tx,
    job: &ExtractionJob<'_>,
    experience: &ValidExperience,
    digest: &str,
    now: i64,
) -> Result<String, StoreError> {
    let verification = if experience.verified {
        "verified"
    } else {
        "unverified"
    };
    let sql = "INSERT INTO experience_record (id, project_id, session_id, job_id, ordinal, origin, extractor_version, \
                 kind, title, summary, resolution, confidence, verification, status, content_digest, created_at, updated_at, \
                 keywords) \
               VALUES ($1, $2, $3, $4, $5, 'extraction', $6, $7, $8, $9, $10, $11, $12, 'active', $13, $14, $14, $15) \
               ON CONFLICT (job_id, ordinal) DO NOTHING";
    let new_id = crate::ids::new_id("exp");
    let inserted = crate::db::execute_in(
        tx,
        sql,
        &[
            (&new_id).into(),
            job.project_id.into(),
            job.session_id.into(),
            job.job_id.into(),
            experience.ordinal.into(),
            job.extractor_version.into(),
            experience.kind.as_str().into(),
            (&experience.title).into(),
            (&experience.summary).into(),
            (&experience.resolution).into(),
            experience.confidence.into(),
            verification.into(),
            digest.into(),
            now.into(),
            (&experience.keywords.join("\n")).into(),
        ],
    )
    .await?;
    let id = if inserted == 1 {
        new_id
    } else {
        crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT id FROM experience_record WHERE job_id = $1 AND ordinal = $2"
        )
        .bind(job.job_id)
        .bind(experience.ordinal)
        .fetch_one(conn)
        .await)?
    };
    insert_evidence_in(tx, &id, 0, &experience.citations, None).await?;
    Ok(id)
}

async fn insert_hint_in(
    tx: &mut Tx,
    job: &ExtractionJob<'_>,
    hint: &ValidHint,
    experience_id: &str,
    kind: ExperienceKind,
    now: i64,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO memory_hint (job_id, ordinal, experience_id, experience_kind, project_id, target, action, \
                 content, old_text, reason, confidence, created_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (job_id, ordinal) DO NOTHING";
    crate::db::execute_in(
        tx,
        sql,
        &[
            job.job_id.into(),
            hint.ordinal.into(),
            experience_id.into(),
            kind.as_str().into(),
            job.project_id.into(),
            hint.target.as_str().into(),
            hint.action.as_str().into(),
            (&hint.content).into(),
            (&hint.old_text).into(),
            (&hint.reason).into(),
            hint.confidence.into(),
            now.into(),
        ],
    )
    .await?;
    Ok(())
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
    let recent: Vec<(String, String)> = crate::on_tx!(tx, |conn| {
        sqlx::query_as(concat!(
            "SELECT id, summary FROM experience_record WHERE project_id = $1 AND ",
            store::evidence_experience!(),
            " AND (job_id IS NULL OR job_id <> $2) ORDER BY created_at DESC, id DESC LIMIT $3"
        ))
        .bind(project_id)
        .bind(job_id)
        .bind(RESTATEMENT_WINDOW)
        .fetch_all(conn)
        .await
    })?;
    Ok(recent
        .into_iter()
        .find(|(_, other)| crate::memory::dedupe::RuleSignature::of(other).same_rule_as(&rule))
        .map(|(id, _)| id))
}

/// Adds `citations` (of job `job_id`) to `experience_id`'s evidence and counts a reinforcement.
async fn reinforce_in(
    tx: &mut Tx,
    experience_id: &str,
    job_id: &str,
    citations: &[super::validate::CheckedCitation],
) -> Result<(), StoreError> {
    // The counter's update locks the record's row first: a concurrent reinforcer waits here
    // until this transaction ends, and its next statement then sees the ordinals this one
    // took. Reading the next ordinal before holding the lock let two jobs pick the same one,
    // and the later insert was dropped as a conflict (lost evidence on Postgres).
    super::retrieval::adjust_in(tx, experience_id, super::retrieval::ranking::REINFORCE).await?;
    // Each citation takes the next ordinal in its own insert: one statement fewer under the
    // lock than reading the ordinal first.
    let sql = "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, message_id, excerpt, \
                 raw_digest, redacted_digest, verified, detail, job_id) \
               SELECT $1, COALESCE(MAX(ordinal), -1) + 1, $2, $3, $4, $5, $6, $7, $8, $9, $10 \
               FROM experience_evidence WHERE experience_id = $1 \
               ON CONFLICT (experience_id, ordinal) DO NOTHING";
    for citation in citations {
        crate::db::execute_in(
            tx,
            sql,
            &evidence_args(experience_id, None, citation, Some(job_id)),
        )
        .await?;
    }
    Ok(())
}

/// Writes `citations` as evidence rows of `experience_id` from ordinal `first` on; `job_id`
/// names the reinforcing job (none for the experience's own citations).
async fn insert_evidence_in(
    tx: &mut Tx,
    experience_id: &str,
    first: i64,
    citations: &[super::validate::CheckedCitation],
    job_id: Option<&str>,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, message_id, excerpt, \
                 raw_digest, redacted_digest, verified, detail, job_id) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (experience_id, ordinal) DO NOTHING";
    for (index, citation) in citations.iter().enumerate() {
        crate::db::execute_in(
            tx,
            sql,
            &evidence_args(experience_id, Some(first + index as i64), citation, job_id),
        )
        .await?;
    }
    Ok(())
}

/// An evidence row's values in column order, the ordinal left out when the statement takes the
/// next one itself.
fn evidence_args<'a>(
    experience_id: &'a str,
    ordinal: Option<i64>,
    citation: &'a super::validate::CheckedCitation,
    job_id: Option<&'a str>,
) -> Vec<crate::db::Arg<'a>> {
    let mut args = vec![experience_id.into()];
    args.extend(ordinal.map(crate::db::Arg::from));
    args.extend::<[crate::db::Arg<'a>; 9]>([
        (&citation.source_id).into(),
        (&citation.address).into(),
        (&citation.message_id).into(),
        (&citation.excerpt).into(),
        (&citation.raw_digest).into(),
        (&citation.redacted_digest).into(),
        citation.verified.into(),
        (&citation.detail).into(),
        job_id.into(),
    ]);
    args
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
    let sql = "INSERT INTO experience_record (id, project_id, session_id, origin, kind, title, summary, confidence, \
                 verification, status, content_digest, created_at, updated_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, 1.0, 'verified', 'active', $8, $9, $9)";
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&id).into(),
            project_id.into(),
            session_id.into(),
            origin.as_str().into(),
            kind.as_str().into(),
            (&title).into(),
            text.into(),
            (&digest).into(),
            now.into(),
        ],
    )
    .await?;
    let sql = "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, excerpt, verified) \
               VALUES ($1, 0, $2, $2, $3, TRUE)";
    let address = format!("command:{}", origin.as_str());
    crate::db::execute_in(tx, sql, &[(&id).into(), (&address).into(), text.into()]).await?;
    crate::learning::recall::index::catch_up_in(tx, INDEX_BATCH).await?;
    Ok(Ok(get_in(tx, &id).await?.expect("inserted above")))
}

async fn evidence_for(
    rows: Vec<ExperienceRow>,
    evidence: Vec<EvidenceRow>,
) -> Result<Vec<Experience>, StoreError> {
    let mut by_experience: std::collections::HashMap<String, Vec<Evidence>> =
        std::collections::HashMap::new();
    for row in evidence {
        by_experience
            .entry(row.experience_id)
            .or_default()
            .push(Evidence {
                ordinal: row.ordinal,
                source_id: row.source_id,
                address: row.address,
                message_id: row.message_id,
                excerpt: row.excerpt,
                raw_digest: row.raw_digest,
                redacted_digest: row.redacted_digest,
                verified: row.verified,
                detail: row.detail,
            });
    }
    rows.into_iter()
        .map(|row| {
            Ok(Experience {
                kind: ExperienceKind::parse(&row.kind).ok_or_else(|| {
                    StoreError::Corrupt(format!("experience kind `{}`", row.kind))
                })?,
                evidence: by_experience.remove(&row.id).unwrap_or_default(),
                id: row.id,
                project_id: row.project_id,
                session_id: row.session_id,
                job_id: row.job_id,
                ordinal: row.ordinal,
                origin: row.origin,
                extractor_version: row.extractor_version,
                title: row.title,
                summary: row.summary,
                resolution: row.resolution,
                confidence: row.confidence,
                verification: row.verification,
                status: row.status,
                content_digest: row.content_digest,
                use_count: row.use_count,
                last_used_at: row.last_used_at,
                created_at: row.created_at,
                updated_at: row.updated_at,
                forgotten_at: row.forgotten_at,
                keywords: row
                    .keywords
                    .lines()
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned)
                    .collect(),
            })
        })
        .collect()
}

const EVIDENCE_COLUMNS: &str = "experience_id, ordinal, source_id, address, message_id, excerpt, raw_digest, redacted_digest, verified, detail";

pub async fn get_in(tx: &mut Tx, id: &str) -> Result<Option<Experience>, StoreError> {
    let sql = format!("SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE id = $1");
    let rows: Vec<ExperienceRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(id)
            .fetch_all(conn)
            .await)?;
    let sql = format!(
        "SELECT {EVIDENCE_COLUMNS} FROM experience_evidence WHERE experience_id = $1 ORDER BY ordinal"
    );
    let evidence: Vec<EvidenceRow> =
        crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(id)
            .fetch_all(conn)
            .await)?;
    Ok(evidence_for(rows, evidence).await?.pop())
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
    let sql = format!(
        "SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE project_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3"
    );
    let rows: Vec<ExperienceRow> =
        crate::on_db!(db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(project_id)
            .bind(limit)
            .bind(offset)
            .fetch_all(pool)
            .await)?;
    let total: i64 = crate::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_record WHERE project_id = $1"
    )
    .bind(project_id)
    .fetch_one(pool)
    .await)?;
    Ok((with_evidence(db, rows).await?, total))
}

/// Experiences an extraction job stored (or a session produced).
pub async fn for_session(db: &Db, session_id: &str) -> Result<Vec<Experience>, StoreError> {
    let sql = format!(
        "SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE session_id = $1 ORDER BY created_at, ordinal"
    );
    let rows: Vec<ExperienceRow> =
        crate::on_db!(db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(session_id)
            .fetch_all(pool)
            .await)?;
    with_evidence(db, rows).await
}

/// `rows` as experiences, in the same order, with their evidence read in one query.
pub(crate) async fn with_evidence(
    db: &Db,
    rows: Vec<ExperienceRow>,
) -> Result<Vec<Experience>, StoreError> {
    let evidence = load_evidence(db, rows.iter().map(|r| r.id.as_str())).await?;
    evidence_for(rows, evidence).await
}

/// Experiences from `rows` without their evidence rows (`evidence` empty), for readers that
/// need none.
pub(crate) async fn without_evidence(
    rows: Vec<ExperienceRow>,
) -> Result<Vec<Experience>, StoreError> {
    evidence_for(rows, Vec::new()).await
}

async fn load_evidence<'a>(
    db: &Db,
    ids: impl Iterator<Item = &'a str>,
) -> Result<Vec<EvidenceRow>, StoreError> {
    let ids: Vec<&str> = ids.collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let placeholders: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT {EVIDENCE_COLUMNS} FROM experience_evidence WHERE experience_id IN ({}) ORDER BY experience_id, ordinal",
        placeholders.join(", ")
    );
    Ok(crate::on_db!(db, |pool| {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
        for id in &ids {
            query = query.bind(*id);
        }
        query.fetch_all(pool).await
    })?)
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
    if experience.status == "forgotten" {
        return Ok(Ok(experience));
    }
    crate::db::execute_in(
        tx,
        "UPDATE experience_record SET status = 'forgotten', forgotten_at = $2, updated_at = $2 WHERE id = $1",
        &[id.into(), now.into()],
    )
    .await?;
    for evidence in &experience.evidence {
        if let (Some(message_id), Some(raw_digest)) = (&evidence.message_id, &evidence.raw_digest) {
            crate::db::execute_in(
                tx,
                "INSERT INTO forgotten_source (message_id, raw_digest, experience_id, at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (message_id, raw_digest) DO NOTHING",
                &[message_id.into(), raw_digest.into(), id.into(), now.into()],
            )
            .await?;
        }
    }
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
    crate::db::execute_in(
        tx,
        "UPDATE experience_record SET kind = 'problem', resolution = $2, content_digest = $3, updated_at = $4 WHERE id = $1",
        &[id.into(), resolution.into(), (&digest).into(), now.into()],
    )
    .await?;
    Ok(Ok(get_in(tx, id).await?.expect("exists")))
}

/// True when any of `(message_id, raw_digest)` was explicitly forgotten: one lookup per
/// [`FORGOTTEN_CHUNK`] sources (every source check of every job asks this).
pub async fn any_forgotten_in(
    tx: &mut Tx,
    sources: &[(String, String)],
) -> Result<bool, StoreError> {
    for chunk in sources.chunks(FORGOTTEN_CHUNK) {
        let pairs = (0..chunk.len())
            .map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT CAST(1 AS BIGINT) FROM forgotten_source WHERE (message_id, raw_digest) IN ({pairs}) LIMIT 1"
        );
        let found: Option<i64> = crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()));
            for (message_id, raw_digest) in chunk {
                query = query.bind(message_id).bind(raw_digest);
            }
            query.fetch_optional(conn).await
        })?;
        if found.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Sources per forgotten-source lookup (two parameters each).
const FORGOTTEN_CHUNK: usize = 200;

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

pub async fn hints_for_job(db: &Db, job_id: &str) -> Result<Vec<MemoryHint>, StoreError> {
    let sql = "SELECT job_id, ordinal, experience_id, project_id, target, action, content, old_text, reason, confidence, created_at \
               FROM memory_hint WHERE job_id = $1 ORDER BY ordinal";
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(job_id)
        .fetch_all(pool)
        .await)?)
}

// Memory maintenance inputs: what the maintenance job plans from.

/// A validated experience memory maintenance may plan from.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MaintenanceInput {
    pub id: String,
    pub kind: String,
    /// `remember` for an explicit user record.
    pub origin: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub created_at: i64,
    /// The project's commit-order number (what the maintenance watermark counts).
    pub seq: i64,
}

/// Up to `limit` experiences of `project_id` past the watermark `after_seq` (exclusive), in
/// commit order, that maintenance may plan from: verified, live, never unresolved
/// issues, and backed by a user statement, user feedback or a successful tool result (or an
/// explicit `remember` record).
pub async fn maintenance_inputs_in(
    tx: &mut Tx,
    project_id: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<MaintenanceInput>, StoreError> {
    let sql = concat!(
        "SELECT e.id, e.kind, e.origin, e.title, e.summary, e.resolution, e.created_at, e.seq FROM experience_record e \
         WHERE e.project_id = $1 AND ",
        store::evidence_experience!("e"),
        " AND e.seq > $2 \
           AND (e.origin = 'remember' OR EXISTS (SELECT 1 FROM experience_evidence v JOIN learning_source_record s \
                ON s.job_id = COALESCE(v.job_id, e.job_id) AND s.source_id = v.source_id \
                WHERE v.experience_id = e.id AND v.verified = TRUE \
                  AND s.verification IN ('user_statement', 'user_feedback', 'tool_succeeded'))) \
         ORDER BY e.seq LIMIT $3"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(project_id)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(conn)
        .await)?)
}

/// The experiences among `ids` with explicit user evidence: a verified citation of a user
/// statement or user feedback, or an explicit `remember` record. One statement for all ids.
pub async fn user_backed_in(
    tx: &mut Tx,
    ids: &[String],
) -> Result<std::collections::HashSet<String>, StoreError> {
    ids_where_in(
        tx,
        "SELECT DISTINCT v.experience_id FROM experience_evidence v JOIN experience_record e ON e.id = v.experience_id \
         LEFT JOIN learning_source_record s ON s.job_id = COALESCE(v.job_id, e.job_id) AND s.source_id = v.source_id \
         WHERE v.experience_id IN ({ids}) AND v.verified = TRUE \
           AND (e.origin = 'remember' OR s.verification IN ('user_statement', 'user_feedback'))",
        ids,
    )
    .await
}

/// The experiences of `ids` whose sources only callers allowed to change global Memory wrote:
/// the record itself (`experience_record.global_write_source`, cleared for a manual record made
/// by another caller) and its session, if any (`session.global_write_sources`).
pub async fn global_write_backed_in(
    tx: &mut Tx,
    ids: &[String],
) -> Result<std::collections::HashSet<String>, StoreError> {
    ids_where_in(
        tx,
        "SELECT e.id FROM experience_record e LEFT JOIN session s ON s.id = e.session_id \
         WHERE e.id IN ({ids}) AND e.global_write_source = TRUE \
           AND (s.id IS NULL OR s.global_write_sources = TRUE)",
        ids,
    )
    .await
}

/// Marks a manual record made by a caller without global-Memory write (see
/// [`global_write_backed_in`]), inside the transaction that writes it.
pub async fn mark_without_global_write_in(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE experience_record SET global_write_source = FALSE WHERE id = $1",
        &[id.into()],
    )
    .await?;
    Ok(())
}

/// The experience ids a one-column `select` returns, its `{ids}` replaced by one placeholder
/// per id of `ids` (bound in order). One statement for all ids; none for no ids.
async fn ids_where_in(
    tx: &mut Tx,
    select: &str,
    ids: &[String],
) -> Result<std::collections::HashSet<String>, StoreError> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let sql = select.replace("{ids}", &placeholders(ids.len()));
    let found: Vec<String> = crate::on_tx!(tx, |conn| {
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()));
        for id in ids {
            query = query.bind(id.as_str());
        }
        query.fetch_all(conn).await
    })?;
    Ok(found.into_iter().collect())
}

/// The raw memory hints of the experiences `ids`, grouped in the order of `ids` and by ordinal
/// within one experience. One statement for all ids.
pub async fn hints_of_in(tx: &mut Tx, ids: &[String]) -> Result<Vec<MemoryHint>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT job_id, ordinal, experience_id, project_id, target, action, content, old_text, reason, confidence, created_at \
         FROM memory_hint WHERE experience_id IN ({}) ORDER BY experience_id, ordinal",
        placeholders(ids.len())
    );
    let mut hints: Vec<MemoryHint> = crate::on_tx!(tx, |conn| {
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
        for id in ids {
            query = query.bind(id.as_str());
        }
        query.fetch_all(conn).await
    })?;
    let position: std::collections::HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| (id.as_str(), index))
        .collect();
    // A stable sort keeps the ordinal order inside each experience.
    hints.sort_by_key(|hint| position.get(hint.experience_id.as_str()).copied());
    Ok(hints)
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
    /// `active` or `forgotten`.
    pub status: String,
}

/// The embedding source of experience `id`, if it exists (forgotten or not).
pub async fn embedding_source_in(
    tx: &mut Tx,
    id: &str,
) -> Result<Option<EmbeddingSource>, StoreError> {
    let sql = "SELECT project_id, title, summary, resolution, keywords, status \
               FROM experience_record WHERE id = $1";
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(id)
        .fetch_optional(conn)
        .await)?)
}

/// `$1, $2, …` for `n` parameters.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
