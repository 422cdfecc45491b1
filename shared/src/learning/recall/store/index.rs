//! The recall index's tables: `recall_pending` (records waiting to be indexed), `recall_doc`
//! (each record's document number and the keys it is indexed under), `recall_list` (one
//! encoded posting list per project and key) and `recall_project` (its document count, and the
//! row indexers of one project serialise on). [`crate::learning::recall::index`] decides what
//! goes in the lists; this reads and writes them.

use std::collections::{BTreeSet, HashMap};

use super::placeholders;
use crate::db::{Arg, Backend, Db, StoreError, Tx};

/// Bind parameters per statement when a list of keys or ids is sent.
const CHUNK: usize = 400;

/// A record's document: its number, the project it is indexed in and the record's text.
#[derive(sqlx::FromRow)]
pub struct DocumentRow {
    pub num: i64,
    /// The project whose lists hold the document (NULL until indexed).
    pub indexed_project: Option<String>,
    /// The record's project (NULL when the record was deleted).
    pub project_id: Option<String>,
    pub title: Option<String>,
    pub summary: Option<String>,
    pub resolution: Option<String>,
    pub keywords: Option<String>,
}

/// Up to `limit` pending records that are, or were indexed, in the project.
pub async fn pending_of(
    db: &Db,
    project_id: &str,
    limit: i64,
) -> Result<Vec<DocumentRow>, StoreError> {
    // Pending rows are few; the join must start from them (SQLite: `CROSS JOIN` fixes the order;
    // Postgres: a materialised CTE), or it reads every document of the index.
    let sql = match db.backend() {
        Backend::Sqlite => {
            "SELECT d.num AS num, d.project_id AS indexed_project, e.project_id AS project_id, \
                    e.title AS title, e.summary AS summary, e.resolution AS resolution, e.keywords AS keywords \
             FROM recall_pending p CROSS JOIN recall_doc d \
             LEFT JOIN experience_record e ON e.id = p.experience_id \
             WHERE d.experience_id = p.experience_id AND (d.project_id = $1 OR e.project_id = $1) LIMIT $2"
        }
        Backend::Postgres => {
            "WITH waiting AS MATERIALIZED (SELECT experience_id FROM recall_pending) \
             SELECT d.num AS num, d.project_id AS indexed_project, e.project_id AS project_id, \
                    e.title AS title, e.summary AS summary, e.resolution AS resolution, e.keywords AS keywords \
             FROM waiting p JOIN recall_doc d ON d.experience_id = p.experience_id \
             LEFT JOIN experience_record e ON e.id = p.experience_id \
             WHERE d.project_id = $1 OR e.project_id = $1 LIMIT $2"
        }
    };
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(project_id)
        .bind(limit)
        .fetch_all(pool)
        .await)?)
}

/// Encoded posting lists by key.
pub type StoredLists = HashMap<String, Vec<u8>>;

/// The project's indexed document count and the stored posting lists of `keys` (keys without
/// a list are absent), in one statement: the count rides along as a row with a NULL list.
pub async fn read_lists(
    db: &Db,
    project_id: &str,
    keys: &[String],
) -> Result<(usize, StoredLists), StoreError> {
    let mut docs = 0usize;
    let mut stored = StoredLists::with_capacity(keys.len());
    for (at, chunk) in keys.chunks(CHUNK).enumerate() {
        let count = if at == 0 {
            "SELECT '' AS key, NULL AS postings, docs FROM recall_project WHERE project_id = $1 \
             UNION ALL "
        } else {
            ""
        };
        let sql = format!(
            "{count}SELECT key, postings, 0 AS docs FROM recall_list \
             WHERE project_id = $1 AND key IN ({})",
            placeholders(2, chunk.len())
        );
        let rows: Vec<(String, Option<Vec<u8>>, i64)> = crate::on_db!(db, |pool| {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())).bind(project_id);
            for key in chunk {
                query = query.bind(key.as_str());
            }
            query.fetch_all(pool).await
        })?;
        for (key, postings, count) in rows {
            match postings {
                Some(postings) => {
                    stored.insert(key, postings);
                }
                None => docs = count.max(0) as usize,
            }
        }
    }
    Ok((docs, stored))
}

