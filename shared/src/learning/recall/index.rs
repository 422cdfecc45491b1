//! The recall index: per project and search key, the key's whole posting list in one row, so
//! automatic recall ranks a prompt by reading one row per key instead of scoring every
//! full-text match (docs/adr/0005-recall-ranking-and-feedback.md, "Candidates").
//!
//! **Keys.** Stored text is split exactly as [`search_terms::parse`] splits a prompt. A plain word
//! is keyed by its stem (`tests`, `testing` → `test`), an identifier (`foo.bar`, `src/a/b.rs`,
//! `snake_case`) by its whole lowercased text, so it meets the same identifier and not every
//! text that shares its parts; a run of CJK characters by its character bigrams (a single
//! character by itself), which is how Chinese words of two characters meet across phrasings.
//!
//! **Score.** BM25F with the column weights of the full-text ranking (title 5, summary 2,
//! resolution 1, keywords 1): a document's weighted count `f` of a key gives the impact
//! `f·(k1+1) / (f + k1·(1 − b + b·len/AVERAGE_LENGTH))`, stored with the posting; a query scores
//! `Σ idf(key)·impact` over its distinct keys, with `idf = ln(1 + (N − df + ½)/(df + ½))` over
//! the project's documents. The average length is a constant, not the corpus average, so an
//! impact never changes after it is written and the lists need no rebuild as a project grows.
//! Ties break by document number (the order experiences were first stored).
//!
//! **Freshness.** `experience_record` is the source of truth. Triggers (migration 0013) mark
//! every insert, text change and delete as pending in the writer's own transaction; indexing
//! ([`catch_up_in`]) takes pending rows in the indexer's transaction (on Postgres with
//! `SKIP LOCKED`, and under a lock on the project's row, so indexers in any number of processes
//! neither lose nor double an update). A reader ([`top`]) takes its project's pending records
//! into account from their text (their stale postings out, their current keys in), so its
//! ranking is always the one the fully caught-up index would give ([`exact_top`], which scores
//! the stored text directly, is the reference the tests compare it with); with more than
//! [`MAX_PENDING_SCORED`] pending records in the project it answers `None` and recall uses the
//! full-text indexes until the index catches up.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use super::search_terms::{self, MAX_TERM_CHARS, Piece, QueryTerms};
use super::store::index::{self as store, DocumentRow, IndexRow, ListKey, StoredLists};
use crate::db::{Db, StoreError, Tx};
use crate::text::stem::stem;

/// Column weights (ADR 0005): title, summary, resolution, keywords.
const WEIGHTS: [f64; 4] = [5.0, 2.0, 1.0, 1.0];
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// The document length (in pieces) at which length normalisation is neutral.
const AVERAGE_LENGTH: f64 = 50.0;
/// A reader scores at most this many pending records of its project from their text.
pub const MAX_PENDING_SCORED: usize = 64;
/// At most this many keys reach a query (16 terms, CJK terms as bigrams, prompt bigrams).
pub const MAX_QUERY_KEYS: usize = 48;

/// The searchable text of one experience.
#[derive(Debug, Clone, Copy)]
pub struct DocText<'a> {
    pub title: &'a str,
    pub summary: &'a str,
    pub resolution: Option<&'a str>,
    pub keywords: &'a str,
}

/// The key of a word or identifier: the stem of a plain ASCII word, else the whole piece,
/// truncated as query terms are.
fn word_key(word: &str) -> String {
    let word: String = word.chars().take(MAX_TERM_CHARS).collect();
    if word.chars().all(|c| c.is_ascii_alphanumeric()) {
        stem(&word)
    } else {
        word
    }
}

/// Keys of a CJK run: its character bigrams, or the character itself.
fn cjk_keys(run: &str) -> Vec<String> {
    let chars: Vec<char> = run.chars().collect();
    if chars.len() < 2 {
        return chars.iter().map(|c| c.to_string()).collect();
    }
    chars.windows(2).map(|pair| pair.iter().collect()).collect()
}

