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

mod store;

pub use store::{automatic_budget, automatic_budget_in, day_totals, health, set_health_in};

use crate::config::ExecutionConfig;
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
    store::insert_usage_in(tx, usage, now).await?;
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
    let attempt = store::Attempt { job_id, attempt };
    if store::reservation_held_in(tx, attempt).await? {
        return Ok(Reservation::Held);
    }
    store::serialize_reservations_in(tx).await?;
    let day = day_of(now);
    let budget = automatic_budget_in(tx, day).await?;
    if !budget.admits(ceiling, caps) {
        return Ok(if budget.recorded_only().admits(ceiling, caps) {
            Reservation::WaitForInFlight { budget }
        } else {
            Reservation::Exhausted { budget }
        });
    }
    let reservation = store::NewReservation {
        attempt,
        day,
        tokens: ceiling,
        now,
    };
    store::insert_reservation_in(tx, &reservation).await?;
    Ok(Reservation::Held)
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenTotals {
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub requests: i64,
}

pub async fn job_totals(db: &Db, job_id: &str) -> Result<TokenTotals, StoreError> {
    store::totals(db, store::TotalsOf::Job(job_id)).await
}

pub async fn project_totals(
    db: &Db,
    project_id: &str,
    day: Option<i64>,
) -> Result<TokenTotals, StoreError> {
    store::totals(
        db,
        store::TotalsOf::Project {
            id: project_id,
            day,
        },
    )
    .await
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

/// Records one model call of a learning job, committed on its own: the tokens in
/// `provider_usage` (so job, project and day totals, the daily budget and status include them),
/// the provider's health ([`health_after`]) and the release of the attempt's token
/// reservation. On Postgres it is one statement instead of a transaction of five: every attempt
/// that asks the model records one call, so this is on the job path.
pub async fn record_job_call(
    db: &Db,
    usage: &UsageRecord<'_>,
    attempt: i64,
    failure: Option<&crate::provider::ProviderError>,
    now: i64,
) -> Result<(), StoreError> {
    let health = health_after(usage.provider, failure, now);
    if let Some(pool) = db.as_postgres() {
        let call = store::JobCall {
            usage,
            attempt,
            health: health.as_ref(),
            now,
        };
        store::record_job_call_at_once(pool, &call).await?;
        report_tokens(usage);
        return Ok(());
    }
    let mut tx = db.begin().await?;
    record_in(&mut tx, usage, now).await?;
    if let Some(health) = &health {
        set_health_in(&mut tx, health).await?;
    }
    let job_id = usage.job_id.unwrap_or_default();
    store::release_in(&mut tx, store::Attempt { job_id, attempt }).await?;
    tx.commit().await
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
