//! The Experience aggregate's SQL: experience records, their evidence, raw memory hints and
//! forgotten sources. The shared conditions come first, written once: every query that asks for
//! "live" experience (recall, mining, Memory support, maintenance) uses these, so a change to
//! what keeps an experience usable is one edit.

use std::collections::{HashMap, HashSet};

use super::{
    EmbeddingSource, Evidence, Experience, ExperienceOrigin, ExperienceStatus, MaintenanceInput,
    MemoryHint, Verification,
};
use crate::db::{Arg, Db, StoreError, Tx};
use crate::learning::extraction::ExperienceKind;
use crate::learning::store::{keyed, write_in};
use crate::learning::validate::{CheckedCitation, ValidExperience, ValidHint};

/// An experience that may still be used: not forgotten or superseded (`status = 'active'`) and
/// its source unchanged since extraction (`source_state = 'current'`). A string literal, so it
/// composes with `concat!` into `&'static str` statements: `live_experience!()` for an
/// unaliased `experience_record`, `live_experience!("e")` for one aliased `e`.
macro_rules! live_experience {
    () => {
        "status = 'active' AND source_state = 'current'"
    };
    ($alias:literal) => {
        concat!(
            $alias,
            ".status = 'active' AND ",
            $alias,
            ".source_state = 'current'"
        )
    };
}
pub(crate) use live_experience;

/// A live experience that may be evidence for a rule: verified, and never an unresolved issue (an
/// issue nobody solved teaches no rule). Aliased like [`live_experience!`].
macro_rules! evidence_experience {
    () => {
        concat!(
            $crate::learning::experience::store::live_experience!(),
            " AND verification = 'verified' AND kind <> 'unresolved_issue'"
        )
    };
    ($alias:literal) => {
        concat!(
            $crate::learning::experience::store::live_experience!($alias),
            " AND ",
            $alias,
            ".verification = 'verified' AND ",
            $alias,
            ".kind <> 'unresolved_issue'"
        )
    };
}
pub(crate) use evidence_experience;

/// One `experience_record` row as [`EXPERIENCE_COLUMNS`] selects it; [`with_evidence`] turns
/// rows into [`Experience`]s.
#[derive(sqlx::FromRow)]
pub(crate) struct ExperienceRow {
    pub(crate) id: String,
    pub(crate) project_id: String,
    pub(crate) session_id: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(crate) ordinal: Option<i64>,
    #[sqlx(try_from = "String")]
    pub(crate) origin: ExperienceOrigin,
    pub(crate) extractor_version: Option<String>,
    pub(crate) kind: String,
    pub(crate) title: String,
    pub(crate) summary: String,
    pub(crate) resolution: Option<String>,
    pub(crate) confidence: f64,
    #[sqlx(try_from = "String")]
    pub(crate) verification: Verification,
    #[sqlx(try_from = "String")]
    pub(crate) status: ExperienceStatus,
    pub(crate) content_digest: String,
    pub(crate) use_count: i64,
    pub(crate) last_used_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) forgotten_at: Option<i64>,
    pub(crate) keywords: String,
}

pub(crate) const EXPERIENCE_COLUMNS: &str = "id, project_id, session_id, job_id, ordinal, origin, extractor_version, kind, \
    title, summary, resolution, confidence, verification, status, content_digest, use_count, last_used_at, created_at, \
    updated_at, forgotten_at, keywords";

