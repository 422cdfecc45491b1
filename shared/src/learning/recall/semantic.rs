//! The optional semantic recall layer: experience vectors in the database, `embed` jobs that
//! compute them, and the vector side of `context`'s recall.
//!
//! - Vectors are unit-normalized `f32`s stored little-endian (SQLite `BLOB`, Postgres `BYTEA`)
//!   per `(experience, model)` with their length and the digest of the text they were computed
//!   from ([`embedding_text`]). Cosine similarity is then a dot product.
//! - [`admit_in`] queues the `embed` job of a newly stored experience (only when an embeddings
//!   provider is configured); [`backfill`] queues it for every live experience without a vector
//!   of the configured model. Both go through the ledger, whose identity per
//!   `(experience, model)` makes admission idempotent.
//! - [`nearest`] compares the query vector with a project's newest vectors of one model, at most
//!   `embeddings.max_scan` of them: a bounded scan, no vector index needed.
//! - [`recall_for_context`] embeds the prompt and fuses the vector ranking with the lexical one
//!   ([`super::fusion`]). Without an embeddings provider it returns the lexical ranking as is
//!   and sends nothing anywhere.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::fusion::{self, FusedEntry};
use super::store::vectors::{self, NewVector, UnembeddedPage};
use crate::config::{Config, EmbeddingsConfig};
use crate::db::{Db, StoreError, Tx};
use crate::learning::experience::ExperienceRow;
use crate::learning::retrieval::{
    CandidateRow, EvidenceRows, SearchHit, experiences, final_score, ranking,
    store as retrieval_store,
};
use crate::ledger::{Admission, JobIdentity, JobOrigin, Ledger, LedgerError, NewJob};
use crate::provider::EmbeddingClient;

/// How many nearest vectors take part in fusion.
const VECTOR_CANDIDATES: usize = 40;
/// Experiences read per backfill page.
const BACKFILL_PAGE: i64 = 500;

/// The text an experience is embedded from: what recall matches lexically (title, summary,
/// resolution and retrieval keywords).
pub fn embedding_text(
    title: &str,
    summary: &str,
    resolution: Option<&str>,
    keywords: &str,
) -> String {
    let mut text = format!("{title}\n{summary}");
    for part in [resolution.unwrap_or(""), keywords] {
        if !part.trim().is_empty() {
            text.push('\n');
            text.push_str(part);
        }
    }
    text
}

/// SHA-256 (hex) of an embedded text.
pub fn text_digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `vector` scaled to unit length (a zero vector stays zero).
pub fn normalized(vector: &[f32]) -> Vec<f32> {
    let norm = vector
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return vector.to_vec();
    }
    vector
        .iter()
        .map(|x| (f64::from(*x) / norm) as f32)
        .collect()
}

