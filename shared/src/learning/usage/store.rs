//! The usage store: provider calls' token usage, the daily cap's reservations and provider
//! health. [`super`] decides what to record and whether a call fits; this writes and reads it.

use super::{AutomaticBudget, HEALTH_CONFIRM_MS, ProviderHealth, TokenTotals, UsageRecord, day_of};
use crate::db::{Arg, Backend, Db, StoreError, Tx};

/// Tokens as stored: a count past `i64::MAX` is recorded as `i64::MAX`.
fn stored_tokens(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

/// `$1`–`$10` of a `provider_usage` row: the one insert of [`insert_usage_in`] and of
/// [`record_job_call_at_once`].
const INSERT_USAGE: &str = "INSERT INTO provider_usage \
       (id, job_id, project_id, provider, model, automatic, day, input_tokens, output_tokens, at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Binds a new usage row's values in [`INSERT_USAGE`]'s order.
fn usage_args<'a>(id: &'a str, usage: &'a UsageRecord<'a>, now: i64) -> [Arg<'a>; 10] {
    [
        id.into(),
        usage.job_id.into(),
        usage.project_id.into(),
        usage.provider.into(),
        usage.model.into(),
        usage.automatic.into(),
        day_of(now).into(),
        stored_tokens(usage.input_tokens).into(),
        stored_tokens(usage.output_tokens).into(),
        now.into(),
    ]
}

/// Writes one call's usage row.
pub async fn insert_usage_in(
    tx: &mut Tx,
    usage: &UsageRecord<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let id = crate::ids::new_id("use");
    crate::db::execute_in(tx, INSERT_USAGE, &usage_args(&id, usage, now)).await?;
    Ok(())
}

/// A reservation counts while its attempt runs and its call has not recorded: a rescued,
/// retried or settled attempt frees it without any clean-up.
const BUDGET_SQL: &str = "SELECT \
    (SELECT CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) FROM provider_usage \
       WHERE day = $1 AND automatic = TRUE), \
    (SELECT CAST(COALESCE(SUM(r.tokens), 0) AS BIGINT) FROM provider_token_reservation r \
       JOIN learning_job j ON j.id = r.job_id \
       WHERE r.day = $1 AND r.released = FALSE AND j.state = 'running' AND j.attempts = r.attempt), \
    (SELECT CAST(COUNT(*) AS BIGINT) FROM provider_usage WHERE day = $1 AND automatic = TRUE), \
    (SELECT CAST(COUNT(*) AS BIGINT) FROM provider_token_reservation r \
       JOIN learning_job j ON j.id = r.job_id \
       WHERE r.day = $1 AND r.released = FALSE AND j.state = 'running' AND j.attempts = r.attempt)";

#[derive(sqlx::FromRow)]
struct BudgetRow(i64, i64, i64, i64);

impl From<BudgetRow> for AutomaticBudget {
    fn from(BudgetRow(spent, reserved, calls_spent, calls_reserved): BudgetRow) -> Self {
        AutomaticBudget {
            spent,
            reserved,
            calls_spent,
            calls_reserved,
        }
    }
}

/// Today's automatic spend and live reservations, read in one statement.
pub async fn automatic_budget_in(tx: &mut Tx, day: i64) -> Result<AutomaticBudget, StoreError> {
    let row: BudgetRow = crate::on_tx!(tx, |conn| sqlx::query_as(BUDGET_SQL)
        .bind(day)
        .fetch_one(conn)
        .await)?;
    Ok(row.into())
}

pub async fn automatic_budget(db: &Db, day: i64) -> Result<AutomaticBudget, StoreError> {
    let row: BudgetRow = crate::on_db!(db, |pool| sqlx::query_as(BUDGET_SQL)
        .bind(day)
        .fetch_one(pool)
        .await)?;
    Ok(row.into())
}

/// One attempt of a job, as a reservation names it.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub job_id: &'a str,
    pub attempt: i64,
}

/// Whether `attempt` already holds a reservation.
pub async fn reservation_held_in(tx: &mut Tx, attempt: Attempt<'_>) -> Result<bool, StoreError> {
    let held: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT attempt FROM provider_token_reservation WHERE job_id = $1 AND attempt = $2"
    )
    .bind(attempt.job_id)
    .bind(attempt.attempt)
    .fetch_optional(conn)
    .await)?;
    Ok(held.is_some())
}

/// The advisory lock key that serializes reservations on Postgres.
const RESERVATION_LOCK: i64 = 0x007a_756e_6f63_6170;

