//! Full-text candidates of one project: SQLite's two FTS5 indexes (unicode61 words and
//! trigrams) and a scan of recent records for what neither can match; Postgres's
//! `search_vector` and trigram `ILIKE`.

use crate::db::{Db, Pool, StoreError};
use crate::learning::recall::search_terms::{MatchMode, QueryTerms};

/// One full-text match: an experience id and its relevance as the index ranks it (higher is
/// better; comparable only within one query).
#[derive(sqlx::FromRow)]
pub struct RankRow {
    pub id: String,
    pub relevance: f64,
}

/// The searchable text of a recent record, for substring tests outside SQL.
#[derive(sqlx::FromRow)]
pub struct RecentRow {
    pub id: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub keywords: String,
}

/// What [`matches`] looks for.
pub struct TextQuery<'a> {
    pub project_id: &'a str,
    pub terms: &'a QueryTerms,
    pub mode: MatchMode,
    /// The prompt's CJK character bigrams (automatic recall only).
    pub bigrams: &'a [String],
    /// Matches kept per query.
    pub limit: i64,
    /// SQLite: how many of the project's most recent records to read for substring tests;
    /// `None` when no term needs them.
    pub recent_scan: Option<i64>,
}

/// The matches of each query, for the caller to weigh: each list is ranked on its own scale.
pub enum TextMatches {
    Sqlite {
        /// The unicode61 index, best first.
        words: Vec<RankRow>,
        /// The trigram index (non-ASCII terms), best first.
        trigrams: Vec<RankRow>,
        /// The project's most recent records, newest first.
        recent: Vec<RecentRow>,
    },
    Postgres {
        /// `search_vector` matches ranked by `ts_rank_cd`.
        words: Vec<RankRow>,
        /// CJK terms and bigrams found as substrings.
        substrings: Vec<RankRow>,
    },
}

/// The project's full-text matches for `query`.
pub async fn matches(db: &Db, query: &TextQuery<'_>) -> Result<TextMatches, StoreError> {
    Ok(match db.pool() {
        Pool::Sqlite(pool) => {
            let (words, trigrams) = fts5_matches(pool, query).await?;
            let recent = match query.recent_scan {
                Some(scan) => recent_records(pool, query.project_id, scan).await?,
                None => Vec::new(),
            };
            TextMatches::Sqlite {
                words,
                trigrams,
                recent,
            }
        }
        Pool::Postgres(pool) => TextMatches::Postgres {
            words: tsvector_matches(pool, query).await?,
            substrings: substring_matches(pool, query).await?,
        },
    })
}

/// SQLite: the project's matches in the unicode61 index and, for non-ASCII terms, the trigram
/// index, each ranked by bm25.
async fn fts5_matches(
    pool: &sqlx::SqlitePool,
    query: &TextQuery<'_>,
) -> Result<(Vec<RankRow>, Vec<RankRow>), StoreError> {
    let TextQuery {
        project_id,
        terms,
        mode,
        ..
    } = *query;
    // The trigram index serves text the unicode61 index cannot split into words (CJK and other
    // non-ASCII scripts, ADR 0005). A term of ASCII characters only is a word or phrase of
    // unicode61 tokens, found there; sending it through the trigram index as well only adds
    // substring hits inside longer words, at many times the cost (a common trigram's posting
    // list covers most of the table, and bm25 reads the list of every phrase in the query).
    // `all` keeps every term in both expressions, so each still requires all of them.
    let trigram = match mode {
        MatchMode::Any => QueryTerms {
            terms: terms
                .terms
                .iter()
                .filter(|t| !t.text.is_ascii())
                .cloned()
                .collect(),
        }
        .fts5_trigram(mode),
        MatchMode::All => terms.fts5_trigram(mode),
    };
    // Each table's scope column holds one token per project (unicode61: `p<hex id>`; trigram:
    // three private-use characters, migration 0005), so `scope:"…"` confines the match to that
    // project's posting list.
    let trigram_scope = match trigram {
        Some(_) => {
            sqlx::query_scalar::<_, String>(
                "SELECT code FROM experience_search_scope_code WHERE project_id = $1",
            )
            .bind(project_id)
            .fetch_optional(pool)
            .await?
        }
        None => None,
    };
    let unicode_scope = format!("p{}", hex::encode(project_id.as_bytes()));
    let mut found = [Vec::new(), Vec::new()];
    for (at, (table, scope, expression)) in [
        (
            "experience_fts",
            Some(unicode_scope),
            terms.fts5_unicode(mode),
        ),
        ("experience_trigram", trigram_scope, trigram),
    ]
    .into_iter()
    .enumerate()
    {
        let (Some(scope), Some(expression)) = (scope, expression) else {
            continue;
        };
        found[at] = bm25(pool, table, &scope, &expression, query.limit).await?;
    }
    let [words, trigrams] = found;
    Ok((words, trigrams))
}