/// A document's keys with their impacts, sorted by key.
pub fn document_keys(doc: DocText<'_>) -> Vec<(String, f32)> {
    let mut counts: HashMap<String, f64> = HashMap::new();
    let mut length = 0usize;
    let columns = [
        doc.title,
        doc.summary,
        doc.resolution.unwrap_or(""),
        doc.keywords,
    ];
    for (text, weight) in columns.into_iter().zip(WEIGHTS) {
        search_terms::pieces(text, |piece| match piece {
            Piece::Word(word) => {
                length += 1;
                if !search_terms::is_stopword(&word) {
                    *counts.entry(word_key(&word)).or_default() += weight;
                }
            }
            Piece::Cjk(run) => {
                for key in cjk_keys(&run) {
                    length += 1;
                    *counts.entry(key).or_default() += weight;
                }
            }
        });
    }
    let norm = K1 * (1.0 - B + B * length as f64 / AVERAGE_LENGTH);
    let mut keys: Vec<(String, f32)> = counts
        .into_iter()
        .map(|(key, f)| (key, (f * (K1 + 1.0) / (f + norm)) as f32))
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    keys
}

/// The keys a query searches: its terms' keys, then the prompt's CJK bigrams (automatic
/// recall), without duplicates, at most [`MAX_QUERY_KEYS`].
pub fn query_keys(terms: &QueryTerms, bigrams: &[String]) -> Vec<String> {
    let mut keys = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |key: String| {
        if keys.len() < MAX_QUERY_KEYS && seen.insert(key.clone()) {
            keys.push(key);
        }
    };
    for term in &terms.terms {
        if term.cjk {
            cjk_keys(&term.text).into_iter().for_each(&mut push);
        } else {
            push(word_key(&term.text));
        }
    }
    bigrams.iter().cloned().for_each(push);
    keys
}

