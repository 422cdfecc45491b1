//! `ExperienceRetriever`: project-first recall under a token budget, prompt receipts, and the
//! feedback loop that moves experiences up or down (the ranking rule and its constants are in
//! docs/adr/0005-recall-ranking-and-feedback.md).
//!
//! Query text only ever reaches the index as bounded quoted terms (`recall::search_terms`).
//! Automatic retrieval is confined to the session's project, returns at most `retrieval.max_items`
//! records within `retrieval.max_context_tokens` counted with a real tokenizer on the rendered
//! section, and persists the exact sections in a prompt receipt before they are returned.
//! Explicit search is pure: it changes no counts.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

pub(crate) mod store;

pub(crate) use store::CandidateRow;

use super::experience::{self, Experience, ExperienceRow, Verification};
use super::recall::floor::Floor;
use super::recall::index;
use super::recall::search_terms::{self, MatchMode, QueryTerms};
use super::recall::store::text::{self as text_store, RankRow, TextMatches, TextQuery};
use super::recall::{render, token_count};
use super::{events, policy, signals};
use crate::config::Config;
use crate::db::{Db, StoreError, Tx};

/// How many text matches are reranked.
const CANDIDATES: i64 = 40;
/// Short CJK terms fall back to a scan of the project's most recent records, bounded here.
const SHORT_TERM_SCAN: i64 = 2000;

/// Ranking constants (ADR 0005).
pub mod ranking {
    /// Weight of an unverified observation relative to a verified experience.
    pub const UNVERIFIED: f64 = 0.6;
    /// Recency half-life in days; recency contributes at most `RECENCY_SHARE` of the score.
    pub const HALF_LIFE_DAYS: f64 = 30.0;
    pub const RECENCY_SHARE: f64 = 0.3;
    /// Each earlier use adds a little (logarithmic) weight.
    pub const USE_WEIGHT: f64 = 0.05;
    /// The feedback rule (ADR 0005): a reinforced experience gains 0.1, a violated one loses
    /// 0.2 ...
    pub const REINFORCE: f64 = 0.1;
    pub const VIOLATE: f64 = 0.2;
    /// ... and is pruned from automatic retrieval once its score falls to this or it was violated
    /// more than `MAX_VIOLATIONS` times.
    pub const PRUNE_SCORE: f64 = -0.8;
    pub const MAX_VIOLATIONS: i64 = 3;
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchHit {
    /// The experience; its `evidence` is loaded for explicit search and left empty by
    /// `context`, which shows only [`SearchHit::source`].
    pub experience: Experience,
    /// Where the experience came from, as the prompt section shows it: project, session, and
    /// the first cited message (or the first citation's address).
    pub source: String,
    /// Text relevance in (0, 1], relative to the best match of this query.
    pub relevance: f64,
    /// The final ranking score.
    pub score: f64,
}

impl CandidateRow {
    /// The source label of this candidate (see [`SearchHit::source`]).
    pub(crate) fn source(&self) -> String {
        source_label(
            &self.record.project_id,
            self.record.session_id.as_deref(),
            self.source_message.as_deref(),
            self.source_address.as_deref(),
        )
    }
}

/// Whether ranked hits carry their evidence rows (explicit search answers with them; `context`
/// renders only the source label, which the candidate row carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvidenceRows {
    Load,
    Skip,
}

/// Experiences from `rows`, with their evidence rows when asked.
pub(crate) async fn experiences(
    db: &Db,
    rows: Vec<ExperienceRow>,
    evidence: EvidenceRows,
) -> Result<Vec<Experience>, StoreError> {
    match evidence {
        EvidenceRows::Load => experience::with_evidence(db, rows).await,
        EvidenceRows::Skip => experience::without_evidence(rows).await,
    }
}