/// One `experience_evidence` row as [`EVIDENCE_COLUMNS`] selects it.
#[derive(sqlx::FromRow)]
pub(crate) struct EvidenceRow {
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

const EVIDENCE_COLUMNS: &str = "experience_id, ordinal, source_id, address, message_id, excerpt, raw_digest, redacted_digest, verified, detail";

const HINT_COLUMNS: &str = "job_id, ordinal, experience_id, project_id, target, action, content, old_text, reason, confidence, created_at";

impl From<EvidenceRow> for Evidence {
    fn from(row: EvidenceRow) -> Evidence {
        Evidence {
            ordinal: row.ordinal,
            source_id: row.source_id,
            address: row.address,
            message_id: row.message_id,
            excerpt: row.excerpt,
            raw_digest: row.raw_digest,
            redacted_digest: row.redacted_digest,
            verified: row.verified,
            detail: row.detail,
        }
    }
}

impl ExperienceRow {
    fn into_experience(self, evidence: Vec<Evidence>) -> Result<Experience, StoreError> {
        Ok(Experience {
            kind: ExperienceKind::parse(&self.kind)
                .ok_or_else(|| StoreError::Corrupt(format!("experience kind `{}`", self.kind)))?,
            evidence,
            id: self.id,
            project_id: self.project_id,
            session_id: self.session_id,
            job_id: self.job_id,
            ordinal: self.ordinal,
            origin: self.origin,
            extractor_version: self.extractor_version,
            title: self.title,
            summary: self.summary,
            resolution: self.resolution,
            confidence: self.confidence,
            verification: self.verification,
            status: self.status,
            content_digest: self.content_digest,
            use_count: self.use_count,
            last_used_at: self.last_used_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
            forgotten_at: self.forgotten_at,
            keywords: self
                .keywords
                .lines()
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// `rows` as experiences, in the same order, each with its rows of `evidence`.
fn experiences_of(
    rows: Vec<ExperienceRow>,
    evidence: Vec<EvidenceRow>,
) -> Result<Vec<Experience>, StoreError> {
    let mut by_experience: HashMap<String, Vec<Evidence>> = HashMap::new();
    for row in evidence {
        by_experience
            .entry(row.experience_id.clone())
            .or_default()
            .push(row.into());
    }
    rows.into_iter()
        .map(|row| {
            let evidence = by_experience.remove(&row.id).unwrap_or_default();
            row.into_experience(evidence)
        })
        .collect()
}

/// `rows` as experiences, in the same order, with their evidence read in one query.
pub(crate) async fn with_evidence(
    db: &Db,
    rows: Vec<ExperienceRow>,
) -> Result<Vec<Experience>, StoreError> {
    let ids: Vec<&str> = rows.iter().map(|row| row.id.as_str()).collect();
    let evidence = if ids.is_empty() {
        Vec::new()
    } else {
        let sql = format!(
            "SELECT {EVIDENCE_COLUMNS} FROM experience_evidence WHERE experience_id IN ({}) ORDER BY experience_id, ordinal",
            placeholders(ids.len())
        );
        crate::on_db!(db, |pool| ids
            .iter()
            .fold(
                sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())),
                |q, id| q.bind(*id)
            )
            .fetch_all(pool)
            .await)?
    };
    experiences_of(rows, evidence)
}

/// Experiences from `rows` without their evidence rows (`evidence` empty), for readers that
/// need none.
pub(crate) async fn without_evidence(
    rows: Vec<ExperienceRow>,
) -> Result<Vec<Experience>, StoreError> {
    experiences_of(rows, Vec::new())
}

/// Experience `id` with its evidence, in the caller's transaction.
pub(crate) async fn experience_in(tx: &mut Tx, id: &str) -> Result<Option<Experience>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE id = $1"
    ));
    let rows: Vec<ExperienceRow> = keyed!(on_tx, tx, query_as(sql), id, fetch_all)?;
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {EVIDENCE_COLUMNS} FROM experience_evidence WHERE experience_id = $1 ORDER BY ordinal"
    ));
    let evidence: Vec<EvidenceRow> = keyed!(on_tx, tx, query_as(sql), id, fetch_all)?;
    Ok(experiences_of(rows, evidence)?.pop())
}

/// A page of `project_id`'s experiences, newest first, and how many it has in all.
pub(crate) async fn page(
    db: &Db,
    project_id: &str,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Experience>, i64), StoreError> {
    let sql = format!(
        "SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE project_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3"
    );
    let rows: Vec<ExperienceRow> = keyed!(
        on_db,
        db,
        query_as(sqlx::AssertSqlSafe(sql.as_str())),
        [project_id, limit, offset],
        fetch_all
    )?;
    let total: i64 = keyed!(
        on_db,
        db,
        query_scalar(COUNT_OF_PROJECT),
        project_id,
        fetch_one
    )?;
    Ok((with_evidence(db, rows).await?, total))
}

