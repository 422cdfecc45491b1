//! Provider token accounting and health. Every provider call records its input and output tokens
//! from the provider's usage fields; totals per job, project and day are visible in status and
//! metrics, and an optional daily cap holds back automatic model calls (never manual commands).
//!
//! The cap is enforced at claim: an automatic job that will call the model reserves its call's
//! ceiling ([`call_ceiling`]) inside the claim transaction, serialized with every other
//! reservation of the day, and is admitted only if today's automatic spend, the reservations of
//! calls still in flight and its own ceiling fit under the cap. Recording the call's actual spend
//! releases the reservation, so concurrent claims near the cap cannot together pass it.

use serde::Serialize;

use crate::config::ExecutionConfig;
use crate::db::{Backend, Db, StoreError, Tx};

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
    crate::db::execute_in(
        tx,
        sql,
        &[
            (&crate::ids::new_id("use")).into(),
            usage.job_id.into(),
            usage.project_id.into(),
            usage.provider.into(),
            usage.model.into(),
            usage.automatic.into(),
            (day_of(now)).into(),
            (i64::try_from(usage.input_tokens).unwrap_or(i64::MAX)).into(),
            (i64::try_from(usage.output_tokens).unwrap_or(i64::MAX)).into(),
            now.into(),
        ],
    )
    .await?;
    report_tokens(usage);
    Ok(())
}

/// The provider metrics' token counters, for a call whose usage row was written.
fn report_tokens(usage: &UsageRecord<'_>) {
    crate::telemetry::metrics::provider().tokens(
        usage.provider,
        usage.model,
        usage.input_tokens,
        usage.output_tokens,
    );
}

/// Instructions, schema and framing around a call's bounded input, in tokens.
const PROMPT_OVERHEAD_TOKENS: u64 = 8192;

/// The most one model call may spend under `execution`, as the daily cap reserves it: the
/// bounded input (at most one token per byte) with its instructions and the output limit, sent
/// twice (the first request and the one repair, which resends the conversation with the first
/// answer).
pub fn call_ceiling(execution: &ExecutionConfig) -> u64 {
    let input = execution
        .max_input_bytes
        .saturating_add(PROMPT_OVERHEAD_TOKENS);
    input
        .saturating_mul(2)
        .saturating_add(execution.max_output_tokens.saturating_mul(3))
}

/// Today's automatic model work: tokens and calls, each spent (recorded calls) and reserved
/// (calls in flight).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutomaticBudget {
    pub spent: i64,
    pub reserved: i64,
    pub calls_spent: i64,
    pub calls_reserved: i64,
}

/// The daily caps on automatic model work (manual commands are never held back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DailyCaps {
    /// `learning.execution.max_tokens_per_day`.
    pub tokens: Option<u64>,
    /// `learning.execution.max_calls_per_day`, else [`DEFAULT_COMMAND_LINE_CALLS_PER_DAY`] when
    /// the learning model is an agent's command line.
    pub calls: Option<u64>,
}

/// The daily call budget of automatic learning when the model is an agent's command line and
/// none is configured: those calls spend the user's own subscription (ADR 0008).
pub const DEFAULT_COMMAND_LINE_CALLS_PER_DAY: u64 = 200;

impl DailyCaps {
    /// The caps in force under `config`.
    pub fn of(config: &crate::config::Config) -> DailyCaps {
        let execution = &config.learning.execution;
        let command_line =
            crate::provider::resolve_model(config, None).is_ok_and(|model| model.api.is_cli());
        DailyCaps {
            tokens: execution.max_tokens_per_day,
            calls: execution
                .max_calls_per_day
                .or(command_line.then_some(DEFAULT_COMMAND_LINE_CALLS_PER_DAY)),
        }
    }

    pub fn any(&self) -> bool {
        self.tokens.is_some() || self.calls.is_some()
    }
}

impl AutomaticBudget {
    /// Whether one more call of `ceiling` tokens fits under `caps`.
    pub fn admits(&self, ceiling: u64, caps: DailyCaps) -> bool {
        let fits = |used: i64, more: u64, cap: Option<u64>| {
            cap.is_none_or(|cap| {
                let more = i64::try_from(more).unwrap_or(i64::MAX);
                used.saturating_add(more) <= i64::try_from(cap).unwrap_or(i64::MAX)
            })
        };
        fits(
            self.spent.saturating_add(self.reserved),
            ceiling,
            caps.tokens,
        ) && fits(
            self.calls_spent.saturating_add(self.calls_reserved),
            1,
            caps.calls,
        )
    }