/// `text LIKE '%needle%'` as SQLite evaluates it for a literal needle: a substring test that
/// folds ASCII letters only.
fn like_contains(text: &str, needle: &str) -> bool {
    if !needle.bytes().any(|b| b.is_ascii_alphabetic()) {
        return text.contains(needle);
    }
    text.to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

/// Text candidates of one project, best first, with their relevance: recall-index document
/// numbers, or experience ids from the full-text indexes.
enum TextCandidates {
    Indexed(Vec<(i64, f64)>),
    Stored(Vec<(String, f64)>),
}

impl TextCandidates {
    fn is_empty(&self) -> bool {
        match self {
            TextCandidates::Indexed(found) => found.is_empty(),
            TextCandidates::Stored(found) => found.is_empty(),
        }
    }
}

/// Text candidates of one project for `terms`.
async fn text_candidates(
    db: &Db,
    project_id: &str,
    terms: &QueryTerms,
    mode: MatchMode,
    bigrams: &[String],
) -> Result<TextCandidates, StoreError> {
    // `any` matching ranks from the recall index (one posting list per key, ADR 0005); `all`
    // matching, and any project whose index is too far behind, from the full-text indexes.
    if mode == MatchMode::Any
        && let Some(ranked) = index_candidates(db, project_id, terms, bigrams).await?
    {
        return Ok(TextCandidates::Indexed(ranked));
    }
    let mut short = terms.short_cjk_terms();
    short.extend(bigrams.iter().map(String::as_str));
    let query = TextQuery {
        project_id,
        terms,
        mode,
        bigrams,
        limit: CANDIDATES,
        recent_scan: (!short.is_empty()).then_some(SHORT_TERM_SCAN),
    };
    let mut found = Candidates::default();
    match text_store::matches(db, &query).await? {
        TextMatches::Sqlite {
            words,
            trigrams,
            recent,
        } => {
            found.keep(words, 1.0);
            found.keep(trigrams, 0.8);
            if !recent.is_empty() {
                keep_recent_substrings(&recent, &short, &mut found);
            }
        }
        TextMatches::Postgres { words, substrings } => {
            found.keep(words, 1.0);
            found.keep(substrings, 0.7);
        }
    }
    Ok(TextCandidates::Stored(found.ranked()))
}

/// The recall index's best [`CANDIDATES`], relevance relative to the best; `None` while the
/// project's index is too far behind to answer.
async fn index_candidates(
    db: &Db,
    project_id: &str,
    terms: &QueryTerms,
    bigrams: &[String],
) -> Result<Option<Vec<(i64, f64)>>, StoreError> {
    let keys = index::query_keys(terms, bigrams);
    let Some(ranked) = index::top_documents(db, project_id, &keys, CANDIDATES as usize).await?
    else {
        return Ok(None);
    };
    let best = ranked
        .first()
        .map_or(f64::MIN_POSITIVE, |(_, score)| score.max(f64::MIN_POSITIVE));
    Ok(Some(
        ranked
            .into_iter()
            .map(|(id, score)| (id, (score / best).clamp(0.01, 1.0)))
            .collect(),
    ))
}

/// Full-text candidates from several queries: each query's relevance is made relative to its
/// own best match and scaled by how much that query's matches are trusted; a record found by
/// several keeps its best.
#[derive(Default)]
struct Candidates(HashMap<String, f64>);

impl Candidates {
    fn keep(&mut self, rows: Vec<RankRow>, scale: f64) {
        let best = rows
            .iter()
            .map(|r| r.relevance)
            .fold(f64::MIN, f64::max)
            .max(f64::MIN_POSITIVE);
        for row in rows {
            let relevance = (row.relevance / best).clamp(0.01, 1.0) * scale;
            let entry = self.0.entry(row.id).or_insert(0.0);
            *entry = entry.max(relevance);
        }
    }

    /// Best first, ties by id.
    fn ranked(self) -> Vec<(String, f64)> {
        let mut ranked: Vec<(String, f64)> = self.0.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
    }
}

/// SQLite: short CJK terms and prompt bigrams, which neither full-text index can match, as
/// substrings of the project's most recent records: per term, the first [`CANDIDATES`] records
/// (newest first) containing it, as `LIKE '%term%'` would find them. The records are read once
/// for every term, and searched here instead of by one SQL `LIKE` scan per term.
fn keep_recent_substrings(
    recent: &[text_store::RecentRow],
    short: &[&str],
    found: &mut Candidates,
) {
    for term in short {
        let rows: Vec<RankRow> = recent
            .iter()
            .filter(|r| {
                like_contains(&r.title, term)
                    || like_contains(&r.summary, term)
                    || r.resolution
                        .as_deref()
                        .is_some_and(|t| like_contains(t, term))
                    || like_contains(&r.keywords, term)
            })
            .take(CANDIDATES as usize)
            .map(|r| RankRow {
                id: r.id.clone(),
                relevance: 1.0,
            })
            .collect();
        found.keep(rows, 0.5);
    }
}

pub(crate) fn final_score(relevance: f64, candidate: &CandidateRow, now: i64) -> f64 {
    use ranking::*;
    let signals = &candidate.record;
    let verification = if signals.verification == Verification::Verified {
        1.0
    } else {
        UNVERIFIED
    };
    let age_days = ((now - signals.created_at).max(0) as f64) / 86_400_000.0;
    let recency = 1.0 - RECENCY_SHARE + RECENCY_SHARE * 0.5_f64.powf(age_days / HALF_LIFE_DAYS);
    let uses = 1.0 + USE_WEIGHT * ((1 + signals.use_count.max(0)) as f64).ln();
    let feedback = (1.0 + candidate.feedback_score).clamp(0.2, 2.0);
    let confidence = 0.5 + 0.5 * signals.confidence.clamp(0.0, 1.0);
    relevance * verification * recency * uses * feedback * confidence
}

/// Searches one project's live experiences (not forgotten, sources unchanged). Read-only.
pub async fn search(
    db: &Db,
    project_id: &str,
    text: &str,
    limit: usize,
    mode: MatchMode,
    now: i64,
) -> Result<Vec<SearchHit>, StoreError> {
    let ranking = Ranking {
        mode,
        limit,
        now,
        floor: None,
        evidence: EvidenceRows::Load,
    };
    ranked(db, project_id, &search_terms::parse(text), ranking).await
}

/// How [`ranked`] matches, how many hits it keeps, and what it loads for them.
struct Ranking<'a> {
    mode: MatchMode,
    limit: usize,
    now: i64,
    /// Automatic recall's relevance floor; `None` for an explicit search.
    floor: Option<&'a Floor>,
    evidence: EvidenceRows,
}

