//! The API token store: `api_token` rows, written and read by their digest. [`super`] makes
//! secrets and decides scopes; this keeps them.

use super::{GlobalAccess, Grant, TokenInfo};
use crate::db::{Db, StoreError};

fn corrupt(column: &str) -> StoreError {
    StoreError::Corrupt(format!("api_token.{column}"))
}

fn projects_of(json: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(json).map_err(|_| corrupt("projects"))
}

fn global_of(text: &str) -> Result<GlobalAccess, StoreError> {
    GlobalAccess::parse(text).ok_or_else(|| corrupt("global_scope"))
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: String,
    name: String,
    projects: String,
    global_scope: String,
    is_user: bool,
    created_at: i64,
    revoked_at: Option<i64>,
}

impl TryFrom<TokenRow> for TokenInfo {
    type Error = StoreError;

    fn try_from(row: TokenRow) -> Result<Self, StoreError> {
        Ok(TokenInfo {
            projects: projects_of(&row.projects)?,
            global: global_of(&row.global_scope)?,
            id: row.id,
            name: row.name,
            user: row.is_user,
            created_at: row.created_at,
            revoked_at: row.revoked_at,
        })
    }
}

#[derive(sqlx::FromRow)]
struct GrantRow {
    id: String,
    projects: String,
    global_scope: String,
    is_user: bool,
}

impl TryFrom<GrantRow> for Grant {
    type Error = StoreError;

    fn try_from(row: GrantRow) -> Result<Self, StoreError> {
        Ok(Grant {
            projects: projects_of(&row.projects)?,
            global: global_of(&row.global_scope)?,
            id: row.id,
            user: row.is_user,
        })
    }
}

/// Stores a new token `info`, looked up later by `digest_hex` (its secret's SHA-256).
pub async fn insert(db: &Db, info: &TokenInfo, digest_hex: &str) -> Result<(), StoreError> {
    let sql = "INSERT INTO api_token \
                 (id, name, token_sha256, projects, global_scope, is_user, created_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7)";
    let projects_json =
        serde_json::to_string(&info.projects).unwrap_or_else(|_| String::from("[]"));
    crate::on_db!(db, |pool| sqlx::query(sql)
        .bind(&info.id)
        .bind(&info.name)
        .bind(digest_hex)
        .bind(&projects_json)
        .bind(info.global.as_str())
        .bind(info.user)
        .bind(info.created_at)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// The scope of the live (unrevoked) token whose digest is `digest_hex`.
pub async fn grant_for(db: &Db, digest_hex: &str) -> Result<Option<Grant>, StoreError> {
    let sql = "SELECT id, projects, global_scope, is_user FROM api_token \
               WHERE token_sha256 = $1 AND revoked_at IS NULL";
    let row: Option<GrantRow> = crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(digest_hex)
        .fetch_optional(pool)
        .await)?;
    row.map(Grant::try_from).transpose()
}

/// Every token, revoked ones included, oldest first.
pub async fn list(db: &Db) -> Result<Vec<TokenInfo>, StoreError> {
    let sql = "SELECT id, name, projects, global_scope, is_user, created_at, revoked_at \
               FROM api_token ORDER BY created_at, id";
    let rows: Vec<TokenRow> = crate::on_db!(db, |pool| sqlx::query_as(sql).fetch_all(pool).await)?;
    rows.into_iter().map(TokenInfo::try_from).collect()
}

/// Revokes a live token at `now`; false when it is unknown or already revoked.
pub async fn revoke(db: &Db, id: &str, now: i64) -> Result<bool, StoreError> {
    let sql = "UPDATE api_token SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";
    let changed = crate::on_db!(db, |pool| sqlx::query(sql)
        .bind(id)
        .bind(now)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(changed == 1)
}