/// The experience ids of document numbers `nums` (numbers without a document are absent).
pub async fn experience_ids(db: &Db, nums: &[i64]) -> Result<HashMap<i64, String>, StoreError> {
    let mut ids: HashMap<i64, String> = HashMap::new();
    for chunk in nums.chunks(CHUNK) {
        let sql = format!(
            "SELECT num, experience_id FROM recall_doc WHERE num IN ({})",
            placeholders(1, chunk.len())
        );
        let rows: Vec<(i64, String)> = crate::on_db!(db, |pool| {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
            for num in chunk {
                query = query.bind(*num);
            }
            query.fetch_all(pool).await
        })?;
        ids.extend(rows);
    }
    Ok(ids)
}

/// An indexed record of a project with its text.
#[derive(sqlx::FromRow)]
pub struct RecordRow {
    pub num: i64,
    pub id: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub keywords: String,
}

/// Every numbered record of the project: the whole project, for the reference ranking.
pub async fn project_records(db: &Db, project_id: &str) -> Result<Vec<RecordRow>, StoreError> {
    Ok(crate::on_db!(db, |pool| {
        sqlx::query_as(
            "SELECT d.num AS num, e.id AS id, e.title AS title, e.summary AS summary, \
                    e.resolution AS resolution, e.keywords AS keywords \
             FROM experience_record e JOIN recall_doc d ON d.experience_id = e.id \
             WHERE e.project_id = $1",
        )
        .bind(project_id)
        .fetch_all(pool)
        .await
    })?)
}

/// A claimed record: its document, with the keys it was indexed under (NULL text columns for
/// a deleted record).
#[derive(sqlx::FromRow)]
pub struct IndexRow {
    #[sqlx(flatten)]
    pub document: DocumentRow,
    pub indexed_keys: Option<String>,
}

/// Takes (deletes) up to `limit` pending marks; on Postgres marks another indexer holds are
/// skipped, not waited for.
pub async fn claim_pending_in(tx: &mut Tx, limit: i64) -> Result<Vec<String>, StoreError> {
    let claim = match tx.backend() {
        Backend::Sqlite => {
            "DELETE FROM recall_pending WHERE experience_id IN \
               (SELECT experience_id FROM recall_pending ORDER BY experience_id LIMIT $1) \
             RETURNING experience_id"
        }
        Backend::Postgres => {
            "DELETE FROM recall_pending WHERE experience_id IN \
               (SELECT experience_id FROM recall_pending ORDER BY experience_id LIMIT $1 \
                FOR UPDATE SKIP LOCKED) \
             RETURNING experience_id"
        }
    };
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(claim)
        .bind(limit)
        .fetch_all(conn)
        .await)?)
}

/// The records of `claimed` experience ids, numbering those that have no document yet.
pub async fn claimed_records_in(
    tx: &mut Tx,
    claimed: &[String],
) -> Result<Vec<IndexRow>, StoreError> {
    let mut rows: Vec<IndexRow> = Vec::with_capacity(claimed.len());
    for chunk in claimed.chunks(CHUNK) {
        let marks = placeholders(1, chunk.len());
        // A record stored before its trigger existed still gets a number.
        let sql = format!(
            "INSERT INTO recall_doc (experience_id) \
             SELECT id FROM experience_record WHERE id IN ({marks}) \
             ON CONFLICT (experience_id) DO NOTHING"
        );
        crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()));
            for id in chunk {
                query = query.bind(id.as_str());
            }
            query.execute(conn).await.map(|done| done.rows_affected())
        })?;
        let sql = format!(
            "SELECT d.num AS num, d.project_id AS indexed_project, d.indexed_keys AS indexed_keys, \
                    e.project_id AS project_id, e.title AS title, e.summary AS summary, \
                    e.resolution AS resolution, e.keywords AS keywords \
             FROM recall_doc d LEFT JOIN experience_record e ON e.id = d.experience_id \
             WHERE d.experience_id IN ({marks})"
        );
        let found: Vec<IndexRow> = crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()));
            for id in chunk {
                query = query.bind(id.as_str());
            }
            query.fetch_all(conn).await
        })?;
        rows.extend(found);
    }
    Ok(rows)
}