async fn ranked(
    db: &Db,
    project_id: &str,
    terms: &QueryTerms,
    ranking: Ranking<'_>,
) -> Result<Vec<SearchHit>, StoreError> {
    let Ranking {
        mode,
        limit,
        now,
        floor,
        evidence,
    } = ranking;
    if terms.is_empty() {
        return Ok(Vec::new());
    }
    // Automatic recall also looks for the prompt's CJK character bigrams: Chinese words are
    // mostly two characters, shorter than a trigram window, and a prompt and a lesson that
    // share a word rarely share a three-character window.
    let bigrams = floor.map_or(&[][..], Floor::bigrams);
    let candidates = text_candidates(db, project_id, terms, mode, bigrams).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let rows = live_candidates(db, &candidates).await?;
    let mut scored: Vec<(CandidateRow, f64, f64)> = rows
        .into_iter()
        .filter(|(c, _)| c.record.project_id == project_id && admitted(c, floor))
        .map(|(c, r)| {
            let score = final_score(r, &c, now);
            (c, r, score)
        })
        .collect();
    scored.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.record.id.cmp(&b.0.record.id)));
    scored.truncate(limit);
    let (records, scores): (Vec<ExperienceRow>, Vec<(String, f64, f64)>) = scored
        .into_iter()
        .map(|(candidate, relevance, score)| {
            let source = candidate.source();
            (candidate.record, (source, relevance, score))
        })
        .unzip();
    let experiences = experiences(db, records, evidence).await?;
    let hits = experiences
        .into_iter()
        .zip(scores)
        .map(|(experience, (source, relevance, score))| SearchHit {
            experience,
            source,
            relevance,
            score,
        })
        .collect();
    Ok(hits)
}