/// Makes the caller's transaction the only reserver until it ends. Postgres: a
/// transaction-scoped advisory lock taken by every reserver, so the next reserver's reads start
/// after this one's reservation is visible; SQLite: the transaction already holds the only
/// write lock.
pub async fn serialize_reservations_in(tx: &mut Tx) -> Result<(), StoreError> {
    if tx.backend() == Backend::Postgres {
        crate::db::execute_in(
            tx,
            "SELECT pg_advisory_xact_lock($1)",
            &[RESERVATION_LOCK.into()],
        )
        .await?;
    }
    Ok(())
}

/// A reservation of one call's ceiling against one day's cap.
#[derive(Debug, Clone, Copy)]
pub struct NewReservation<'a> {
    pub attempt: Attempt<'a>,
    pub day: i64,
    pub tokens: u64,
    pub now: i64,
}

/// Writes `reservation` and drops the reservations of earlier days, which can no longer count
/// (so the table holds one day).
pub async fn insert_reservation_in(
    tx: &mut Tx,
    reservation: &NewReservation<'_>,
) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "INSERT INTO provider_token_reservation (job_id, attempt, day, tokens, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        &[
            reservation.attempt.job_id.into(),
            reservation.attempt.attempt.into(),
            reservation.day.into(),
            stored_tokens(reservation.tokens).into(),
            reservation.now.into(),
        ],
    )
    .await?;
    crate::db::execute_in(
        tx,
        "DELETE FROM provider_token_reservation WHERE day < $1",
        &[reservation.day.into()],
    )
    .await?;
    Ok(())
}

/// Releases the reservation of one attempt: its call's actual spend is recorded now.
pub async fn release_in(tx: &mut Tx, attempt: Attempt<'_>) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE provider_token_reservation SET released = TRUE WHERE job_id = $1 AND attempt = $2",
        &[attempt.job_id.into(), attempt.attempt.into()],
    )
    .await?;
    Ok(())
}

/// Whose usage [`totals`] sums.
#[derive(Debug, Clone, Copy)]
pub enum TotalsOf<'a> {
    Job(&'a str),
    /// A project's usage, on one day or on all.
    Project {
        id: &'a str,
        day: Option<i64>,
    },
}

#[derive(sqlx::FromRow)]
struct TotalsRow(i64, i64, i64);

impl From<TotalsRow> for TokenTotals {
    fn from(TotalsRow(input_tokens, output_tokens, requests): TotalsRow) -> Self {
        TokenTotals {
            input_tokens,
            output_tokens,
            requests,
        }
    }
}

pub async fn totals(db: &Db, of: TotalsOf<'_>) -> Result<TokenTotals, StoreError> {
    let (sql, key, day) = match of {
        TotalsOf::Job(id) => (
            "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), \
               CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), COUNT(*) \
             FROM provider_usage WHERE job_id = $1 AND ($2 IS NULL OR day = $2)",
            id,
            None,
        ),
        TotalsOf::Project { id, day } => (
            "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), \
               CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), COUNT(*) \
             FROM provider_usage WHERE project_id = $1 AND ($2 IS NULL OR day = $2)",
            id,
            day,
        ),
    };
    let row: TotalsRow = crate::on_db!(db, |pool| sqlx::query_as(sql)
        .bind(key)
        .bind(day)
        .fetch_one(pool)
        .await)?;
    Ok(row.into())
}

/// All usage on one day, automatic and manual, with the automatic tokens.
pub async fn day_totals(db: &Db, day: i64) -> Result<(TokenTotals, i64), StoreError> {
    let sql = "SELECT CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT), COUNT(*), \
                 CAST(COALESCE(SUM(CASE WHEN automatic THEN input_tokens + output_tokens ELSE 0 END), \
                   0) AS BIGINT) \
               FROM provider_usage WHERE day = $1";
    let (input_tokens, output_tokens, requests, automatic): (i64, i64, i64, i64) =
        crate::on_db!(db, |pool| sqlx::query_as(sql)
            .bind(day)
            .fetch_one(pool)
            .await)?;
    let totals = TotalsRow(input_tokens, output_tokens, requests).into();
    Ok((totals, automatic))
}