const COUNT_OF_PROJECT: &str = "SELECT COUNT(*) FROM experience_record WHERE project_id = $1";

/// How many experiences `project_id` holds, in the caller's transaction.
pub(crate) async fn count_of_project_in(tx: &mut Tx, project_id: &str) -> Result<i64, StoreError> {
    let found = keyed!(
        on_tx,
        tx,
        query_scalar(COUNT_OF_PROJECT),
        project_id,
        fetch_one
    );
    Ok(found?)
}

/// The experiences `session_id` produced, oldest first.
pub(crate) async fn of_session(db: &Db, session_id: &str) -> Result<Vec<Experience>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {EXPERIENCE_COLUMNS} FROM experience_record WHERE session_id = $1 ORDER BY created_at, ordinal"
    ));
    let rows: Vec<ExperienceRow> = keyed!(on_db, db, query_as(sql), session_id, fetch_all)?;
    with_evidence(db, rows).await
}

/// Whether a job other than `job_id` already stored an active experience with `digest` for
/// `session_id`.
pub(crate) async fn stored_by_another_job_in(
    tx: &mut Tx,
    session_id: &str,
    job_id: &str,
    digest: &str,
) -> Result<bool, StoreError> {
    let already: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM experience_record WHERE session_id = $1 AND content_digest = $2 \
             AND status = 'active' AND job_id <> $3 ORDER BY created_at, id LIMIT 1"
    )
    .bind(session_id)
    .bind(digest)
    .bind(job_id)
    .fetch_optional(conn)
    .await)?;
    Ok(already.is_some())
}

/// The extraction job whose answer is being stored.
pub(crate) struct ExtractionJob<'a> {
    pub(crate) job_id: &'a str,
    pub(crate) project_id: &'a str,
    pub(crate) session_id: &'a str,
    pub(crate) extractor_version: &'a str,
}

/// Stores `experience` (without its citations) unless the job stored its ordinal before;
/// returns the experience id either way.
pub(crate) async fn insert_extracted_in(
    tx: &mut Tx,
    job: &ExtractionJob<'_>,
    experience: &ValidExperience,
    digest: &str,
    now: i64,
) -> Result<String, StoreError> {
    let verification = if experience.verified {
        Verification::Verified
    } else {
        Verification::Unverified
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
            verification.as_str().into(),
            digest.into(),
            now.into(),
            (&experience.keywords.join("\n")).into(),
        ],
    )
    .await?;
    if inserted == 1 {
        return Ok(new_id);
    }
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT id FROM experience_record WHERE job_id = $1 AND ordinal = $2"
    )
    .bind(job.job_id)
    .bind(experience.ordinal)
    .fetch_one(conn)
    .await)?)
}

/// Stores `hint` of the job's experience `experience_id` (of `kind`), once per job and ordinal.
pub(crate) async fn insert_hint_in(
    tx: &mut Tx,
    job: &ExtractionJob<'_>,
    hint: &ValidHint,
    experience: (&str, ExperienceKind),
    now: i64,
) -> Result<(), StoreError> {
    let (experience_id, kind) = experience;
    let sql = "INSERT INTO memory_hint (job_id, ordinal, experience_id, experience_kind, project_id, target, action, \
                 content, old_text, reason, confidence, created_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (job_id, ordinal) DO NOTHING";
    write_in(
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
    .await
}

/// An experience's id and summary.
#[derive(sqlx::FromRow)]
pub(crate) struct SummaryRow {
    pub(crate) id: String,
    pub(crate) summary: String,
}

/// The `limit` most recent evidence experiences of `project_id` not stored by `job_id`, newest
/// first.
pub(crate) async fn recent_summaries_in(
    tx: &mut Tx,
    project_id: &str,
    job_id: &str,
    limit: i64,
) -> Result<Vec<SummaryRow>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(concat!(
        "SELECT id, summary FROM experience_record WHERE project_id = $1 AND ",
        evidence_experience!(),
        " AND (job_id IS NULL OR job_id <> $2) ORDER BY created_at DESC, id DESC LIMIT $3"
    ))
    .bind(project_id)
    .bind(job_id)
    .bind(limit)
    .fetch_all(conn)
    .await)?)
}