/// The candidates that are live (active, sources unchanged) with everything ranking and
/// rendering need and their relevance, in one query.
async fn live_candidates(
    db: &Db,
    candidates: &TextCandidates,
) -> Result<Vec<(CandidateRow, f64)>, StoreError> {
    match candidates {
        TextCandidates::Stored(found) => {
            let ids = found.iter().map(|(id, _)| id.as_str());
            let rows = store::live_candidates_by_id(db, ids).await?;
            let relevance: HashMap<&str, f64> =
                found.iter().map(|(id, r)| (id.as_str(), *r)).collect();
            Ok(rows
                .into_iter()
                .map(|row| {
                    let r = relevance
                        .get(row.record.id.as_str())
                        .copied()
                        .unwrap_or(0.0);
                    (row, r)
                })
                .collect())
        }
        TextCandidates::Indexed(found) => {
            let nums = found.iter().map(|(num, _)| *num);
            let rows = store::live_candidates_by_number(db, nums).await?;
            let relevance: HashMap<i64, f64> = found.iter().copied().collect();
            Ok(rows
                .into_iter()
                .map(|row| {
                    let r = relevance.get(&row.recall_num).copied().unwrap_or(0.0);
                    (row.candidate, r)
                })
                .collect())
        }
    }
}

/// Automatic recall (a prompt, with its relevance `floor`; not an explicit search) leaves out
/// experiences pruned by feedback and those the floor does not admit.
fn admitted(candidate: &CandidateRow, floor: Option<&Floor>) -> bool {
    let Some(floor) = floor else {
        return true;
    };
    if candidate.violations > ranking::MAX_VIOLATIONS
        || candidate.feedback_score <= ranking::PRUNE_SCORE
    {
        return false;
    }
    let record = &candidate.record;
    let text = format!(
        "{}\n{}\n{}",
        record.title,
        record.summary,
        record.resolution.as_deref().unwrap_or("")
    );
    floor.admits(&text, &record.keywords)
}

/// One prompt section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Section {
    /// `memory.global`, `memory.project` or `learning.experiences`.
    pub name: String,
    pub content: String,
    pub tokens: usize,
    /// The memory document revision the section shows (memory sections).
    pub revision: Option<i64>,
}

/// Why automatic retrieval inserted nothing although matches existed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetrievalSkipped {
    pub code: String,
    /// Tokens the framed section with its cheapest match needs.
    pub required_tokens: usize,
    /// `learning.retrieval.max_context_tokens`.
    pub configured_tokens: usize,
    /// True when this is the session's first such notice (reported once per session).
    pub first_in_session: bool,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptContext {
    pub receipt_id: String,
    pub session_id: String,
    pub project_id: String,
    pub use_memories: bool,
    pub sections: Vec<Section>,
    /// Experiences inserted, in order.
    pub experience_ids: Vec<String>,
    pub skipped: Option<RetrievalSkipped>,
}

/// A persisted receipt: exactly what a request's prompt contained.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    pub id: String,
    pub session_id: Option<String>,
    pub project_id: String,
    pub sections: Vec<Section>,
    #[schema(value_type = Object)]
    pub memory_revisions: serde_json::Value,
    pub experience_ids: Vec<String>,
    #[schema(value_type = Object)]
    pub retrieval: serde_json::Value,
    pub created_at: i64,
}

fn source_label(
    project_id: &str,
    session_id: Option<&str>,
    first_message: Option<&str>,
    first_address: Option<&str>,
) -> String {
    let mut label = format!("project {project_id}");
    if let Some(session) = session_id {
        label.push_str(&format!(" · session {session}"));
    }
    if let Some(message) = first_message {
        label.push_str(&format!(" · message {message}"));
    } else if let Some(address) = first_address {
        label.push_str(&format!(" · {address}"));
    }
    label
}

fn rendered_item<'a>(experience: &'a Experience, source: &'a str) -> render::RenderedItem<'a> {
    render::RenderedItem {
        id: &experience.id,
        kind: experience.kind.as_str(),
        verification: experience.verification.as_str(),
        source,
        title: &experience.title,
        summary: &experience.summary,
        resolution: experience.resolution.as_deref(),
        sha256: &experience.content_digest,
    }
}

fn render_experiences(selected: &[&SearchHit]) -> String {
    let items: Vec<render::RenderedItem<'_>> = selected
        .iter()
        .map(|hit| rendered_item(&hit.experience, &hit.source))
        .collect();
    render::experiences_section(&items)
}

/// Tokens of the section's frame: the section with no item.
fn frame_tokens() -> usize {
    static FRAME: LazyLock<usize> =
        LazyLock::new(|| token_count::count(&render::experiences_section(&[])));
    *FRAME
}

