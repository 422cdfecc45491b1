//! A real SQLite FTS5 pair of the shape recall searches (a unicode61 and a trigram table over
//! title, summary and resolution), for tests that run the query builders of
//! [`crate::learning::recall::search_terms`] against FTS5 itself.

use sqlx::{Connection, SqliteConnection};

/// The fixture's rows as `(rowid, title, summary, resolution)`: English with SQL-like and FTS
/// operator text, CJK, punctuation-heavy identifiers.
pub(crate) const ROWS: &[(i64, &str, &str, &str)] = &[
    (
        1,
        "SQLite migration preserved messages",
        "The v2 migration kept every message row; run cargo sqlx migrate run first.",
        "Use ALTER TABLE instead of recreating the messages table.",
    ),
    (
        2,
        "用pnpm安装依赖",
        "数据库迁移时丢失消息，需要先备份。",
        "运行 pnpm install --frozen-lockfile",
    ),
    (
        3,
        "Punctuation: foo.bar(), snake_case & kebab-case",
        "See a/b/c.rs at v1.2.3; C++ and node:fs both work. \"quoted\" NEAR(x y) *star* ^caret",
        "title: secret is not a column filter",
    ),
    (
        4,
        "secret rotation",
        "Rotate the API key monthly.",
        "nothing else here",
    ),
];

/// In-memory tables `u` (unicode61) and `t` (trigram) holding [`ROWS`].
pub(crate) async fn fixture() -> SqliteConnection {
    let mut conn = SqliteConnection::connect("sqlite::memory:")
        .await
        .expect("in-memory sqlite");
    for ddl in [
        "CREATE VIRTUAL TABLE u USING fts5(title, summary, resolution, tokenize = 'unicode61 remove_diacritics 2')",
        "CREATE VIRTUAL TABLE t USING fts5(title, summary, resolution, tokenize = 'trigram')",
    ] {
        sqlx::query(ddl)
            .execute(&mut conn)
            .await
            .expect("create fts5 table");
    }
    for &(id, title, summary, resolution) in ROWS {
        for insert in [
            "INSERT INTO u (rowid, title, summary, resolution) VALUES (?, ?, ?, ?)",
            "INSERT INTO t (rowid, title, summary, resolution) VALUES (?, ?, ?, ?)",
        ] {
            sqlx::query(insert)
                .bind(id)
                .bind(title)
                .bind(summary)
                .bind(resolution)
                .execute(&mut conn)
                .await
                .expect("insert row");
        }
    }
    conn
}

pub(crate) async fn unicode(
    conn: &mut SqliteConnection,
    expr: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT rowid FROM u WHERE u MATCH ? ORDER BY rowid")
        .bind(expr)
        .fetch_all(conn)
        .await
}

pub(crate) async fn trigram(
    conn: &mut SqliteConnection,
    expr: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rowid")
        .bind(expr)
        .fetch_all(conn)
        .await
}

pub(crate) async fn like(
    conn: &mut SqliteConnection,
    pattern: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT rowid FROM t WHERE title LIKE ?1 ESCAPE '\\' OR summary LIKE ?1 ESCAPE '\\' \
         OR resolution LIKE ?1 ESCAPE '\\' ORDER BY rowid",
    )
    .bind(pattern)
    .fetch_all(conn)
    .await
}