    /// The same budget without the calls in flight.
    fn recorded_only(self) -> AutomaticBudget {
        AutomaticBudget {
            reserved: 0,
            calls_reserved: 0,
            ..self
        }
    }
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

type BudgetRow = (i64, i64, i64, i64);

fn budget_of((spent, reserved, calls_spent, calls_reserved): BudgetRow) -> AutomaticBudget {
    AutomaticBudget {
        spent,
        reserved,
        calls_spent,
        calls_reserved,
    }
}

/// Today's automatic spend and live reservations, read in one statement.
pub async fn automatic_budget_in(tx: &mut Tx, day: i64) -> Result<AutomaticBudget, StoreError> {
    let row: BudgetRow = crate::on_tx!(tx, |conn| sqlx::query_as(BUDGET_SQL)
        .bind(day)
        .fetch_one(conn)
        .await)?;
    Ok(budget_of(row))
}

pub async fn automatic_budget(db: &Db, day: i64) -> Result<AutomaticBudget, StoreError> {
    let row: BudgetRow = crate::on_db!(db, |pool| sqlx::query_as(BUDGET_SQL)
        .bind(day)
        .fetch_one(pool)
        .await)?;
    Ok(budget_of(row))
}

/// What [`reserve_in`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The attempt holds `ceiling` tokens of today's cap (now, or since its claim).
    Held,
    /// Calls in flight hold the room; their actual spend may leave enough once recorded.
    WaitForInFlight { budget: AutomaticBudget },
    /// Today's recorded spend leaves no room for one more call.
    Exhausted { budget: AutomaticBudget },
}

/// Reserves one call of `ceiling` tokens under today's `caps` for attempt `attempt` of `job_id`,
/// inside the
/// caller's claim transaction. Reservations are serialized (Postgres: a transaction-scoped
/// advisory lock; SQLite: the transaction already holds the only write lock), so each one reads
/// every earlier one. Asking again for an attempt that holds a reservation (a heartbeat's
/// recheck) changes nothing.
pub async fn reserve_in(
    tx: &mut Tx,
    job_id: &str,
    attempt: i64,
    ceiling: u64,
    caps: DailyCaps,
    now: i64,
) -> Result<Reservation, StoreError> {
    let held: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT attempt FROM provider_token_reservation WHERE job_id = $1 AND attempt = $2"
    )
    .bind(job_id)
    .bind(attempt)
    .fetch_optional(conn)
    .await)?;
    if held.is_some() {
        return Ok(Reservation::Held);
    }
    if tx.backend() == Backend::Postgres {
        // Taken by every reserver and held to commit: the next reserver's reads start after
        // this claim's reservation is visible.
        crate::db::execute_in(
            tx,
            "SELECT pg_advisory_xact_lock($1)",
            &[RESERVATION_LOCK.into()],
        )
        .await?;
    }
    let day = day_of(now);
    let budget = automatic_budget_in(tx, day).await?;
    if !budget.admits(ceiling, caps) {
        return Ok(if budget.recorded_only().admits(ceiling, caps) {
            Reservation::WaitForInFlight { budget }
        } else {
            Reservation::Exhausted { budget }
        });
    }
    crate::db::execute_in(
        tx,
        "INSERT INTO provider_token_reservation (job_id, attempt, day, tokens, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        &[
            job_id.into(),
            attempt.into(),
            day.into(),
            (i64::try_from(ceiling).unwrap_or(i64::MAX)).into(),
            now.into(),
        ],
    )
    .await?;
    // Past days' rows can no longer count; dropping them here keeps the table to one day.
    crate::db::execute_in(
        tx,
        "DELETE FROM provider_token_reservation WHERE day < $1",
        &[day.into()],
    )
    .await?;
    Ok(Reservation::Held)
}

/// The advisory lock key that serializes reservations on Postgres.
const RESERVATION_LOCK: i64 = 0x007a_756e_6f63_6170;

