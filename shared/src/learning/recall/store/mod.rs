//! The recall store: the SQL of recall's three candidate sources. [`index`] keeps the recall
//! index's posting lists, [`text`] asks the full-text indexes (SQLite FTS5, Postgres
//! `tsvector` and trigram `ILIKE`), [`vectors`] keeps experience embeddings. Where the dialects
//! differ, each function matches on the backend itself, so callers rank without knowing it.

pub mod index;
pub mod text;
pub mod vectors;

#[cfg(test)]
pub(crate) mod fts5_fixture;

/// `$first, $first+1, …` for `n` parameters: a list of ids or keys bound one by one.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