/// Where an evidence row goes: its experience, its ordinal (`None`: the next free one) and the
/// reinforcing job (`None` for the experience's own citations).
pub(crate) struct EvidenceSlot<'a> {
    pub(crate) experience_id: &'a str,
    pub(crate) ordinal: Option<i64>,
    pub(crate) job_id: Option<&'a str>,
}

/// Writes `citation` as an evidence row in `slot`; a row already at that ordinal stays.
pub(crate) async fn insert_evidence_in(
    tx: &mut Tx,
    slot: &EvidenceSlot<'_>,
    citation: &CheckedCitation,
) -> Result<(), StoreError> {
    // Without an ordinal the statement takes the next one itself: one statement fewer under
    // the record's lock (see `reinforce_in`) than reading the ordinal first.
    let sql = match slot.ordinal {
        Some(_) => {
            "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, message_id, excerpt, \
                 raw_digest, redacted_digest, verified, detail, job_id) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (experience_id, ordinal) DO NOTHING"
        }
        None => {
            "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, message_id, excerpt, \
                 raw_digest, redacted_digest, verified, detail, job_id) \
               SELECT $1, COALESCE(MAX(ordinal), -1) + 1, $2, $3, $4, $5, $6, $7, $8, $9, $10 \
               FROM experience_evidence WHERE experience_id = $1 \
               ON CONFLICT (experience_id, ordinal) DO NOTHING"
        }
    };
    let mut args: Vec<Arg<'_>> = vec![slot.experience_id.into()];
    args.extend(slot.ordinal.map(Arg::from));
    args.extend::<[Arg<'_>; 9]>([
        (&citation.source_id).into(),
        (&citation.address).into(),
        (&citation.message_id).into(),
        (&citation.excerpt).into(),
        (&citation.raw_digest).into(),
        (&citation.redacted_digest).into(),
        citation.verified.into(),
        (&citation.detail).into(),
        slot.job_id.into(),
    ]);
    write_in(tx, sql, &args).await
}

/// A manual record (`remember`, `issue`) to store: verified, with full confidence.
pub(crate) struct ManualRecord<'a> {
    pub(crate) id: &'a str,
    pub(crate) project_id: &'a str,
    pub(crate) session_id: Option<&'a str>,
    pub(crate) origin: super::ExperienceOrigin,
    pub(crate) kind: ExperienceKind,
    pub(crate) title: &'a str,
    pub(crate) text: &'a str,
    pub(crate) digest: &'a str,
}

/// Stores `record` with its one piece of evidence: the command that made it, quoting `text`.
pub(crate) async fn insert_manual_in(
    tx: &mut Tx,
    record: &ManualRecord<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let sql = "INSERT INTO experience_record (id, project_id, session_id, origin, kind, title, summary, confidence, \
                 verification, status, content_digest, created_at, updated_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, 1.0, 'verified', 'active', $8, $9, $9)";
    crate::db::execute_in(
        tx,
        sql,
        &[
            record.id.into(),
            record.project_id.into(),
            record.session_id.into(),
            record.origin.as_str().into(),
            record.kind.as_str().into(),
            record.title.into(),
            record.text.into(),
            record.digest.into(),
            now.into(),
        ],
    )
    .await?;
    let sql = "INSERT INTO experience_evidence (experience_id, ordinal, source_id, address, excerpt, verified) \
               VALUES ($1, 0, $2, $2, $3, TRUE)";
    let address = format!("command:{}", record.origin.as_str());
    write_in(
        tx,
        sql,
        &[record.id.into(), (&address).into(), record.text.into()],
    )
    .await
}