/// What [`select_within_budget`] chose, with the rendered section's token count.
struct Selection<'a> {
    selected: Vec<&'a SearchHit>,
    /// Tokens of the section rendered from `selected` (its frame alone when empty).
    tokens: usize,
    /// When nothing fits: the tokens the cheapest match would need.
    required: Option<usize>,
}

/// The greedy budget rule: in rank order, each experience joins if the section with it still
/// fits. A section's count is its frame's plus its items' (see [`render::experience_item`]), so
/// each candidate is rendered and counted once, not once per section it is tried in; one whose
/// [`token_count::lower_bound`] already rules it out is not counted at all.
fn select(ranked: &[SearchHit], max_items: usize, max_tokens: usize) -> Selection<'_> {
    let mut selected: Vec<&SearchHit> = Vec::new();
    let mut used = frame_tokens();
    let mut cheapest: Option<usize> = None;
    for hit in ranked {
        if selected.len() >= max_items {
            break;
        }
        let item = render::experience_item(&rendered_item(&hit.experience, &hit.source));
        // An item whose token floor already exceeds what is left (or, while nothing fits, the
        // cheapest cost so far) changes nothing and is not counted.
        let floor = used + token_count::lower_bound(&item);
        let skip =
            floor > max_tokens && (!selected.is_empty() || cheapest.is_some_and(|c| floor >= c));
        if skip {
            continue;
        }
        let cost = used + token_count::count(&item);
        if selected.is_empty() {
            cheapest = Some(cheapest.map_or(cost, |c: usize| c.min(cost)));
        }
        if cost <= max_tokens {
            selected.push(hit);
            used = cost;
        }
    }
    debug_assert_eq!(
        used,
        token_count::count(&render_experiences(&selected)),
        "section tokens are frame plus items"
    );
    let required = if selected.is_empty() { cheapest } else { None };
    Selection {
        selected,
        tokens: used,
        required,
    }
}

/// Chooses experiences in rank order while the rendered section stays within the budget.
/// Returns the selection and, when nothing fits, the tokens the cheapest match would need.
pub fn select_within_budget(
    ranked: &[SearchHit],
    max_items: usize,
    max_tokens: usize,
) -> (Vec<&Experience>, Option<usize>) {
    let selection = select(ranked, max_items, max_tokens);
    (
        selection
            .selected
            .into_iter()
            .map(|hit| &hit.experience)
            .collect(),
        selection.required,
    )
}

/// Assembles the prompt context for a session's next model request (the `/context` call): the
/// resident Memory sections and retrieved experiences, under the session's `use_memories`
/// policy and `learning.use`; persists the receipt first, records the retrieval snapshot and use
/// counts, and applies the reinforce/violate rule to the previous receipt's experiences.
pub async fn assemble(
    db: &Db,
    config: &Config,
    session_id: &str,
    prompt: &str,
    now: i64,
) -> Result<Option<PromptContext>, StoreError> {
    let started = std::time::Instant::now();
    let Some(project_id) = store::session_project(db, session_id).await? else {
        return Ok(None);
    };
    let session_policy = policy::effective(db, session_id, &config.learning, now).await?;
    let use_memories = session_policy.use_memories && config.learning.use_enabled();
    // Memory and retrieval read independently (each on its own pooled connection), so they
    // overlap: Memory's reads cost nothing on top of the text search's.
    let ((mut sections, memory_revisions), retrieved) = if use_memories {
        tokio::try_join!(
            memory_sections(db, &project_id),
            retrieve(db, config, &project_id, prompt, now)
        )?
    } else {
        let nothing = Retrieved {
            snapshot: serde_json::json!({}),
            ..Retrieved::default()
        };
        ((Vec::new(), serde_json::Map::new()), nothing)
    };
    sections.extend(retrieved.section);
    let mut context = PromptContext {
        receipt_id: crate::ids::new_id("rcp"),
        session_id: session_id.to_owned(),
        project_id,
        use_memories,
        sections,
        experience_ids: retrieved.experience_ids,
        skipped: retrieved.skipped,
    };
    let mut tx = db.begin().await?;
    apply_feedback_loop_in(&mut tx, session_id, prompt).await?;
    write_receipt_in(
        &mut tx,
        &mut context,
        memory_revisions,
        &retrieved.snapshot,
        now,
    )
    .await?;
    tx.commit().await?;
    let metrics = crate::telemetry::metrics::retrieval();
    metrics.latency(started.elapsed());
    metrics.selected(context.experience_ids.len() as u64);
    Ok(Some(context))
}