/// Records a provider's health. Every model call of every worker reports it, so an unchanged
/// state is written at most once per [`HEALTH_CONFIRM_MS`]: the guarded update neither writes
/// nor locks the row otherwise, and the one row does not serialise a fleet's settlements. A
/// change of state is always written.
pub async fn set_health_in(tx: &mut Tx, health: &ProviderHealth) -> Result<(), StoreError> {
    let args = [
        (&health.provider).into(),
        health.healthy.into(),
        health.status.into(),
        (&health.code).into(),
        (&health.detail).into(),
        health.updated_at.into(),
        HEALTH_CONFIRM_MS.into(),
    ];
    let update = "UPDATE provider_health \
                  SET healthy = $2, status = $3, code = $4, detail = $5, updated_at = $6 \
                  WHERE provider = $1 AND (healthy <> $2 OR status IS DISTINCT FROM $3 \
                    OR code IS DISTINCT FROM $4 OR detail IS DISTINCT FROM $5 \
                    OR updated_at <= $6 - $7)";
    if crate::db::execute_in(tx, update, &args).await? == 0 {
        let insert = "INSERT INTO provider_health \
                        (provider, healthy, status, code, detail, updated_at) \
                      VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (provider) DO NOTHING";
        crate::db::execute_in(tx, insert, &args[..6]).await?;
    }
    Ok(())
}

pub async fn health(db: &Db) -> Result<Vec<ProviderHealth>, StoreError> {
    let sql = "SELECT provider, healthy, status, code, detail, updated_at \
               FROM provider_health ORDER BY provider";
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .fetch_all(pool)
        .await)?)
}

/// A job attempt's model call: its usage, the attempt whose reservation it releases, and the
/// provider's health when the outcome says something of it.
pub struct JobCall<'a> {
    pub usage: &'a UsageRecord<'a>,
    pub attempt: i64,
    pub health: Option<&'a ProviderHealth>,
    pub now: i64,
}

/// Postgres: records `call` in one statement (the usage insert, the release and the health
/// check as data-modifying `WITH` parts) instead of a transaction of five; every attempt that
/// asks the model records one call, so this is on the job path.
pub async fn record_job_call_at_once(
    pool: &sqlx::PgPool,
    call: &JobCall<'_>,
) -> Result<(), StoreError> {
    let usage = call.usage;
    let (sql, health) = match call.health {
        Some(health) => (RECORD_CALL_WITH_HEALTH_SQL, Some(health)),
        None => (RECORD_CALL_SQL, None),
    };
    let id = crate::ids::new_id("use");
    let mut query = sqlx::query(sql)
        .bind(&id)
        .bind(usage.job_id)
        .bind(usage.project_id)
        .bind(usage.provider)
        .bind(usage.model)
        .bind(usage.automatic)
        .bind(day_of(call.now))
        .bind(stored_tokens(usage.input_tokens))
        .bind(stored_tokens(usage.output_tokens))
        .bind(call.now)
        .bind(usage.job_id.unwrap_or_default())
        .bind(call.attempt);
    if let Some(health) = health {
        query = query
            .bind(health.healthy)
            .bind(health.status)
            .bind(&health.code)
            .bind(&health.detail)
            .bind(HEALTH_CONFIRM_MS);
    }
    query.execute(pool).await?;
    Ok(())
}

/// [`record_job_call_at_once`]'s statement when the outcome says nothing of health: `$1`–`$10`
/// the usage row, `$11`/`$12` the reservation's job and attempt.
const RECORD_CALL_SQL: &str = "WITH released AS (\
       UPDATE provider_token_reservation SET released = TRUE WHERE job_id = $11 AND attempt = $12) \
     INSERT INTO provider_usage (id, job_id, project_id, provider, model, automatic, day, input_tokens, output_tokens, at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// The same with the provider's health (`$13`–`$16`, confirmed after `$17` ms), as
/// [`set_health_in`] writes it: the guarded update, else an insert for a missing row. Neither
/// locks the row when the state is fresh and unchanged.
const RECORD_CALL_WITH_HEALTH_SQL: &str = "WITH released AS (\
       UPDATE provider_token_reservation SET released = TRUE WHERE job_id = $11 AND attempt = $12), \
     used AS (\
       INSERT INTO provider_usage (id, job_id, project_id, provider, model, automatic, day, input_tokens, output_tokens, at) \
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)), \
     confirmed AS (\
       UPDATE provider_health SET healthy = $13, status = $14, code = $15, detail = $16, updated_at = $10 \
       WHERE provider = $4 AND (healthy <> $13 OR status IS DISTINCT FROM $14 \
         OR code IS DISTINCT FROM $15 OR detail IS DISTINCT FROM $16 OR updated_at <= $10 - $17) \
       RETURNING 1) \
     INSERT INTO provider_health (provider, healthy, status, code, detail, updated_at) \
     SELECT $4, $13, $14, $15, $16, $10 WHERE NOT EXISTS (SELECT 1 FROM confirmed) \
     ON CONFLICT (provider) DO NOTHING";