/// Marks experience `id` forgotten at `now`.
pub(crate) async fn set_forgotten_in(tx: &mut Tx, id: &str, now: i64) -> Result<(), StoreError> {
    const SQL: &str = "UPDATE experience_record SET status = 'forgotten', forgotten_at = $2, updated_at = $2 WHERE id = $1";
    write_in(tx, SQL, &[id.into(), now.into()]).await
}

/// Marks every active experience of `project_id` forgotten at `now`.
pub(crate) async fn forget_project_in(
    tx: &mut Tx,
    project_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    write_in(
        tx,
        "UPDATE experience_record SET status = 'forgotten', forgotten_at = $2, updated_at = $2 \
         WHERE project_id = $1 AND status = 'active'",
        &[project_id.into(), now.into()],
    )
    .await
}

/// Records the cited sources of `experience` (message and raw digest) as forgotten, once per
/// message and digest, so unchanged evidence can never resurrect it.
pub(crate) async fn remember_forgotten_sources_in(
    tx: &mut Tx,
    experience: &Experience,
    now: i64,
) -> Result<(), StoreError> {
    const SQL: &str = "INSERT INTO forgotten_source (message_id, raw_digest, experience_id, at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (message_id, raw_digest) DO NOTHING";
    for evidence in &experience.evidence {
        if let (Some(message_id), Some(raw_digest)) = (&evidence.message_id, &evidence.raw_digest) {
            let args = [
                message_id.into(),
                raw_digest.into(),
                (&experience.id).into(),
                now.into(),
            ];
            write_in(tx, SQL, &args).await?;
        }
    }
    Ok(())
}

/// Turns unresolved issue `id` into a problem solved by `resolution` (content digest `digest`).
pub(crate) async fn set_solved_in(
    tx: &mut Tx,
    id: &str,
    resolution: &str,
    digest: &str,
    now: i64,
) -> Result<(), StoreError> {
    const SQL: &str = "UPDATE experience_record SET kind = 'problem', resolution = $2, content_digest = $3, updated_at = $4 WHERE id = $1";
    crate::db::execute_in(
        tx,
        SQL,
        &[id.into(), resolution.into(), digest.into(), now.into()],
    )
    .await
    .map(drop)
}

/// Sets experience `id`'s verification.
pub(crate) async fn set_verification_in(
    tx: &mut Tx,
    id: &str,
    verification: Verification,
    now: i64,
) -> Result<(), StoreError> {
    const SQL: &str =
        "UPDATE experience_record SET verification = $2, updated_at = $3 WHERE id = $1";
    crate::db::execute_in(
        tx,
        SQL,
        &[id.into(), verification.as_str().into(), now.into()],
    )
    .await
    .map(drop)
}

/// Deletes experience `id`; its evidence and provenance rows cascade.
pub(crate) async fn delete_in(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    const SQL: &str = "DELETE FROM experience_record WHERE id = $1";
    write_in(tx, SQL, &[id.into()]).await
}

/// The experiences derived from `session_id`: produced by its jobs or citing its messages.
pub(crate) async fn derived_from_session_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Vec<String>, StoreError> {
    let sql = "SELECT id FROM experience_record WHERE session_id = $1 \
             UNION SELECT e.experience_id FROM experience_evidence e JOIN message m ON m.id = e.message_id \
             WHERE m.session_id = $1 ORDER BY 1";
    Ok(keyed!(on_tx, tx, query_scalar(sql), session_id, fetch_all)?)
}

/// The experiences of `project_id` that support an entry of global Memory.
pub(crate) async fn supporting_global_memory_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<Vec<String>, StoreError> {
    let sql = "SELECT DISTINCT p.experience_id FROM memory_provenance p \
           JOIN memory_entry m ON m.id = p.entry_id \
           JOIN memory_document d ON d.id = m.document_id \
           JOIN experience_record e ON e.id = p.experience_id \
         WHERE e.project_id = $1 AND d.project_id IS NULL ORDER BY 1";
    Ok(keyed!(on_tx, tx, query_scalar(sql), project_id, fetch_all)?)
}