/// The best `limit` rows of one FTS5 table for a scoped, quoted expression.
async fn bm25(
    pool: &sqlx::SqlitePool,
    table: &str,
    scope: &str,
    expression: &str,
    limit: i64,
) -> Result<Vec<RankRow>, StoreError> {
    // `{title summary resolution keywords}:` confines the (quoted) terms to the text columns.
    let matcher =
        format!("scope:\"{scope}\" AND {{title summary resolution keywords}}: ({expression})");
    // Best first by bm25 with the ADR's column weights (scope 0, title 5, summary 2, resolution
    // 1, keywords 1), ties by row; the id lookup only for the rows kept.
    let sql = format!(
        "SELECT k.experience_id AS id, best.relevance AS relevance FROM \
           (SELECT rowid AS num, -bm25({table}, 0.0, 5.0, 2.0, 1.0, 1.0) AS relevance FROM {table} \
            WHERE {table} MATCH $1 ORDER BY relevance DESC, rowid LIMIT $2) best \
         JOIN experience_search_key k ON k.num = best.num \
         ORDER BY best.relevance DESC, best.num"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(&matcher)
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// SQLite: the project's `scan` most recent records, newest first.
async fn recent_records(
    pool: &sqlx::SqlitePool,
    project_id: &str,
    scan: i64,
) -> Result<Vec<RecentRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, title, summary, resolution, keywords FROM experience_record \
         WHERE project_id = $1 ORDER BY created_at DESC LIMIT $2",
    )
    .bind(project_id)
    .bind(scan)
    .fetch_all(pool)
    .await?)
}

/// Postgres: the project's `search_vector` matches ranked by `ts_rank_cd`.
async fn tsvector_matches(
    pool: &sqlx::PgPool,
    query: &TextQuery<'_>,
) -> Result<Vec<RankRow>, StoreError> {
    let TextQuery { terms, mode, .. } = *query;
    let texts = terms.texts();
    if texts.is_empty() {
        return Ok(Vec::new());
    }
    // Each term goes through plainto_tsquery, which treats it as plain text.
    let joiner = match mode {
        MatchMode::Any => " || ",
        MatchMode::All => " && ",
    };
    let prefixes = match mode {
        MatchMode::Any => terms.search_prefixes(),
        MatchMode::All => Vec::new(),
    };
    let mut query_sql: Vec<String> = (0..texts.len())
        .map(|i| format!("plainto_tsquery('simple', ${})", i + 3))
        .collect();
    // Inflections through prefix queries; a prefix is lower-case ASCII letters only.
    query_sql.extend(
        (0..prefixes.len()).map(|i| format!("to_tsquery('simple', ${})", texts.len() + i + 3)),
    );
    let sql = format!(
        "SELECT id, ts_rank_cd(search_vector, q)::DOUBLE PRECISION AS relevance \
         FROM experience_record, (SELECT {}) AS tsq(q) \
         WHERE project_id = $1 AND search_vector @@ q ORDER BY relevance DESC LIMIT $2",
        query_sql.join(joiner)
    );
    let terms = texts
        .iter()
        .map(|text| (*text).to_owned())
        .chain(prefixes.iter().map(|prefix| format!("{prefix}:*")));
    ranked_in_project(pool, &sql, query, terms).await
}

/// Runs a Postgres search whose `$1` is the project, `$2` the limit and `$3`… `terms`.
async fn ranked_in_project(
    pool: &sqlx::PgPool,
    sql: &str,
    query: &TextQuery<'_>,
    terms: impl Iterator<Item = String>,
) -> Result<Vec<RankRow>, StoreError> {
    let mut statement = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(query.project_id)
        .bind(query.limit);
    for term in terms {
        statement = statement.bind(term);
    }
    Ok(statement.fetch_all(pool).await?)
}

/// `%text%` for `ILIKE`, with the pattern characters of `text` escaped.
fn contains_pattern(text: &str) -> String {
    let escaped = text
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    format!("%{escaped}%")
}

/// Postgres: CJK terms and prompt bigrams (which the 'simple' parser cannot split) as
/// substrings, through the trigram index.
async fn substring_matches(
    pool: &sqlx::PgPool,
    query: &TextQuery<'_>,
) -> Result<Vec<RankRow>, StoreError> {
    let TextQuery {
        terms,
        mode,
        bigrams,
        ..
    } = *query;
    if terms.texts().is_empty() {
        return Ok(Vec::new());
    }
    let patterns: Vec<String> = terms
        .terms
        .iter()
        .filter(|t| t.cjk)
        .map(|t| t.text.as_str())
        .chain(bigrams.iter().map(String::as_str))
        .map(contains_pattern)
        .collect();
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let conditions: Vec<String> = (0..patterns.len())
        .map(|i| {
            format!(
                "(coalesce(title, '') || ' ' || coalesce(summary, '') || ' ' || \
                 coalesce(resolution, '') || ' ' || keywords) ILIKE ${}",
                i + 3
            )
        })
        .collect();
    let joined = conditions.join(match mode {
        MatchMode::Any => " OR ",
        MatchMode::All => " AND ",
    });
    let sql = format!(
        "SELECT id, 1.0::DOUBLE PRECISION AS relevance FROM experience_record \
         WHERE project_id = $1 AND ({joined}) LIMIT $2"
    );
    ranked_in_project(pool, &sql, query, patterns.into_iter()).await
}