/// Little-endian `f32`s.
pub fn encode(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inverse of [`encode`]; `None` when the length is not a whole number of `f32`s.
pub fn decode(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Dot product of two unit vectors (their cosine similarity); `None` when the lengths differ.
pub fn cosine_of_unit(a: &[f32], b: &[f32]) -> Option<f64> {
    (a.len() == b.len()).then(|| {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    })
}

/// [`cosine_of_unit`] of `unit` and an [`encode`]d unit vector, read in place (the scan decodes
/// no vector); `None` when the lengths differ.
fn dot_with_encoded(unit: &[f32], bytes: &[u8]) -> Option<f64> {
    (bytes.len() == unit.len() * 4).then(|| {
        let sum: f32 = bytes
            .chunks_exact(4)
            .zip(unit)
            .map(|(c, y)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * y)
            .sum();
        f64::from(sum)
    })
}

/// Queues the `embed` job of one stored experience, inside the caller's transaction. Does
/// nothing (and returns `None`) without an embeddings provider.
pub async fn admit_in(
    ledger: &Ledger,
    tx: &mut Tx,
    config: &Config,
    project_id: &str,
    experience_id: &str,
    origin: JobOrigin,
) -> Result<Option<Admission>, LedgerError> {
    let Some(embeddings) = &config.embeddings else {
        return Ok(None);
    };
    let job = new_job(project_id, experience_id, &embeddings.model, origin);
    Ok(Some(ledger.admit_in(tx, job).await?))
}

fn new_job(project_id: &str, experience_id: &str, model: &str, origin: JobOrigin) -> NewJob {
    NewJob::new(JobIdentity::embed(project_id, experience_id, model), origin)
        .with_payload(json!({ "experienceId": experience_id, "model": model }))
}

/// What [`backfill`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backfill {
    /// Whether an embeddings provider is configured (nothing is queued without one).
    pub configured: bool,
    /// Live experiences without a vector of the model.
    pub missing: u64,
    /// Jobs admitted now.
    pub queued: u64,
    /// Jobs that already existed (queued, running, or settled earlier).
    pub existing: u64,
}

/// Queues an `embed` job (origin `legacy`, behind fresh work) for every live experience (of
/// `project_id`, or of every project) that has no vector of the configured model. Idempotent;
/// does nothing without an embeddings provider.
pub async fn backfill(
    ledger: &Ledger,
    config: &Config,
    project_id: Option<&str>,
) -> Result<Backfill, LedgerError> {
    let Some(embeddings) = &config.embeddings else {
        return Ok(Backfill::default());
    };
    let db = ledger.db();
    let mut report = Backfill {
        configured: true,
        ..Backfill::default()
    };
    let mut after: (i64, String) = (i64::MIN, String::new());
    loop {
        let page = UnembeddedPage {
            model: &embeddings.model,
            project_id,
            after: (after.0, &after.1),
            limit: BACKFILL_PAGE,
        };
        let rows = vectors::unembedded(db, &page).await?;
        let Some(last) = rows.last() else {
            return Ok(report);
        };
        after = (last.created_at, last.id.clone());
        let jobs = rows
            .iter()
            .map(|row| {
                new_job(
                    &row.project_id,
                    &row.id,
                    &embeddings.model,
                    JobOrigin::Legacy,
                )
            })
            .collect();
        for admission in ledger.admit_batch(jobs).await? {
            report.missing += 1;
            if admission.is_new() {
                report.queued += 1;
            } else {
                report.existing += 1;
            }
        }
    }
}

/// Stores (or replaces) the vector of one experience for one model, unit-normalized.
pub async fn store_in(
    tx: &mut Tx,
    experience_id: &str,
    project_id: &str,
    model: &str,
    vector: &[f32],
    content_digest: &str,
    now: i64,
) -> Result<(), StoreError> {
    let unit = normalized(vector);
    let stored = NewVector {
        experience_id,
        project_id,
        model,
        dims: unit.len(),
        encoded: &encode(&unit),
        content_digest,
        now,
    };
    vectors::upsert_in(tx, &stored).await
}

/// The digest of the text an experience's stored vector was computed from, if it has one.
pub async fn stored_digest_in(
    tx: &mut Tx,
    experience_id: &str,
    model: &str,
) -> Result<Option<String>, StoreError> {
    vectors::stored_digest_in(tx, experience_id, model).await
}

/// The `limit` most similar of a project's newest `max_scan` vectors of `model`, most similar
/// first, as `(experience id, cosine similarity)`.
pub async fn nearest(
    db: &Db,
    project_id: &str,
    model: &str,
    query: &[f32],
    max_scan: u32,
    limit: usize,
) -> Result<Vec<(String, f64)>, StoreError> {
    let unit = normalized(query);
    let rows = vectors::newest(db, project_id, model, max_scan).await?;
    let mut scored: Vec<(String, f64)> = rows
        .into_iter()
        .filter_map(|row| Some((row.experience_id, dot_with_encoded(&unit, &row.vector)?)))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.truncate(limit);
    Ok(scored)
}

/// Live, unpruned experiences of `project_id` among `nearest`, as hits ranked like lexical
/// ones (similarity in place of text relevance), best first, with their similarity.
async fn vector_hits(
    db: &Db,
    project_id: &str,
    nearest: &[(String, f64)],
    now: i64,
) -> Result<Vec<(SearchHit, f64)>, StoreError> {
    if nearest.is_empty() {
        return Ok(Vec::new());
    }
    let ids = nearest.iter().map(|(id, _)| id.as_str());
    let rows = retrieval_store::live_candidates_by_id(db, ids).await?;
    let similarity: HashMap<&str, f64> = nearest.iter().map(|(id, s)| (id.as_str(), *s)).collect();
    let mut scored: Vec<(CandidateRow, f64, f64)> = rows
        .into_iter()
        .filter(|c| c.record.project_id == project_id)
        .filter(|c| {
            c.violations <= ranking::MAX_VIOLATIONS && c.feedback_score > ranking::PRUNE_SCORE
        })
        .map(|c| {
            let s = similarity.get(c.record.id.as_str()).copied().unwrap_or(0.0);
            let score = final_score(s.max(0.0), &c, now);
            (c, s, score)
        })
        .collect();
    scored.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.record.id.cmp(&b.0.record.id)));
    let (records, scores): (Vec<ExperienceRow>, Vec<(String, f64, f64)>) = scored
        .into_iter()
        .map(|(c, s, score)| {
            let source = c.source();
            (c.record, (source, s, score))
        })
        .unzip();
    // `context` renders the source label only; no evidence rows are needed.
    let experiences = experiences(db, records, EvidenceRows::Skip).await?;
    Ok(experiences
        .into_iter()
        .zip(scores)
        .map(|(experience, (source, similarity, score))| {
            (
                SearchHit {
                    experience,
                    source,
                    relevance: similarity,
                    score,
                },
                similarity,
            )
        })
        .collect())
}

