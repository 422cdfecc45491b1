//! Provider token accounting and health. Every provider call records its input and output tokens
//! from the provider's usage fields; totals per job, project and day are visible in status and
//! metrics, and an optional daily cap pauses automatic extraction (never manual commands).

use serde::Serialize;

use crate::db::{Db, StoreError, Tx};

const DAY_MS: i64 = 86_400_000;

/// Days since the Unix epoch (UTC) for a timestamp in ms.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// Start of the next UTC day.
pub fn next_day_start(ms: i64) -> i64 {
    (day_of(ms) + 1) * DAY_MS
}

/// `YYYY-MM-DD` for a day number.
pub fn day_label(day: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(day * 86_400)
        .map(|t| format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()))
        .unwrap_or_else(|_| day.to_string())
}

#[derive(Debug, Clone)]
pub struct UsageRecord<'a> {
    pub job_id: Option<&'a str>,
    pub project_id: Option<&'a str>,
    pub provider: &'a str,
    pub model: &'a str,
    pub automatic: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

pub async fn record_in(tx: &mut Tx, usage: &UsageRecord<'_>, now: i64) -> Result<(), StoreError> {
    let sql = "INSERT INTO provider_usage (id, job_id, project_id, provider, model, automatic, day, input_tokens, output_tokens, at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
    crate::on_tx!(tx, conn => sqlx::query(sql)
        .bind(crate::ids::new_id("use"))
        .bind(usage.job_id)
        .bind(usage.project_id)
        .bind(usage.provider)
        .bind(usage.model)
        .bind(usage.automatic)
        .bind(day_of(now))
        .bind(i64::try_from(usage.input_tokens).unwrap_or(i64::MAX))
        .bind(i64::try_from(usage.output_tokens).unwrap_or(i64::MAX))
        .bind(now)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    crate::telemetry::metrics::provider().tokens(
        usage.provider,
        usage.model,
        usage.input_tokens,
        usage.output_tokens,
    );
    Ok(())
}

/// Tokens spent by automatic extraction on the given day (the daily cap counts only these).
pub async fn automatic_tokens_in(tx: &mut Tx, day: i64) -> Result<i64, StoreError> {
    let sql = "SELECT CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) FROM provider_usage \
               WHERE day = $1 AND automatic = TRUE";
    Ok(crate::on_tx!(tx, conn => sqlx::query_scalar(sql).bind(day).fetch_one(conn).await)?)
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenTotals {
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub requests: i64,
}

async fn totals(
    db: &Db,
    clause: &str,
    key: &str,
    day: Option<i64>,
) -> Result<TokenTotals, StoreError> {
    let sql = format!(
        "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), COUNT(*) \
         FROM provider_usage WHERE {clause} = $1 AND ($2 IS NULL OR day = $2)"
    );
    let (input_tokens, output_tokens, requests): (i64, i64, i64) = crate::on_db!(db, pool =>
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str())).bind(key).bind(day).fetch_one(pool).await)?;
    Ok(TokenTotals {
        input_tokens,
        output_tokens,
        requests,
    })
}

pub async fn job_totals(db: &Db, job_id: &str) -> Result<TokenTotals, StoreError> {
    totals(db, "job_id", job_id, None).await
}

pub async fn project_totals(
    db: &Db,
    project_id: &str,
    day: Option<i64>,
) -> Result<TokenTotals, StoreError> {
    totals(db, "project_id", project_id, day).await
}

/// All usage on one day, automatic and manual.
pub async fn day_totals(db: &Db, day: i64) -> Result<(TokenTotals, i64), StoreError> {
    let sql = "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), COUNT(*), \
                 CAST(COALESCE(SUM(CASE WHEN automatic THEN input_tokens + output_tokens ELSE 0 END), 0) AS BIGINT) \
               FROM provider_usage WHERE day = $1";
    let (input_tokens, output_tokens, requests, automatic): (i64, i64, i64, i64) =
        crate::on_db!(db, pool => sqlx::query_as(sql).bind(day).fetch_one(pool).await)?;
    Ok((
        TokenTotals {
            input_tokens,
            output_tokens,
            requests,
        },
        automatic,
    ))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealth {
    pub provider: String,
    pub healthy: bool,
    pub status: Option<i64>,
    pub code: Option<String>,
    pub detail: Option<String>,
    pub updated_at: i64,
}

pub async fn set_health_in(tx: &mut Tx, health: &ProviderHealth) -> Result<(), StoreError> {
    let sql = "INSERT INTO provider_health (provider, healthy, status, code, detail, updated_at) VALUES ($1, $2, $3, $4, $5, $6) \
               ON CONFLICT (provider) DO UPDATE SET healthy = excluded.healthy, status = excluded.status, \
                 code = excluded.code, detail = excluded.detail, updated_at = excluded.updated_at";
    crate::on_tx!(tx, conn => sqlx::query(sql)
        .bind(&health.provider)
        .bind(health.healthy)
        .bind(health.status)
        .bind(&health.code)
        .bind(&health.detail)
        .bind(health.updated_at)
        .execute(conn)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// Records one model call of a learning job (mining, evaluation) the way extraction records its
/// calls: the tokens in `provider_usage` (so job, project and day totals, the daily budget and
/// status include them) and the provider's health — any answer marks it healthy, a credential
/// or unknown-model failure unhealthy, transient failures say nothing.
pub async fn record_call_in(
    tx: &mut Tx,
    usage: &UsageRecord<'_>,
    failure: Option<&crate::provider::ProviderError>,
    now: i64,
) -> Result<(), StoreError> {
    use crate::provider::ProviderError;
    record_in(tx, usage, now).await?;
    let health = match failure {
        None => Some(ProviderHealth {
            provider: usage.provider.to_owned(),
            healthy: true,
            status: None,
            code: None,
            detail: None,
            updated_at: now,
        }),
        Some(
            error @ (ProviderError::Auth(_)
            | ProviderError::ModelUnavailable(_)
            | ProviderError::MissingCredential { .. }),
        ) => {
            let diagnostic = error.diagnostic();
            Some(ProviderHealth {
                provider: usage.provider.to_owned(),
                healthy: false,
                status: diagnostic.and_then(|d| d.status).map(i64::from),
                code: diagnostic.and_then(|d| d.code.clone()),
                detail: Some(error.to_string()),
                updated_at: now,
            })
        }
        Some(_) => None,
    };
    if let Some(health) = health {
        set_health_in(tx, &health).await?;
    }
    Ok(())
}

pub async fn health(db: &Db) -> Result<Vec<ProviderHealth>, StoreError> {
    let sql = "SELECT provider, healthy, status, code, detail, updated_at FROM provider_health ORDER BY provider";
    Ok(crate::on_db!(db, pool => sqlx::query_as(sql).fetch_all(pool).await)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc_calendar_days() {
        let ms = 1_800_000_000_000; // 2027-01-15T08:00:00Z
        assert_eq!(day_label(day_of(ms)), "2027-01-15");
        assert_eq!(next_day_start(ms) % DAY_MS, 0);
        assert!(next_day_start(ms) > ms && next_day_start(ms) - ms <= DAY_MS);
    }
}