/// The resident Memory sections of a project's prompt, with the revisions they show.
async fn memory_sections(
    db: &Db,
    project_id: &str,
) -> Result<(Vec<Section>, serde_json::Map<String, serde_json::Value>), StoreError> {
    let mut sections = Vec::new();
    let mut revisions = serde_json::Map::new();
    for (name, document) in crate::memory::store::prompt_documents(db, project_id).await? {
        revisions.insert(name.to_owned(), serde_json::json!(document.revision));
        if document.entries.is_empty() {
            continue;
        }
        let entries: Vec<&str> = document
            .entries
            .iter()
            .map(|e| e.content.as_str())
            .collect();
        let content = render::memory_section(name, document.revision, &entries);
        sections.push(Section {
            name: name.to_owned(),
            tokens: token_count::count(&content),
            content,
            revision: Some(document.revision),
        });
    }
    Ok((sections, revisions))
}

/// What automatic retrieval chose for one prompt.
#[derive(Default)]
struct Retrieved {
    /// The `learning.experiences` section, when anything was selected.
    section: Option<Section>,
    experience_ids: Vec<String>,
    skipped: Option<RetrievalSkipped>,
    /// The receipt's `retrieval` snapshot: terms, candidates, selection, budget.
    snapshot: serde_json::Value,
}

/// Ranks the project's experiences for `prompt` (with the optional semantic layer) and selects
/// what fits the item limit and token budget.
async fn retrieve(
    db: &Db,
    config: &Config,
    project_id: &str,
    prompt: &str,
    now: i64,
) -> Result<Retrieved, StoreError> {
    let retrieval = &config.learning.retrieval;
    let terms = search_terms::parse(prompt);
    let floor = Floor::of(prompt);
    let ranking = Ranking {
        mode: MatchMode::Any,
        limit: CANDIDATES as usize,
        now,
        floor: Some(&floor),
        evidence: EvidenceRows::Skip,
    };
    let lexical = ranked(db, project_id, &terms, ranking).await?;
    // The optional semantic layer fuses its vector ranking in (no-op when unconfigured).
    let (ranked, semantic) =
        super::recall::semantic::recall_for_context(db, config, project_id, prompt, lexical, now)
            .await?;
    let Selection {
        selected,
        tokens: section_tokens,
        required,
    } = select(
        &ranked,
        retrieval.max_items as usize,
        retrieval.max_context_tokens as usize,
    );
    let mut snapshot = serde_json::json!({
        "terms": terms.texts(),
        "candidates": ranked.iter().map(|h| serde_json::json!({
            "id": h.experience.id,
            "relevance": h.relevance,
            "score": h.score,
        })).collect::<Vec<_>>(),
        "selected": selected.iter().map(|hit| hit.experience.id.clone()).collect::<Vec<_>>(),
        "maxItems": retrieval.max_items,
        "maxContextTokens": retrieval.max_context_tokens,
    });
    if let Some(semantic) = semantic {
        snapshot["semantic"] = semantic;
    }
    let mut retrieved = Retrieved::default();
    if !selected.is_empty() {
        retrieved.section = Some(Section {
            name: String::from("learning.experiences"),
            tokens: section_tokens,
            content: render_experiences(&selected),
            revision: None,
        });
        retrieved.experience_ids = selected
            .iter()
            .map(|hit| hit.experience.id.clone())
            .collect();
    } else if let Some(required) = required {
        retrieved.skipped = Some(RetrievalSkipped {
            code: String::from("learning.retrieval_skipped"),
            required_tokens: required,
            configured_tokens: retrieval.max_context_tokens as usize,
            first_in_session: false,
        });
        snapshot["skipped"] = serde_json::json!({"requiredTokens": required, "configuredTokens": retrieval.max_context_tokens});
    }
    retrieved.snapshot = snapshot;
    Ok(retrieved)
}