/// `context`'s recall with the semantic layer: the lexical ranking (already through the
/// relevance floor) fused by reciprocal rank with the vector ranking. Returns the ranking to
/// select from and, when the layer is configured, what it did for the receipt's retrieval
/// record. Without an embeddings provider the lexical ranking comes back untouched. When the
/// prompt cannot be embedded (provider down, deadline passed) recall stays lexical and the
/// record says why.
pub async fn recall_for_context(
    db: &Db,
    config: &Config,
    project_id: &str,
    prompt: &str,
    lexical: Vec<SearchHit>,
    now: i64,
) -> Result<(Vec<SearchHit>, Option<serde_json::Value>), StoreError> {
    let Some(embeddings) = &config.embeddings else {
        return Ok((lexical, None));
    };
    if prompt.trim().is_empty() {
        return Ok((lexical, None));
    }
    let query = match embed_prompt(embeddings, prompt).await {
        Ok(vector) => vector,
        Err(error) => {
            tracing::warn!(%error, model = %embeddings.model, "prompt embedding failed; recall stays lexical");
            crate::telemetry::metrics::provider().error("embeddings", "embed_prompt");
            let record = json!({ "model": embeddings.model, "error": error.to_string() });
            return Ok((lexical, Some(record)));
        }
    };
    let nearest = nearest(
        db,
        project_id,
        &embeddings.model,
        &query,
        embeddings.max_scan,
        VECTOR_CANDIDATES,
    )
    .await?;
    let vector = vector_hits(db, project_id, &nearest, now).await?;
    let (fused, entries) =
        fusion::reciprocal_rank_fusion(lexical, vector, embeddings.min_similarity);
    let record = json!({
        "model": embeddings.model,
        "minSimilarity": embeddings.min_similarity,
        "k": fusion::RRF_K,
        "fused": entries.iter().map(FusedEntry::to_json).collect::<Vec<_>>(),
    });
    Ok((fused, Some(record)))
}

async fn embed_prompt(
    embeddings: &EmbeddingsConfig,
    prompt: &str,
) -> Result<Vec<f32>, crate::provider::ProviderError> {
    // The prompt is embedded as far as recall reads it.
    let text: String = prompt
        .chars()
        .take(super::search_terms::MAX_QUERY_CHARS)
        .collect();
    EmbeddingClient::new(embeddings.clone())
        .embed(&text, Duration::from_millis(embeddings.query_timeout_ms))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_little_endian() {
        let vector = vec![1.0_f32, -0.5, 0.25, f32::MIN_POSITIVE];
        let bytes = encode(&vector);
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[0..4], &1.0_f32.to_le_bytes());
        assert_eq!(decode(&bytes), Some(vector));
        assert_eq!(decode(&bytes[..5]), None);
    }

    #[test]
    fn cosine_of_normalized_vectors() {
        let a = normalized(&[3.0, 4.0]);
        assert!((a[0] - 0.6).abs() < 1e-6 && (a[1] - 0.8).abs() < 1e-6);
        let b = normalized(&[4.0, -3.0]);
        assert!(cosine_of_unit(&a, &b).unwrap().abs() < 1e-6);
        assert!((cosine_of_unit(&a, &a).unwrap() - 1.0).abs() < 1e-6);
        assert_eq!(cosine_of_unit(&a, &[1.0]), None);
        let in_place = dot_with_encoded(&a, &encode(&b)).unwrap();
        assert!((in_place - cosine_of_unit(&a, &b).unwrap()).abs() < 1e-6);
        assert_eq!(dot_with_encoded(&a, &encode(&[1.0])), None);
        assert_eq!(normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn embedding_text_skips_empty_parts() {
        assert_eq!(embedding_text("T", "S", None, ""), "T\nS");
        assert_eq!(
            embedding_text("T", "S", Some("R"), "k1 k2"),
            "T\nS\nR\nk1 k2"
        );
    }
}