/// Locks the row of each project (creating it), in order; returns the projects that still
/// exist. The row serialises indexers of one project (their lists are read, changed and
/// written whole); a deleted project's lists went with it.
pub async fn lock_projects_in(
    tx: &mut Tx,
    projects: impl Iterator<Item = &String>,
) -> Result<BTreeSet<String>, StoreError> {
    let mut live = BTreeSet::new();
    for project in projects {
        crate::db::execute_in(
            tx,
            "INSERT INTO recall_project (project_id) SELECT id FROM project WHERE id = $1 \
             ON CONFLICT (project_id) DO NOTHING",
            &[project.into()],
        )
        .await?;
        let lock = match tx.backend() {
            Backend::Sqlite => "SELECT docs FROM recall_project WHERE project_id = $1",
            Backend::Postgres => "SELECT docs FROM recall_project WHERE project_id = $1 FOR UPDATE",
        };
        let exists: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(lock)
            .bind(project)
            .fetch_optional(conn)
            .await)?;
        if exists.is_some() {
            live.insert(project.clone());
        }
    }
    Ok(live)
}

/// The stored posting lists of `keys` in `project` (keys without a list are absent).
pub async fn lists_in(
    tx: &mut Tx,
    project: &str,
    keys: &[&String],
) -> Result<StoredLists, StoreError> {
    let mut stored = StoredLists::new();
    for chunk in keys.chunks(CHUNK) {
        let sql = format!(
            "SELECT key, postings FROM recall_list WHERE project_id = $1 AND key IN ({})",
            placeholders(2, chunk.len())
        );
        let found: Vec<(String, Vec<u8>)> = crate::on_tx!(tx, |conn| {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())).bind(project);
            for key in chunk {
                query = query.bind(key.as_str());
            }
            query.fetch_all(conn).await
        })?;
        stored.extend(found);
    }
    Ok(stored)
}

/// One key's list of one project.
#[derive(Debug, Clone, Copy)]
pub struct ListKey<'a> {
    pub project: &'a str,
    pub key: &'a str,
}

/// Writes a key's encoded list; an empty `postings` removes it.
pub async fn put_list_in(
    tx: &mut Tx,
    list: ListKey<'_>,
    postings: Option<&[u8]>,
) -> Result<(), StoreError> {
    let (sql, args): (&'static str, Vec<Arg<'_>>) = match postings {
        None => (
            "DELETE FROM recall_list WHERE project_id = $1 AND key = $2",
            vec![list.project.into(), list.key.into()],
        ),
        Some(postings) => (
            "INSERT INTO recall_list (project_id, key, postings) VALUES ($1, $2, $3) \
                 ON CONFLICT (project_id, key) DO UPDATE SET postings = excluded.postings",
            vec![list.project.into(), list.key.into(), postings.into()],
        ),
    };
    crate::db::execute_in(tx, sql, &args).await?;
    Ok(())
}

/// Where a document is indexed.
#[derive(Debug, Clone, Copy)]
pub struct Indexed<'a> {
    pub project: &'a str,
    /// Its keys, newline-joined.
    pub keys: &'a str,
}

/// Records where document `num` is indexed now; `None` forgets it.
pub async fn set_document_in(
    tx: &mut Tx,
    num: i64,
    indexed: Option<Indexed<'_>>,
) -> Result<(), StoreError> {
    let (sql, args): (&'static str, Vec<Arg<'_>>) = match indexed {
        Some(Indexed { project, keys }) => (
            "UPDATE recall_doc SET project_id = $2, indexed_keys = $3 WHERE num = $1",
            vec![num.into(), project.into(), keys.into()],
        ),
        None => ("DELETE FROM recall_doc WHERE num = $1", vec![num.into()]),
    };
    crate::db::execute_in(tx, sql, &args).await?;
    Ok(())
}

/// Counts the project's indexed documents again.
pub async fn recount_documents_in(tx: &mut Tx, project: &str) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE recall_project SET docs = (SELECT COUNT(*) FROM recall_doc \
               WHERE project_id = $1 AND indexed_keys IS NOT NULL) WHERE project_id = $1",
        &[project.into()],
    )
    .await?;
    Ok(())
}