/// Persists `context` as a prompt receipt in the caller's transaction, counts the use of the
/// experiences it carries, and records the selection (and a first skip notice per session).
async fn write_receipt_in(
    tx: &mut Tx,
    context: &mut PromptContext,
    memory_revisions: serde_json::Map<String, serde_json::Value>,
    snapshot: &serde_json::Value,
    now: i64,
) -> Result<(), StoreError> {
    let receipt = store::ReceiptRow {
        id: context.receipt_id.clone(),
        session_id: Some(context.session_id.clone()),
        project_id: context.project_id.clone(),
        sections: serde_json::to_string(&context.sections).unwrap_or_default(),
        memory_revisions: serde_json::Value::Object(memory_revisions).to_string(),
        experience_ids: serde_json::to_string(&context.experience_ids).unwrap_or_default(),
        retrieval: snapshot.to_string(),
        created_at: now,
    };
    store::insert_receipt_in(tx, &receipt).await?;
    store::count_uses_in(tx, &context.experience_ids, now).await?;
    let scope = events::EventScope {
        project_id: Some(&context.project_id),
        session_id: Some(&context.session_id),
        ..Default::default()
    };
    if let Some(skip) = &mut context.skipped {
        let earlier = store::skip_notices_in(tx, &context.session_id).await?;
        skip.first_in_session = earlier == 0;
        if skip.first_in_session {
            let detail = serde_json::json!({
                "receiptId": context.receipt_id,
                "requiredTokens": skip.required_tokens,
                "configuredTokens": skip.configured_tokens,
            });
            events::append_in(tx, "learning.retrieval_skipped", &scope, &detail, now).await?;
        }
        crate::telemetry::metrics::retrieval().skipped();
    }
    let detail = serde_json::json!({
        "receiptId": context.receipt_id,
        "selected": context.experience_ids,
        "skipped": context.skipped,
    });
    events::append_in(tx, "learning.retrieval.selection", &scope, &detail, now).await?;
    Ok(())
}

/// The feedback loop (ADR 0005), with observable signals instead of embeddings: when the user's
/// next prompt
/// carries an explicit correction, the experiences injected into the previous request are
/// violated (−0.2); when it carries praise, they are reinforced (+0.1).
async fn apply_feedback_loop_in(
    tx: &mut Tx,
    session_id: &str,
    prompt: &str,
) -> Result<(), StoreError> {
    let Some(signal) = signals::strongest(prompt) else {
        return Ok(());
    };
    let delta = match signal.kind.strength() {
        signals::Strength::Strong => -ranking::VIOLATE,
        signals::Strength::Weak => ranking::REINFORCE,
        signals::Strength::Medium => return Ok(()),
    };
    let previous = store::latest_receipt_experiences_in(tx, session_id).await?;
    let ids: Vec<String> = previous
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    for id in ids {
        adjust_in(tx, &id, delta).await?;
    }
    Ok(())
}

/// Reinforces (delta > 0) or violates (delta < 0) one experience.
pub async fn adjust_in(tx: &mut Tx, experience_id: &str, delta: f64) -> Result<(), StoreError> {
    let (reinforcements, violations) = if delta > 0.0 { (1, 0) } else { (0, 1) };
    let feedback = store::Feedback {
        delta,
        reinforcements,
        violations,
    };
    store::add_feedback_in(tx, experience_id, feedback).await
}

/// Replays a receipt: its exact sections, without consulting the index.
pub async fn receipt(db: &Db, id: &str) -> Result<Option<Receipt>, StoreError> {
    let Some(row) = store::receipt(db, id).await? else {
        return Ok(None);
    };
    let store::ReceiptRow {
        id,
        session_id,
        project_id,
        sections,
        memory_revisions: revisions,
        experience_ids: experiences,
        retrieval,
        created_at,
    } = row;
    let corrupt = |what: &str| StoreError::Corrupt(format!("prompt_receipt {id}: {what}"));
    Ok(Some(Receipt {
        sections: serde_json::from_str(&sections).map_err(|_| corrupt("sections"))?,
        memory_revisions: serde_json::from_str(&revisions)
            .map_err(|_| corrupt("memory_revisions"))?,
        experience_ids: serde_json::from_str(&experiences)
            .map_err(|_| corrupt("experience_ids"))?,
        retrieval: serde_json::from_str(&retrieval).map_err(|_| corrupt("retrieval"))?,
        id,
        session_id,
        project_id,
        created_at,
    }))
}