/// One citation of an experience a job stored, with the experience's verification and status.
#[derive(sqlx::FromRow)]
pub(crate) struct JobEvidenceRow {
    pub(crate) experience_id: String,
    pub(crate) message_id: Option<String>,
    pub(crate) address: Option<String>,
    pub(crate) excerpt: String,
    pub(crate) raw_digest: Option<String>,
    pub(crate) verification: String,
    pub(crate) status: String,
}

/// Every citation of the experiences `job_id` stored, by experience and ordinal.
pub(crate) async fn evidence_of_job_in(
    tx: &mut Tx,
    job_id: &str,
) -> Result<Vec<JobEvidenceRow>, StoreError> {
    let sql = "SELECT e.experience_id, e.message_id, e.address, e.excerpt, e.raw_digest, x.verification, x.status \
         FROM experience_evidence e JOIN experience_record x ON x.id = e.experience_id \
         WHERE x.job_id = $1 ORDER BY e.experience_id, e.ordinal";
    Ok(keyed!(on_tx, tx, query_as(sql), job_id, fetch_all)?)
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

/// Raw memory hints job `job_id` stored, by ordinal.
pub async fn hints_for_job(db: &Db, job_id: &str) -> Result<Vec<MemoryHint>, StoreError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {HINT_COLUMNS} FROM memory_hint WHERE job_id = $1 ORDER BY ordinal"
    ));
    Ok(keyed!(on_db, db, query_as(sql), job_id, fetch_all)?)
}

/// The raw memory hints of the experiences `ids`, grouped in the order of `ids` and by ordinal
/// within one experience. One statement for all ids.
pub async fn hints_of_in(tx: &mut Tx, ids: &[String]) -> Result<Vec<MemoryHint>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT {HINT_COLUMNS} FROM memory_hint WHERE experience_id IN ({}) ORDER BY experience_id, ordinal",
        placeholders(ids.len())
    );
    let mut hints: Vec<MemoryHint> = crate::on_tx!(tx, |conn| ids
        .iter()
        .fold(
            sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())),
            |q, id| q.bind(id.as_str())
        )
        .fetch_all(conn)
        .await)?;
    let position: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| (id.as_str(), index))
        .collect();
    // A stable sort keeps the ordinal order inside each experience.
    hints.sort_by_key(|hint| position.get(hint.experience_id.as_str()).copied());
    Ok(hints)
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
        evidence_experience!("e"),
        " AND e.seq > $2 \
           AND (e.origin = 'remember' OR EXISTS (SELECT 1 FROM experience_evidence v JOIN learning_source_record s \
                ON s.job_id = COALESCE(v.job_id, e.job_id) AND s.source_id = v.source_id \
                WHERE v.experience_id = e.id AND v.verified = TRUE \
                  AND s.verification IN ('user_statement', 'user_feedback', 'tool_succeeded'))) \
         ORDER BY e.seq LIMIT $3"
    );
    Ok(keyed!(
        on_tx,
        tx,
        query_as(sql),
        [project_id, after_seq, limit],
        fetch_all
    )?)
}

/// The experiences among `ids` with explicit user evidence: a verified citation of a user
/// statement or user feedback, or an explicit `remember` record. One statement for all ids.
pub async fn user_backed_in(tx: &mut Tx, ids: &[String]) -> Result<HashSet<String>, StoreError> {
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
) -> Result<HashSet<String>, StoreError> {
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
    const SQL: &str = "UPDATE experience_record SET global_write_source = FALSE WHERE id = $1";
    write_in(tx, SQL, &[id.into()]).await
}

/// The experience ids a one-column `select` returns, its `{ids}` replaced by one placeholder
/// per id of `ids` (bound in order). One statement for all ids; none for no ids.
async fn ids_where_in(
    tx: &mut Tx,
    select: &str,
    ids: &[String],
) -> Result<HashSet<String>, StoreError> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let sql = select.replace("{ids}", &placeholders(ids.len()));
    let found: Vec<String> = crate::on_tx!(tx, |conn| ids
        .iter()
        .fold(
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str())),
            |q, id| q.bind(id.as_str())
        )
        .fetch_all(conn)
        .await)?;
    Ok(found.into_iter().collect())
}