/// Releases the reservation of one attempt: its call's actual spend is recorded now.
async fn release_in(tx: &mut Tx, job_id: &str, attempt: i64) -> Result<(), StoreError> {
    crate::db::execute_in(
        tx,
        "UPDATE provider_token_reservation SET released = TRUE WHERE job_id = $1 AND attempt = $2",
        &[job_id.into(), attempt.into()],
    )
    .await?;
    Ok(())
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
    let (input_tokens, output_tokens, requests): (i64, i64, i64) =
        crate::on_db!(db, |pool| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(key)
            .bind(day)
            .fetch_one(pool)
            .await)?;
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
        crate::on_db!(db, |pool| sqlx::query_as(sql)
            .bind(day)
            .fetch_one(pool)
            .await)?;
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
    /// When this state was recorded, or last confirmed by a call (an unchanged state at most
    /// once a minute).
    pub updated_at: i64,
}

/// How long a provider's unchanged health stands before a call confirms it again.
pub const HEALTH_CONFIRM_MS: i64 = 60_000;

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
    let update = "UPDATE provider_health SET healthy = $2, status = $3, code = $4, detail = $5, updated_at = $6 \
                  WHERE provider = $1 AND (healthy <> $2 OR status IS DISTINCT FROM $3 \
                    OR code IS DISTINCT FROM $4 OR detail IS DISTINCT FROM $5 OR updated_at <= $6 - $7)";
    if crate::db::execute_in(tx, update, &args).await? == 0 {
        let insert = "INSERT INTO provider_health (provider, healthy, status, code, detail, updated_at) \
                      VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (provider) DO NOTHING";
        crate::db::execute_in(tx, insert, &args[..6]).await?;
    }
    Ok(())
}

/// Records one model call of a learning job: the tokens in `provider_usage` (so job, project and
/// day totals, the daily budget and
/// status include them) and the provider's health — any answer marks it healthy, a credential
/// or unknown-model failure unhealthy, transient failures say nothing.
async fn record_call_in(
    tx: &mut Tx,
    usage: &UsageRecord<'_>,
    failure: Option<&crate::provider::ProviderError>,
    now: i64,
) -> Result<(), StoreError> {
    record_in(tx, usage, now).await?;
    if let Some(health) = health_after(usage.provider, failure, now) {
        set_health_in(tx, &health).await?;
    }
    Ok(())
}

/// What a call's outcome says of its provider's health: any answer marks it healthy, a
/// credential or unknown-model failure unhealthy, transient failures say nothing.
fn health_after(
    provider: &str,
    failure: Option<&crate::provider::ProviderError>,
    now: i64,
) -> Option<ProviderHealth> {
    use crate::provider::ProviderError;
    match failure {
        None => Some(ProviderHealth {
            provider: provider.to_owned(),
            healthy: true,
            status: None,
            code: None,
            detail: None,
            updated_at: now,
        }),
        Some(
            error @ (ProviderError::Auth(_)
            | ProviderError::ModelUnavailable(_)
            | ProviderError::MissingCredential { .. }
            | ProviderError::CommandUnavailable { .. }),
        ) => {
            let diagnostic = error.diagnostic();
            Some(ProviderHealth {
                provider: provider.to_owned(),
                healthy: false,
                status: diagnostic.and_then(|d| d.status).map(i64::from),
                code: diagnostic.and_then(|d| d.code.clone()),
                detail: Some(error.to_string()),
                updated_at: now,
            })
        }
        Some(_) => None,
    }
}

