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

on_both_backends!(
    concurrent_claims_near_the_cap_reserve_no_more_than_it_holds,
    provider_health_is_written_when_it_changes_and_confirmed_once_a_minute,
);
