//! API tokens scoped to projects. Only SHA-256 digests are stored; the token itself is shown
//! once, when it is created.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::clock::SharedClock;
use crate::db::{Db, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub projects: Vec<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct TokenStore {
    db: Db,
    clock: SharedClock,
}

impl TokenStore {
    pub fn new(db: Db, clock: SharedClock) -> TokenStore {
        TokenStore { db, clock }
    }

    /// Creates a token for `projects`; returns its info and the secret (shown once).
    pub async fn create(
        &self,
        name: &str,
        projects: &[String],
    ) -> Result<(TokenInfo, String), StoreError> {
        let secret = format!(
            "zuno_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let digest = hex::encode(Sha256::digest(secret.as_bytes()));
        let info = TokenInfo {
            id: crate::ids::new_id("tok"),
            name: name.to_owned(),
            projects: projects.to_vec(),
            created_at: self.clock.now_ms(),
            revoked_at: None,
        };
        let sql = "INSERT INTO api_token (id, name, token_sha256, projects, created_at) VALUES ($1, $2, $3, $4, $5)";
        let projects_json =
            serde_json::to_string(&info.projects).unwrap_or_else(|_| String::from("[]"));
        crate::on_db!(self.db, pool => sqlx::query(sql)
            .bind(&info.id)
            .bind(&info.name)
            .bind(&digest)
            .bind(&projects_json)
            .bind(info.created_at)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok((info, secret))
    }

    /// The projects a live token (given by its hex SHA-256) may access.
    pub async fn projects_for(&self, digest_hex: &str) -> Result<Option<Vec<String>>, StoreError> {
        let sql = "SELECT projects FROM api_token WHERE token_sha256 = $1 AND revoked_at IS NULL";
        let projects: Option<String> = crate::on_db!(self.db, pool =>
            sqlx::query_scalar(sql).bind(digest_hex).fetch_optional(pool).await)?;
        projects
            .map(|text| {
                serde_json::from_str(&text)
                    .map_err(|_| StoreError::Corrupt(String::from("api_token.projects")))
            })
            .transpose()
    }

    pub async fn list(&self) -> Result<Vec<TokenInfo>, StoreError> {
        let sql =
            "SELECT id, name, projects, created_at, revoked_at FROM api_token ORDER BY created_at";
        let rows: Vec<(String, String, String, i64, Option<i64>)> =
            crate::on_db!(self.db, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        rows.into_iter()
            .map(|(id, name, projects, created_at, revoked_at)| {
                Ok(TokenInfo {
                    id,
                    name,
                    projects: serde_json::from_str(&projects)
                        .map_err(|_| StoreError::Corrupt(String::from("api_token.projects")))?,
                    created_at,
                    revoked_at,
                })
            })
            .collect()
    }

    pub async fn revoke(&self, id: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE api_token SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";
        let changed = crate::on_db!(self.db, pool => sqlx::query(sql)
            .bind(id)
            .bind(self.clock.now_ms())
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(changed == 1)
    }
}
