//! Experience vectors: one unit-normalized, encoded vector per `(experience, model)` in
//! `experience_embedding`, with the digest of the text it was computed from.

use crate::db::{Db, StoreError, Tx};
use crate::learning::experience::store::live_experience;

/// A live experience without a vector of some model, in backfill order.
#[derive(sqlx::FromRow)]
pub struct Unembedded {
    pub id: String,
    pub project_id: String,
    pub created_at: i64,
}

/// One page of [`unembedded`]: live experiences (of one project, or all) without a vector of
/// `model`, after `after` in `(created_at, id)` order.
pub struct UnembeddedPage<'a> {
    pub model: &'a str,
    /// `None`: every project.
    pub project_id: Option<&'a str>,
    /// The last `(created_at, id)` of the previous page.
    pub after: (i64, &'a str),
    pub limit: i64,
}

pub async fn unembedded(db: &Db, page: &UnembeddedPage<'_>) -> Result<Vec<Unembedded>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_as(concat!(
        "SELECT r.id AS id, r.project_id AS project_id, r.created_at AS created_at \
         FROM experience_record r WHERE ",
        live_experience!("r"),
        " AND (r.created_at > $2 OR (r.created_at = $2 AND r.id > $3)) \
               AND ($5 = '' OR r.project_id = $5) \
               AND NOT EXISTS (SELECT 1 FROM experience_embedding e \
                               WHERE e.experience_id = r.id AND e.model = $1) \
             ORDER BY r.created_at, r.id LIMIT $4"
    ))
    .bind(page.model)
    .bind(page.after.0)
    .bind(page.after.1)
    .bind(page.limit)
    .bind(page.project_id.unwrap_or(""))
    .fetch_all(pool)
    .await)?)
}

/// The vector of one experience for one model, encoded.
pub struct NewVector<'a> {
    pub experience_id: &'a str,
    pub project_id: &'a str,
    pub model: &'a str,
    pub dims: usize,
    pub encoded: &'a [u8],
    pub content_digest: &'a str,
    pub now: i64,
}

/// Stores (or replaces) `vector`.
pub async fn upsert_in(tx: &mut Tx, vector: &NewVector<'_>) -> Result<(), StoreError> {
    let sql = "INSERT INTO experience_embedding \
                 (experience_id, model, project_id, dims, vector, content_digest, created_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7) \
               ON CONFLICT (experience_id, model) DO UPDATE SET project_id = excluded.project_id, \
                 dims = excluded.dims, vector = excluded.vector, \
                 content_digest = excluded.content_digest, created_at = excluded.created_at";
    crate::db::execute_in(
        tx,
        sql,
        &[
            vector.experience_id.into(),
            vector.model.into(),
            vector.project_id.into(),
            (vector.dims as i64).into(),
            vector.encoded.into(),
            vector.content_digest.into(),
            vector.now.into(),
        ],
    )
    .await?;
    Ok(())
}

/// The digest of the text an experience's stored vector was computed from, if it has one.
pub async fn stored_digest_in(
    tx: &mut Tx,
    experience_id: &str,
    model: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT content_digest FROM experience_embedding WHERE experience_id = $1 AND model = $2"
    )
    .bind(experience_id)
    .bind(model)
    .fetch_optional(conn)
    .await)?)
}

/// A stored vector, encoded.
#[derive(sqlx::FromRow)]
pub struct StoredVector {
    pub experience_id: String,
    pub vector: Vec<u8>,
}

/// A project's newest `limit` vectors of `model`, newest first.
pub async fn newest(
    db: &Db,
    project_id: &str,
    model: &str,
    limit: u32,
) -> Result<Vec<StoredVector>, StoreError> {
    Ok(crate::on_db!(db, |pool| sqlx::query_as(
        "SELECT experience_id, vector FROM experience_embedding \
             WHERE project_id = $1 AND model = $2 ORDER BY created_at DESC LIMIT $3"
    )
    .bind(project_id)
    .bind(model)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await)?)
}