/// A job attempt's model call, recorded as [`record_call_in`] records it, with the release of
/// the attempt's token reservation ([`release_in`]), committed on its own. On Postgres it is
/// one statement (the usage insert, the release and the health check as data-modifying
/// `WITH` parts) instead of a transaction of five: every attempt that asks the model records
/// one call, so this is on the job path.
pub async fn record_job_call(
    db: &Db,
    usage: &UsageRecord<'_>,
    attempt: i64,
    failure: Option<&crate::provider::ProviderError>,
    now: i64,
) -> Result<(), StoreError> {
    let job_id = usage.job_id.unwrap_or_default();
    let Some(pool) = db.as_postgres() else {
        let mut tx = db.begin().await?;
        record_call_in(&mut tx, usage, failure, now).await?;
        release_in(&mut tx, job_id, attempt).await?;
        return tx.commit().await;
    };
    let health = health_after(usage.provider, failure, now);
    let (sql, health) = match &health {
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
        .bind(day_of(now))
        .bind(i64::try_from(usage.input_tokens).unwrap_or(i64::MAX))
        .bind(i64::try_from(usage.output_tokens).unwrap_or(i64::MAX))
        .bind(now)
        .bind(job_id)
        .bind(attempt);
    if let Some(health) = health {
        query = query
            .bind(health.healthy)
            .bind(health.status)
            .bind(&health.code)
            .bind(&health.detail)
            .bind(HEALTH_CONFIRM_MS);
    }
    query.execute(pool).await?;
    report_tokens(usage);
    Ok(())
}

/// [`record_job_call`]'s statement when the outcome says nothing of health: `$1`–`$10` the
/// usage row, `$11`/`$12` the reservation's job and attempt.
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

pub async fn health(db: &Db) -> Result<Vec<ProviderHealth>, StoreError> {
    let sql = "SELECT provider, healthy, status, code, detail, updated_at FROM provider_health ORDER BY provider";
    Ok(crate::on_db!(db, |pool| sqlx::query_as(sql)
        .fetch_all(pool)
        .await)?)
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

    #[test]
    fn a_call_fits_only_when_spend_reservations_and_its_ceiling_stay_under_the_cap() {
        let execution = ExecutionConfig {
            max_input_bytes: 1000,
            max_output_tokens: 100,
            ..ExecutionConfig::default()
        };
        let ceiling = call_ceiling(&execution);
        assert_eq!(ceiling, 2 * (1000 + PROMPT_OVERHEAD_TOKENS) + 3 * 100);
        let budget = |spent, reserved| AutomaticBudget {
            spent,
            reserved,
            ..AutomaticBudget::default()
        };
        let tokens = |cap| DailyCaps {
            tokens: Some(cap),
            calls: None,
        };
        let exact = ceiling + 500;
        assert!(budget(250, 250).admits(ceiling, tokens(exact)));
        assert!(!budget(250, 251).admits(ceiling, tokens(exact)));
        assert!(!budget(501, 0).admits(ceiling, tokens(exact)));
        assert!(!budget(0, 0).admits(ceiling, tokens(ceiling - 1)));
        assert!(budget(0, 0).admits(u64::MAX, tokens(u64::MAX)));
        assert!(budget(i64::MAX, 0).admits(ceiling, DailyCaps::default()));
    }

    #[test]
    fn a_call_fits_only_while_calls_done_and_in_flight_leave_one() {
        let calls = |spent, reserved| AutomaticBudget {
            calls_spent: spent,
            calls_reserved: reserved,
            ..AutomaticBudget::default()
        };
        let cap = DailyCaps {
            tokens: None,
            calls: Some(10),
        };
        assert!(calls(5, 4).admits(1, cap));
        assert!(!calls(5, 5).admits(1, cap));
        assert!(!calls(10, 0).admits(1, cap));
        assert!(calls(5, 5).recorded_only().admits(1, cap));
    }

    #[test]
    fn command_line_models_get_a_call_budget_by_default_and_api_models_none() {
        use crate::config::{Config, ProviderApi, ProviderConfig};
        let with = |api: ProviderApi, base_url: &str| {
            let mut config = Config::default();
            config.providers.insert(
                "p".into(),
                ProviderConfig {
                    api,
                    base_url: base_url.into(),
                    api_key_env: None,
                    header_envs: Default::default(),
                    small_model: None,
                    models: Default::default(),
                },
            );
            config.learning.extractor_model = Some("p/m".into());
            config
        };
        let cli = with(ProviderApi::ClaudeCli, "");
        assert_eq!(
            DailyCaps::of(&cli).calls,
            Some(DEFAULT_COMMAND_LINE_CALLS_PER_DAY)
        );
        let api = with(ProviderApi::OpenaiChat, "http://127.0.0.1:9/v1");
        assert_eq!(DailyCaps::of(&api), DailyCaps::default());
        let mut chosen = cli.clone();
        chosen.learning.execution.max_calls_per_day = Some(7);
        assert_eq!(DailyCaps::of(&chosen).calls, Some(7));
        assert_eq!(DailyCaps::of(&Config::default()), DailyCaps::default());
    }
}
