//! The daily token cap under concurrency: each automatic claim reserves its call's ceiling in the
//! claim transaction, so workers claiming at the same moment near the cap cannot together pass it.
//! Provider health, which every call reports, is written when it changes and confirmed at most
//! once a minute otherwise.

use std::sync::Arc;
use std::time::Duration;

use zuno_shared::db::{Backend, StoreError, Tx};
use zuno_shared::learning::SourceGate;
use zuno_shared::learning::usage::{self, UsageRecord};
use zuno_shared::ledger::{ClaimGate, ClaimRequest, GateDecision, Job, JobKind, Ledger};
use zuno_tests::fake_provider::FakeProvider;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{World, model_config};

const WORKERS: usize = 6;

/// The source gate, entered by every claimer at once: each claim transaction has locked its job
/// before any of them reads the budget, so the reads race unless reservations are serialized.
struct AllAtOnce {
    barrier: Option<Arc<tokio::sync::Barrier>>,
    gate: SourceGate,
}

#[async_trait::async_trait]
impl ClaimGate for AllAtOnce {
    async fn check(&self, tx: &mut Tx, job: &Job) -> Result<GateDecision, StoreError> {
        if let Some(barrier) = &self.barrier {
            tokio::time::timeout(Duration::from_secs(30), barrier.wait())
                .await
                .expect("every claimer reaches the gate");
        }
        self.gate.check(tx, job).await
    }
}

async fn concurrent_claims_near_the_cap_reserve_no_more_than_it_holds(db: TestDb) {
    let fake = FakeProvider::start().await;
    let mut config = model_config(fake.base_url());
    let ceiling = usage::call_ceiling(&config.learning.execution);
    let cap = 10 * ceiling;
    config.learning.execution.max_tokens_per_day = Some(cap);
    let world = World::new(db, config).await;
    // Earlier automatic work today left room for two and a half calls.
    let now = world.ledger.now_ms();
    let spent_before = cap - 2 * ceiling - ceiling / 2;
    let mut tx = world.db.db.begin().await.unwrap();
    usage::record_in(
        &mut tx,
        &UsageRecord {
            job_id: None,
            project_id: Some("proj"),
            provider: "fake",
            model: "fake-model",
            automatic: true,
            input_tokens: spent_before,
            output_tokens: 0,
        },
        now,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for _ in 0..WORKERS {
        let session = world.session().await;
        world.corrected_turn(&session).await;
    }

    // One claim per worker, all at once, each on its own connection pool like separate hosts.
    // On Postgres their transactions overlap inside the gate; SQLite runs one write transaction
    // at a time, so its claimers queue before they lock anything.
    let barrier = (world.db.backend == Backend::Postgres)
        .then(|| Arc::new(tokio::sync::Barrier::new(WORKERS)));
    let mut claims = Vec::new();
    for index in 0..WORKERS {
        let ledger = Ledger::new(world.db.reopen().await, world.ledger.clock().clone());
        let gate = AllAtOnce {
            barrier: barrier.clone(),
            gate: SourceGate::new(world.config.clone(), world.ledger.clock().clone()),
        };
        claims.push(tokio::spawn(async move {
            let worker_id = format!("worker-{index}");
            ledger
                .claim(
                    &ClaimRequest {
                        worker_id: &worker_id,
                        kinds: &[JobKind::Extract],
                        limit: 1,
                        lease_ms: 600_000,
                        scopes: None,
                    },
                    &gate,
                )
                .await
                .unwrap()
        }));
    }
    let batches: Vec<_> = futures::future::join_all(claims)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let claimed: usize = batches.iter().map(|batch| batch.claimed.len()).sum();
    let deferred: usize = batches.iter().map(|batch| batch.deferred).sum();
    assert_eq!(
        (claimed, deferred),
        (2, WORKERS - 2),
        "only two calls' ceilings fit under the cap"
    );

    let budget = usage::automatic_budget(&world.db.db, usage::day_of(now))
        .await
        .unwrap();
    assert_eq!(
        budget,
        usage::AutomaticBudget {
            spent: i64::try_from(spent_before).unwrap(),
            reserved: i64::try_from(2 * ceiling).unwrap(),
            // The one earlier call, and the two claimed ones in flight.
            calls_spent: 1,
            calls_reserved: 2,
        }
    );
    assert!(budget.spent + budget.reserved <= i64::try_from(cap).unwrap());
    // The calls in flight may spend less than they reserved: the others wait for them, not for
    // tomorrow.
    let waiting: Vec<i64> = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT run_at FROM learning_job WHERE kind = 'extract' AND state = 'queued'"
    )
    .fetch_all(pool)
    .await)
    .unwrap();
    assert_eq!(waiting.len(), WORKERS - 2);
    assert!(
        waiting
            .iter()
            .all(|run_at| *run_at > now && *run_at < usage::next_day_start(now)),
        "{waiting:?}"
    );
    assert_eq!(fake.request_count(), 0);
}