/// The embedding source of experience `id`, if it exists (forgotten or not).
pub async fn embedding_source_in(
    tx: &mut Tx,
    id: &str,
) -> Result<Option<EmbeddingSource>, StoreError> {
    let sql = "SELECT project_id, title, summary, resolution, keywords, status \
               FROM experience_record WHERE id = $1";
    Ok(keyed!(on_tx, tx, query_as(sql), id, fetch_optional)?)
}

/// `$1, $2, …` for `n` parameters.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What decides whether one experience may become pattern evidence, read by id.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EvidenceFacts {
    pub project_id: String,
    pub kind: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub verification: String,
    pub status: String,
    pub source_state: String,
    /// Live and verified: evidence unless it is an unresolved issue.
    pub verified_and_live: bool,
}

pub async fn evidence_facts_in(
    tx: &mut crate::db::Tx,
    experience_id: &str,
) -> Result<Option<EvidenceFacts>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT project_id, kind, title, summary, resolution, verification, status, \
           source_state, CASE WHEN ",
        live_experience!(),
        " AND verification = 'verified' THEN TRUE ELSE FALSE END AS verified_and_live \
         FROM experience_record WHERE id = $1"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(experience_id)
        .fetch_optional(conn)
        .await)?)
}

/// One experience offered to the pattern miner.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct MiningInput {
    pub id: String,
    /// The project's commit-ordered experience sequence.
    pub seq: i64,
    pub kind: String,
    pub session_id: Option<String>,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub created_at: i64,
}

/// A window `(after, through]` of one project's experience sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqWindow<'a> {
    pub project_id: &'a str,
    pub after: i64,
    pub through: i64,
}

/// The project's newest experience `seq` (`None` before its first experience).
pub async fn newest_seq_in(
    tx: &mut crate::db::Tx,
    project_id: &str,
) -> Result<Option<i64>, crate::db::StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT MAX(seq) FROM experience_record WHERE project_id = $1"
    )
    .bind(project_id)
    .fetch_one(conn)
    .await)?)
}

/// How many active experiences (any verification) fall in `window`.
pub async fn active_count_in(
    tx: &mut crate::db::Tx,
    window: SeqWindow<'_>,
) -> Result<i64, crate::db::StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_record WHERE project_id = $1 AND status = 'active' \
         AND seq > $2 AND seq <= $3"
    )
    .bind(window.project_id)
    .bind(window.after)
    .bind(window.through)
    .fetch_one(conn)
    .await)?)
}

/// The experiences of `window` that may be evidence for a rule, oldest first, at most `limit`.
pub async fn evidence_inputs_in(
    tx: &mut crate::db::Tx,
    window: SeqWindow<'_>,
    limit: i64,
) -> Result<Vec<MiningInput>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT id, seq, kind, session_id, title, summary, resolution, created_at \
         FROM experience_record WHERE project_id = $1 AND ",
        evidence_experience!(),
        " AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(window.project_id)
        .bind(window.after)
        .bind(window.through)
        .bind(limit)
        .fetch_all(conn)
        .await)?)
}

/// The ids of the project's experiences past `after_seq` that may be evidence for a rule.
pub async fn evidence_ids_after_in(
    tx: &mut crate::db::Tx,
    project_id: &str,
    after_seq: i64,
) -> Result<Vec<String>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT id FROM experience_record WHERE project_id = $1 AND ",
        evidence_experience!(),
        " AND seq > $2 ORDER BY id"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(SQL)
        .bind(project_id)
        .bind(after_seq)
        .fetch_all(conn)
        .await)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_conditions_read_as_sql() {
        assert_eq!(
            live_experience!("e"),
            "e.status = 'active' AND e.source_state = 'current'"
        );
        assert_eq!(
            evidence_experience!(),
            "status = 'active' AND source_state = 'current' AND verification = 'verified' \
             AND kind <> 'unresolved_issue'"
        );
    }
}