/// Encodes a posting list sorted by document number: per posting, the LEB128 gap to the
/// previous number and the impact as a little-endian `f32`.
fn encode(postings: &[(i64, f32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(postings.len() * 6);
    let mut previous = 0i64;
    for &(num, impact) in postings {
        let mut gap = (num - previous) as u64;
        previous = num;
        loop {
            let byte = (gap & 0x7f) as u8;
            gap >>= 7;
            if gap == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(&impact.to_le_bytes());
    }
    out
}

fn decode(bytes: &[u8]) -> Result<Vec<(i64, f32)>, StoreError> {
    let corrupt = || StoreError::Corrupt(String::from("recall_list: malformed posting list"));
    let mut postings = Vec::with_capacity(bytes.len() / 5);
    let (mut at, mut previous) = (0usize, 0i64);
    while at < bytes.len() {
        let (mut gap, mut shift) = (0u64, 0u32);
        loop {
            let byte = *bytes.get(at).ok_or_else(corrupt)?;
            at += 1;
            if shift > 63 {
                return Err(corrupt());
            }
            gap |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let impact = bytes.get(at..at + 4).ok_or_else(corrupt)?;
        at += 4;
        previous += gap as i64;
        let impact = f32::from_le_bytes([impact[0], impact[1], impact[2], impact[3]]);
        postings.push((previous, impact));
    }
    Ok(postings)
}

/// Ranks documents by `Σ idf·impact` over `lists` (one per query key, in query order, so every
/// document's sum is added up in the same order whichever path built the lists). Returns the
/// best `limit` as `(document number, score)`, ties by number.
fn rank(lists: &[Vec<(i64, f32)>], docs: usize, limit: usize) -> Vec<(i64, f64)> {
    let postings = lists.iter().map(Vec::len).sum();
    let mut scores: HashMap<i64, f64, BuildHasherDefault<NumHasher>> =
        HashMap::with_capacity_and_hasher(postings, BuildHasherDefault::default());
    for list in lists.iter().filter(|l| !l.is_empty()) {
        let df = list.len() as f64;
        let n = (docs as f64).max(df);
        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
        for &(num, impact) in list {
            *scores.entry(num).or_insert(0.0) += idf * f64::from(impact);
        }
    }
    let mut ranked: Vec<(i64, f64)> = scores.into_iter().collect();
    let order = |a: &(i64, f64), b: &(i64, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if ranked.len() > limit && limit > 0 {
        ranked.select_nth_unstable_by(limit - 1, order);
        ranked.truncate(limit);
    }
    ranked.truncate(limit);
    ranked.sort_by(order);
    ranked
}

/// A multiplicative hash for document numbers: the scoring map takes one insert per posting, and
/// SipHash's resistance to chosen keys buys nothing for numbers the database hands out.
#[derive(Default)]
struct NumHasher(u64);

impl Hasher for NumHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl DocumentRow {
    fn text(&self) -> DocText<'_> {
        DocText {
            title: self.title.as_deref().unwrap_or(""),
            summary: self.summary.as_deref().unwrap_or(""),
            resolution: self.resolution.as_deref(),
            keywords: self.keywords.as_deref().unwrap_or(""),
        }
    }
}

/// The best `limit` experiences of `project_id` for `keys` as `(experience id, score)`, best
/// first, exactly as a caught-up index ranks them; `None` when more than
/// [`MAX_PENDING_SCORED`] of the project's records wait for indexing.
pub async fn top(
    db: &Db,
    project_id: &str,
    keys: &[String],
    limit: usize,
) -> Result<Option<Vec<(String, f64)>>, StoreError> {
    match top_documents(db, project_id, keys, limit).await? {
        Some(ranked) => experience_ids(db, ranked).await.map(Some),
        None => Ok(None),
    }
}

/// [`top`] as document numbers (`recall_doc.num`), for a caller that reads the records by number
/// in its next statement anyway.
pub async fn top_documents(
    db: &Db,
    project_id: &str,
    keys: &[String],
    limit: usize,
) -> Result<Option<Vec<(i64, f64)>>, StoreError> {
    if keys.is_empty() || limit == 0 {
        return Ok(Some(Vec::new()));
    }
    let pending = store::pending_of(db, project_id, MAX_PENDING_SCORED as i64 + 1).await?;
    if pending.len() > MAX_PENDING_SCORED {
        return Ok(None);
    }
    let (indexed_docs, stored) = store::read_lists(db, project_id, keys).await?;
    let (lists, docs) = merge_pending(project_id, keys, indexed_docs, &stored, &pending)?;
    Ok(Some(rank(&lists, docs, limit)))
}

/// One key's postings: (document number, impact).
type PostingList = Vec<(i64, f32)>;

/// The posting list of each key as a caught-up index would hold it: stored postings of pending
/// records taken out, their current keys (scored from their text) put in. Returns the lists and
/// the project's document count after the same correction.
fn merge_pending(
    project_id: &str,
    keys: &[String],
    indexed_docs: usize,
    stored: &StoredLists,
    pending: &[DocumentRow],
) -> Result<(Vec<PostingList>, usize), StoreError> {
    let stale: HashSet<i64> = pending
        .iter()
        .filter(|row| row.indexed_project.as_deref() == Some(project_id))
        .map(|row| row.num)
        .collect();
    let fresh: Vec<(i64, HashMap<String, f32>)> = pending
        .iter()
        .filter(|row| row.project_id.as_deref() == Some(project_id))
        .map(|row| (row.num, document_keys(row.text()).into_iter().collect()))
        .collect();
    let docs = (indexed_docs + fresh.len()).saturating_sub(stale.len());
    let mut lists = Vec::with_capacity(keys.len());
    for key in keys {
        let mut list = match stored.get(key) {
            Some(bytes) => decode(bytes)?,
            None => Vec::new(),
        };
        if !stale.is_empty() {
            list.retain(|(num, _)| !stale.contains(num));
        }
        for (num, doc_keys) in &fresh {
            if let Some(&impact) = doc_keys.get(key) {
                list.push((*num, impact));
            }
        }
        lists.push(list);
    }
    Ok((lists, docs))
}

/// Maps ranked document numbers to experience ids, keeping the order.
async fn experience_ids(
    db: &Db,
    ranked: Vec<(i64, f64)>,
) -> Result<Vec<(String, f64)>, StoreError> {
    if ranked.is_empty() {
        return Ok(Vec::new());
    }
    let nums: Vec<i64> = ranked.iter().map(|(num, _)| *num).collect();
    let mut ids = store::experience_ids(db, &nums).await?;
    Ok(ranked
        .into_iter()
        .filter_map(|(num, score)| ids.remove(&num).map(|id| (id, score)))
        .collect())
}

/// The reference ranking: every record of the project scored from its stored text with the
/// same function [`top`] uses, without the index. Reads the whole project; for tests and
/// diagnostics, never on the request path.
pub async fn exact_top(
    db: &Db,
    project_id: &str,
    keys: &[String],
    limit: usize,
) -> Result<Vec<(String, f64)>, StoreError> {
    let rows = store::project_records(db, project_id).await?;
    let mut lists: Vec<Vec<(i64, f32)>> = vec![Vec::new(); keys.len()];
    let position: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    for row in &rows {
        let text = DocText {
            title: &row.title,
            summary: &row.summary,
            resolution: row.resolution.as_deref(),
            keywords: &row.keywords,
        };
        for (key, impact) in document_keys(text) {
            if let Some(&at) = position.get(key.as_str()) {
                lists[at].push((row.num, impact));
            }
        }
    }
    let ids: HashMap<i64, &str> = rows.iter().map(|r| (r.num, r.id.as_str())).collect();
    Ok(rank(&lists, rows.len(), limit)
        .into_iter()
        .filter_map(|(num, score)| ids.get(&num).map(|id| ((*id).to_owned(), score)))
        .collect())
}

/// What indexing a batch changes in one list.
#[derive(Default)]
struct ListChange {
    remove: Vec<i64>,
    insert: Vec<(i64, f32)>,
}

/// Indexes up to `limit` pending records in the caller's transaction; returns how many were
/// taken. Idempotent: a record indexed twice ends in the same lists.
pub async fn catch_up_in(tx: &mut Tx, limit: i64) -> Result<usize, StoreError> {
    let claimed = store::claim_pending_in(tx, limit).await?;
    if claimed.is_empty() {
        return Ok(0);
    }
    let rows = store::claimed_records_in(tx, &claimed).await?;
    let (changes, docs) = plan_changes(&rows);
    let live_projects = store::lock_projects_in(tx, changes.keys()).await?;
    for (project, lists) in &changes {
        if live_projects.contains(project) {
            apply_changes(tx, project, lists).await?;
        }
    }
    record_documents(tx, &docs, &live_projects).await?;
    for project in &live_projects {
        store::recount_documents_in(tx, project).await?;
    }
    Ok(claimed.len())
}

/// Project → key → change. The BTreeMaps keep projects and keys in one order, which is also the
/// order Postgres row locks are taken in.
type Changes = BTreeMap<String, BTreeMap<String, ListChange>>;
/// Per document number, its project and newline-joined keys once indexed (`None`: deleted).
type Documents = Vec<(i64, Option<(String, String)>)>;

/// What indexing `rows` changes: each record leaves the lists it was indexed under and joins
/// those of its current text.
fn plan_changes(rows: &[IndexRow]) -> (Changes, Documents) {
    let mut changes = Changes::new();
    let mut docs: Documents = Vec::with_capacity(rows.len());
    for IndexRow {
        document: row,
        indexed_keys,
    } in rows
    {
        if let (Some(project), Some(keys)) = (&row.indexed_project, indexed_keys) {
            let lists = changes.entry(project.clone()).or_default();
            for key in keys.split('\n').filter(|k| !k.is_empty()) {
                lists
                    .entry(key.to_owned())
                    .or_default()
                    .remove
                    .push(row.num);
            }
        }
        let Some(project) = &row.project_id else {
            docs.push((row.num, None));
            continue;
        };
        let keys = document_keys(row.text());
        let lists = changes.entry(project.clone()).or_default();
        for (key, impact) in &keys {
            lists
                .entry(key.clone())
                .or_default()
                .insert
                .push((row.num, *impact));
        }
        let joined: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        docs.push((row.num, Some((project.clone(), joined.join("\n")))));
    }
    (changes, docs)
}

/// Rewrites the project's changed lists: each read whole, its changed documents replaced.
async fn apply_changes(
    tx: &mut Tx,
    project: &str,
    lists: &BTreeMap<String, ListChange>,
) -> Result<(), StoreError> {
    let keys: Vec<&String> = lists.keys().collect();
    let stored = store::lists_in(tx, project, &keys).await?;
    for (key, change) in lists {
        let mut postings = match stored.get(key) {
            Some(bytes) => decode(bytes)?,
            None => Vec::new(),
        };
        let touched: HashSet<i64> = change
            .remove
            .iter()
            .chain(change.insert.iter().map(|(num, _)| num))
            .copied()
            .collect();
        postings.retain(|(num, _)| !touched.contains(num));
        postings.extend(change.insert.iter().copied());
        postings.sort_by_key(|(num, _)| *num);
        let encoded = (!postings.is_empty()).then(|| encode(&postings));
        let list = ListKey { project, key };
        store::put_list_in(tx, list, encoded.as_deref()).await?;
    }
    Ok(())
}

/// Records where each document is indexed now, or forgets a deleted one (and one whose project
/// is gone).
async fn record_documents(
    tx: &mut Tx,
    docs: &Documents,
    live_projects: &BTreeSet<String>,
) -> Result<(), StoreError> {
    for (num, indexed) in docs {
        let indexed = indexed
            .as_ref()
            .filter(|(project, _)| live_projects.contains(project))
            .map(|(project, keys)| store::Indexed { project, keys });
        store::set_document_in(tx, *num, indexed).await?;
    }
    Ok(())
}

/// Indexes every pending record, `batch` per transaction; returns how many were taken.
pub async fn catch_up(db: &Db, batch: i64) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let mut tx = db.begin().await?;
        let taken = catch_up_in(&mut tx, batch).await?;
        tx.commit().await?;
        total += taken;
        if taken == 0 {
            return Ok(total);
        }
    }
}

/// Records per transaction of the background drain.
const DRAIN_BATCH: i64 = 256;
/// How often the background drain looks for pending records when nothing wakes it: changes made
/// by another process (an edit, a deletion) reach the index within this interval.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// The least time between the starts of two drain passes. Every settlement in the process wakes
/// the drain, but settlements index their own records, so a pass per settlement would cost three
/// statements each time to find nothing; wakes within this gap share one pass.
const MIN_PASS_GAP: std::time::Duration = std::time::Duration::from_millis(250);

/// Keeps the recall index caught up off the request path: a pass at start, then one after every
/// wake of `db`'s wake bus (a job settled in this process, or a Postgres notification) and at
/// least every [`DRAIN_INTERVAL`], until `shutdown`. Writers that store experiences index them in
/// their own transaction; this drains the rest (text edits, deletions, records stored by older
/// versions), so readers rarely score pending records from their text. Any number of processes
/// may drain at once ([`catch_up_in`] takes each pending row once). Each pass's count goes to
/// `passes` when given (tests wait on it instead of on time). A failed pass is logged and
/// retried at the next wake.
pub async fn drain(
    db: Db,
    shutdown: tokio_util::sync::CancellationToken,
    passes: Option<tokio::sync::mpsc::UnboundedSender<usize>>,
) {
    let mut wake = db.wake_bus().subscribe();
    loop {
        // Wakes from here on (including those during the pass) call for another pass.
        wake.mark_unchanged();
        let pass_started = tokio::time::Instant::now();
        match catch_up(&db, DRAIN_BATCH).await {
            Ok(taken) => {
                if taken > 0 {
                    tracing::debug!(indexed = taken, "recall index drained");
                }
                if let Some(passes) = &passes {
                    let _ = passes.send(taken);
                }
            }
            Err(error) => tracing::warn!(%error, "recall index drain failed; retrying later"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = wake.changed() => {
                if changed.is_err() {
                    tokio::time::sleep(DRAIN_INTERVAL).await;
                }
            }
            _ = tokio::time::sleep(DRAIN_INTERVAL) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(pass_started + MIN_PASS_GAP) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(title: &str, summary: &str) -> Vec<(String, f32)> {
        document_keys(DocText {
            title,
            summary,
            resolution: None,
            keywords: "",
        })
    }

    #[test]
    fn keys_stem_words_keep_identifiers_whole_and_pair_cjk_characters() {
        let keys: Vec<String> = doc("Tests fail in src/a/b.rs", "用pnpm安装依赖")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for expected in [
            "test",
            "fail",
            "src/a/b.rs",
            "用",
            "pnpm",
            "安装",
            "装依",
            "依赖",
        ] {
            assert!(
                keys.contains(&expected.to_owned()),
                "{expected} in {keys:?}"
            );
        }
        assert!(!keys.contains(&"in".to_owned()), "stopwords are not keys");
        assert!(
            !keys.contains(&"src".to_owned()),
            "identifier parts are not keys"
        );
        let terms = search_terms::parse("testing src/a/b.rs 安装依赖");
        assert_eq!(
            query_keys(&terms, &[]),
            ["test", "src/a/b.rs", "安装", "装依", "依赖"]
        );
    }

    #[test]
    fn a_title_word_weighs_more_and_long_documents_less() {
        let impact = |keys: &[(String, f32)], key: &str| {
            keys.iter().find(|(k, _)| k == key).map(|(_, i)| *i)
        };
        let in_title = doc("pnpm lockfile", "other words here");
        let in_summary = doc("other words", "pnpm lockfile here");
        assert!(impact(&in_title, "pnpm") > impact(&in_summary, "pnpm"));
        let long = doc("other words", &format!("pnpm {}", "filler ".repeat(200)));
        assert!(impact(&in_summary, "pnpm") > impact(&long, "pnpm"));
    }

    #[test]
    fn posting_lists_round_trip_and_refuse_truncation() {
        let postings = vec![(1, 0.5f32), (2, 1.25), (300, 2.0), (1 << 40, 0.125)];
        let bytes = encode(&postings);
        assert_eq!(decode(&bytes).expect("decodes"), postings);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[0x80]).is_err());
        assert!(decode(&[]).expect("empty").is_empty());
    }

    #[test]
    fn rank_orders_by_score_then_number_and_rarer_keys_weigh_more() {
        // Key 0 in three documents, key 1 only in document 7.
        let lists = vec![vec![(3, 1.0f32), (5, 1.0), (7, 1.0)], vec![(7, 1.0f32)]];
        let ranked = rank(&lists, 10, 3);
        assert_eq!(ranked.iter().map(|r| r.0).collect::<Vec<_>>(), [7, 3, 5]);
        assert_eq!(rank(&lists, 10, 1).len(), 1);
        assert!(rank(&[vec![(1, 1.0)], vec![(2, 1.0)]], 4, 2)[0].0 == 1);
        let common = rank(&[vec![(1, 1.0f32), (2, 1.0)]], 2, 2)[0].1;
        let rare = rank(&[vec![(1, 1.0f32)]], 2, 2)[0].1;
        assert!(rare > common && common > 0.0);
    }
}