async fn provider_health_is_written_when_it_changes_and_confirmed_once_a_minute(db: TestDb) {
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let healthy = |at: i64| usage::ProviderHealth {
        provider: "fake".to_owned(),
        healthy: true,
        status: None,
        code: None,
        detail: None,
        updated_at: at,
    };
    let unhealthy = |at: i64| usage::ProviderHealth {
        healthy: false,
        status: Some(401),
        code: Some("invalid_api_key".to_owned()),
        detail: Some("the key was refused".to_owned()),
        ..healthy(at)
    };
    let minute = usage::HEALTH_CONFIRM_MS;
    let steps = [
        (
            healthy(1_000),
            healthy(1_000),
            "the first report is written",
        ),
        (
            healthy(2_000),
            healthy(1_000),
            "an unchanged state within the minute is not rewritten",
        ),
        (
            unhealthy(3_000),
            unhealthy(3_000),
            "a change is written at once",
        ),
        (
            unhealthy(4_000),
            unhealthy(3_000),
            "an unchanged failure is not rewritten",
        ),
        (
            healthy(5_000),
            healthy(5_000),
            "recovery is written at once",
        ),
        (
            healthy(5_000 + minute),
            healthy(5_000 + minute),
            "a minute later the state is confirmed",
        ),
    ];
    for (report, stored, what) in steps {
        let mut tx = world.db.db.begin().await.unwrap();
        usage::set_health_in(&mut tx, &report).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            usage::health(&world.db.db).await.unwrap(),
            [stored],
            "{what}"
        );
    }
}

/// A job's model call is recorded in one write (one statement on Postgres): its tokens, the
/// release of the attempt's reservation, and the provider's health as [`usage::set_health_in`]
/// writes it — at once on a change, not again for an unchanged state within the minute, and not
/// at all for a transient failure.
async fn a_job_call_records_tokens_releases_the_reservation_and_reports_health(db: TestDb) {
    use zuno_shared::provider::ProviderError;
    let world = World::new(db, zuno_shared::config::Config::default()).await;
    let session = world.session().await;
    let job_id = world
        .corrected_turn(&session)
        .await
        .admission
        .expect("admitted")
        .job()
        .id
        .clone();
    let mut tx = world.db.db.begin().await.unwrap();
    let reserved = usage::reserve_in(
        &mut tx,
        &job_id,
        1,
        100,
        usage::DailyCaps {
            tokens: Some(1_000_000),
            calls: None,
        },
        1_000,
    )
    .await
    .unwrap();
    assert_eq!(reserved, usage::Reservation::Held);
    tx.commit().await.unwrap();
    let call = |input_tokens: u64| UsageRecord {
        job_id: Some(&job_id),
        project_id: Some("proj"),
        provider: "fake",
        model: "fake-model",
        automatic: true,
        input_tokens,
        output_tokens: 7,
    };
    let refused = ProviderError::MissingCredential {
        variable: String::from("FAKE_API_KEY"),
    };
    let timeout = ProviderError::Timeout {
        deadline: Duration::from_secs(30),
    };
    let minute = usage::HEALTH_CONFIRM_MS;
    // (the call's failure, when, the health then stored: (healthy, updated_at), what)
    type Step<'a> = (Option<&'a ProviderError>, i64, (bool, i64), &'a str);
    let steps: [Step; 5] = [
        (None, 2_000, (true, 2_000), "the first report is written"),
        (
            None,
            3_000,
            (true, 2_000),
            "unchanged within the minute: not rewritten",
        ),
        (
            Some(&timeout),
            4_000,
            (true, 2_000),
            "a transient failure says nothing",
        ),
        (
            Some(&refused),
            5_000,
            (false, 5_000),
            "a refused credential is written at once",
        ),
        (
            None,
            6_000 + minute,
            (true, 6_000 + minute),
            "recovery is written at once",
        ),
    ];
    for (calls, (failure, at, (healthy, updated_at), what)) in steps.into_iter().enumerate() {
        usage::record_job_call(&world.db.db, &call(100 + calls as u64), 1, failure, at)
            .await
            .unwrap();
        let health = usage::health(&world.db.db).await.unwrap();
        assert_eq!(health.len(), 1, "{what}");
        assert_eq!(
            (health[0].healthy, health[0].updated_at),
            (healthy, updated_at),
            "{what}"
        );
        assert_eq!(
            world.scalar("SELECT COUNT(*) FROM provider_usage").await,
            calls as i64 + 1,
            "every call's tokens are recorded ({what})"
        );
    }
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM provider_token_reservation WHERE released")
            .await,
        1,
        "the attempt's reservation is released"
    );
    assert_eq!(
        world
            .scalar("SELECT CAST(SUM(input_tokens) AS BIGINT) FROM provider_usage")
            .await,
        100 + 101 + 102 + 103 + 104
    );
}

/// A 500-turn import under a daily budget of 25 automatic calls: the fake provider receives
/// exactly 25 requests; every other extraction waits for the next UTC day, queued, without
/// spending an attempt; `learn status` shows the budget spent and automatic learning paused.
async fn a_500_turn_import_makes_no_more_model_calls_than_the_daily_budget(db: TestDb) {
    const TURNS: usize = 500;
    const BUDGET: u64 = 25;
    let fake = FakeProvider::start_auto("127.0.0.1:0").await.unwrap();
    let mut config = model_config(fake.base_url());
    config.learning.execution.max_calls_per_day = Some(BUDGET);
    let world = World::new(db, config).await;
    let session = world.session().await;
    for _ in 0..TURNS {
        world.corrected_turn(&session).await;
    }
    let now = world.ledger.now_ms();
    // A worker stops once a claim round finds nothing it may run: rounds that only defer stop
    // it too, so run workers until no extraction is due.
    let mut rounds = 0;
    while world
        .scalar_i64(
            "SELECT COUNT(*) FROM learning_job WHERE kind = 'extract' AND state = 'queued' \
               AND run_at <= $1",
            world.ledger.now_ms(),
        )
        .await
        > 0
    {
        rounds += 1;
        assert!(rounds <= TURNS, "extraction never settled or deferred");
        world.run_extract().await;
    }

    assert_eq!(fake.request_count(), BUDGET as usize, "calls made");
    let budget = usage::automatic_budget(&world.db.db, usage::day_of(now))
        .await
        .unwrap();
    assert_eq!((budget.calls_spent, budget.calls_reserved), (25, 0));
    let jobs = world
        .ledger
        .list(&zuno_shared::ledger::JobFilter {
            kind: Some(JobKind::Extract),
            limit: 1000,
            ..zuno_shared::ledger::JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), TURNS);
    let (done, waiting): (Vec<_>, Vec<_>) = jobs
        .iter()
        .partition(|job| job.state == zuno_shared::ledger::JobState::Completed);
    assert_eq!(done.len(), BUDGET as usize);
    for job in &waiting {
        assert_eq!(job.state, zuno_shared::ledger::JobState::Queued, "{job:?}");
        assert_eq!(job.attempts, 0, "a deferred job spent an attempt: {job:?}");
        assert!(job.run_at > now, "{job:?}");
    }
    // A job claimed while calls were in flight waits for them (they may spend less than they
    // reserved); every other one waits for tomorrow.
    let tomorrow = waiting
        .iter()
        .filter(|job| job.run_at >= usage::next_day_start(now))
        .count();
    assert!(
        tomorrow >= waiting.len() - 8,
        "{tomorrow} of {}",
        waiting.len()
    );
    let status = zuno_shared::learning::projection::project_status(
        &world.db.db,
        &world.ledger,
        &world.config,
        "proj",
    )
    .await
    .unwrap();
    assert_eq!(status.automatic_calls_today, 25);
    assert_eq!(status.max_calls_per_day, Some(BUDGET));
    assert!(status.automatic_paused);
}

on_both_backends!(
    a_500_turn_import_makes_no_more_model_calls_than_the_daily_budget,
    concurrent_claims_near_the_cap_reserve_no_more_than_it_holds,
    provider_health_is_written_when_it_changes_and_confirmed_once_a_minute,
    a_job_call_records_tokens_releases_the_reservation_and_reports_health,
);
