//! Fleet fault tests: real containers of the locally built images (`scripts/images`) on a
//! private Docker network around a Postgres container, with `zuno-probe` workers whose handler
//! records one effect row per job inside its fenced settlement transaction. Each test breaks the
//! fleet the way an operator or the infrastructure would — `docker kill`, `docker pause`,
//! `docker network disconnect`, a rolling restart, a database restart — and then checks the
//! ledger's promises from the database (`Fleet::assert_ledger_promises`): no job lost, none
//! applied twice, every settlement accepted or fenced correctly, attempts never above three.
//!
//! Every wait polls the database for a condition under a deadline. The tests skip (printing
//! `SKIP:`) only when no Docker engine is reachable; `scripts/fault-tests` runs them alone.

#[macro_use]
mod docker;
mod compose;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use docker::{Fleet, JobRow, WorkerSpec};

const SETTLE: Duration = Duration::from_secs(120);
const HOLD_FOREVER: u64 = 600_000;

async fn admit_all(fleet: &Fleet, prefix: &str, count: usize) -> BTreeSet<String> {
    let mut admitted = BTreeSet::new();
    for n in 0..count {
        admitted.insert(fleet.admit(&format!("{prefix}-{n}")).await);
    }
    admitted
}

/// Waits until `worker` holds a live lease on every admitted job; returns the rows.
async fn held_by(fleet: &Fleet, worker: &str, admitted: &BTreeSet<String>) -> Vec<JobRow> {
    fleet
        .wait_jobs(
            &format!("{worker} holds every job"),
            Duration::from_secs(60),
            |jobs| {
                (jobs.len() == admitted.len()
                    && jobs.iter().all(|job| {
                        job.state == "running" && job.lease_owner.as_deref() == Some(worker)
                    }))
                .then(|| jobs.to_vec())
            },
        )
        .await
}

/// Waits until `worker` has a `fenced` event for every admitted job: its stale attempt reached
/// the database and was refused.
async fn fenced_for_every_job(fleet: &Fleet, worker: &str, admitted: &BTreeSet<String>) {
    let fenced: BTreeSet<String> = fleet
        .wait_events(
            &format!("{worker}'s stale writes are refused for every job"),
            Duration::from_secs(90),
            |events| {
                let fenced: BTreeSet<String> = events
                    .iter()
                    .filter(|e| e.event == "fenced" && e.worker_id.as_deref() == Some(worker))
                    .map(|e| e.job_id.clone())
                    .collect();
                (&fenced == admitted).then_some(fenced)
            },
        )
        .await;
    for event in fleet.events().await.unwrap() {
        if event.event == "fenced" && fenced.contains(&event.job_id) {
            eprintln!("fenced: {} {:?}", event.job_id, event.detail);
        }
    }
}

/// The stale worker's attempts left no effect; the rescuer's did, once per job.
async fn only_rescuer_applied(fleet: &Fleet, stale: &str, rescuer: &str) {
    let effects = fleet.effects().await.unwrap();
    assert!(
        effects
            .iter()
            .all(|e| e.worker_id == rescuer && e.attempt == 2),
        "only {rescuer}'s second attempts committed, nothing of {stale}: {effects:?}"
    );
}

/// `docker kill` a worker holding leases: another worker completes its jobs once the leases
/// expire, on the second attempt, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_jobs_are_completed_by_another_after_the_lease() {
    require_docker!();
    let fleet = Fleet::start("kill").await;
    let admitted = admit_all(&fleet, "kill", 4).await;
    let victim = fleet
        .worker("victim", WorkerSpec::holding(HOLD_FOREVER))
        .await;
    let held = held_by(&fleet, "victim", &admitted).await;
    docker::docker(&["kill", &victim]).await;
    // The survivor starts after the kill and can claim only what has expired.
    fleet.worker("survivor", WorkerSpec::holding(100)).await;

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("kill: {summary:?}");
    only_rescuer_applied(&fleet, "victim", "survivor").await;
    let events = fleet.events().await.unwrap();
    for job in &held {
        assert!(
            events.iter().any(|e| e.job_id == job.id
                && e.event == "lease_expired"
                && e.worker_id.as_deref() == Some("victim")),
            "the victim's lease on {} was rescued as expired: {events:?}",
            job.id
        );
    }
    let effects = fleet.effects().await.unwrap();
    for effect in &effects {
        let held = held.iter().find(|job| job.id == effect.job_id).unwrap();
        // The last lease the victim held may have been extended by heartbeats after `held`
        // was read, never shortened: the rescue came after the lease seen here expired.
        assert!(
            effect.at >= held.lease_expires_at.unwrap(),
            "completed only after the victim's lease expired: {effect:?} vs {held:?}"
        );
    }
    assert_eq!((summary.jobs, summary.retried), (4, 4));
    assert_eq!(fleet.state(&victim).await, "exited");
}

/// `docker pause` a worker past its lease while another completes its jobs, then `unpause`:
/// the resumed worker's stale writes (settlement or heartbeat, whichever its frozen timers send
/// first) are refused with a `fenced` event, and only the rescuer's effects exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_resumed_after_its_lease_is_fenced() {
    require_docker!();
    let fleet = Fleet::start("pause").await;
    let admitted = admit_all(&fleet, "pause", 2).await;
    let hold = 3_000;
    let stalled = fleet.worker("stalled", WorkerSpec::holding(hold)).await;
    held_by(&fleet, "stalled", &admitted).await;
    let paused_at = fleet.ledger.now_ms();
    docker::docker(&["pause", &stalled]).await;
    fleet.worker("rescuer", WorkerSpec::holding(100)).await;
    fleet
        .wait_jobs(
            "the rescuer completes every job",
            Duration::from_secs(60),
            |jobs| {
                jobs.iter()
                    .all(|job| job.state == "completed")
                    .then_some(())
            },
        )
        .await;
    // Keep it frozen until its own work would have finished too, so on resume its settlement
    // is due at once (racing its overdue heartbeat).
    zuno_tests::eventually(
        "the stalled worker's hold has elapsed",
        Duration::from_secs(30),
        || async {
            let elapsed = fleet.ledger.now_ms() >= paused_at + hold as i64;
            if !elapsed {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            elapsed.then_some(())
        },
    )
    .await;
    docker::docker(&["unpause", &stalled]).await;
    fenced_for_every_job(&fleet, "stalled", &admitted).await;

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("pause: {summary:?}");
    assert!(summary.fenced >= 2, "{summary:?}");
    only_rescuer_applied(&fleet, "stalled", "rescuer").await;
    assert_eq!(
        fleet.state(&stalled).await,
        "running",
        "the stale worker lives on"
    );
}

/// `docker network disconnect` a worker from the database mid-job, and reconnect it after
/// another worker took over: its writes, delayed in the network, arrive after the takeover and
/// are refused; every job is applied once, by the rescuer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_the_database_is_fenced_after_reconnecting() {
    require_docker!();
    let fleet = Fleet::start("partition").await;
    let admitted = admit_all(&fleet, "partition", 2).await;
    // It never finishes on its own: only its heartbeats are in flight when the network heals.
    let cut = fleet
        .worker("cut-off", WorkerSpec::holding(HOLD_FOREVER))
        .await;
    held_by(&fleet, "cut-off", &admitted).await;
    let address = fleet.address(&cut).await;
    fleet.disconnect(&cut).await;
    fleet.worker("rescuer", WorkerSpec::holding(100)).await;
    fleet
        .wait_jobs(
            "the rescuer completes every job",
            Duration::from_secs(60),
            |jobs| {
                jobs.iter()
                    .all(|job| job.state == "completed")
                    .then_some(())
            },
        )
        .await;
    fleet.reconnect(&cut, &address).await;
    fenced_for_every_job(&fleet, "cut-off", &admitted).await;

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("partition: {summary:?}");
    assert!(summary.fenced >= 2, "{summary:?}");
    only_rescuer_applied(&fleet, "cut-off", "rescuer").await;
    assert_eq!(fleet.state(&cut).await, "running");
}

/// Admits one job every `every` until stopped; returns the admitted ids.
fn steady_admissions(
    fleet: Arc<Fleet>,
    prefix: &'static str,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeSet<String>> {
    tokio::spawn(async move {
        let mut admitted = BTreeSet::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            admitted.insert(fleet.admit(&format!("{prefix}-{n}")).await);
            n += 1;
        }
        admitted
    })
}

/// Waits until `worker` has committed an effect after `since` (it is back at work).
async fn works_again(fleet: &Fleet, worker: &str, since: i64) {
    fleet
        .wait_effects(
            &format!("{worker} completes jobs again"),
            Duration::from_secs(60),
            |effects| {
                effects
                    .iter()
                    .any(|e| e.worker_id == worker && e.at > since)
                    .then_some(())
            },
        )
        .await;
}

/// A rolling restart (`docker restart`: SIGTERM, graceful drain, start) of every worker, one at
/// a time, under steady admission load: nothing is lost or applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing() {
    require_docker!();
    let fleet = Arc::new(Fleet::start("rolling").await);
    let workers = ["w1", "w2", "w3"];
    let mut containers = Vec::new();
    for worker in workers {
        containers.push(fleet.worker(worker, WorkerSpec::holding(200)).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_admissions(
        fleet.clone(),
        "rolling",
        Duration::from_millis(50),
        stop.clone(),
    );
    for worker in workers {
        works_again(&fleet, worker, 0).await;
    }
    for (worker, container) in workers.iter().zip(&containers) {
        docker::docker(&["restart", "--time", "10", container]).await;
        let restarted = fleet.ledger.now_ms();
        works_again(&fleet, worker, restarted).await;
    }
    stop.store(true, Ordering::SeqCst);
    let admitted = load.await.unwrap();
    assert!(admitted.len() >= 50, "load was steady: {}", admitted.len());

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("rolling restart: {summary:?}");
    for worker in workers {
        assert!(
            summary.effects_by_worker.get(worker).copied().unwrap_or(0) > 0,
            "{summary:?}"
        );
    }
}

/// Postgres restarts (`docker restart`) under load: workers reconnect and continue, admissions
/// retried across the outage are not duplicated, and every job completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_load_is_survived() {
    require_docker!();
    let fleet = Arc::new(Fleet::start("pgrestart").await);
    let workers = ["w1", "w2"];
    for worker in workers {
        fleet.worker(worker, WorkerSpec::holding(100)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_admissions(
        fleet.clone(),
        "pgrestart",
        Duration::from_millis(50),
        stop.clone(),
    );
    for worker in workers {
        works_again(&fleet, worker, 0).await;
    }
    docker::docker(&["restart", "--time", "10", &fleet.postgres]).await;
    let restarted = fleet.ledger.now_ms();
    for worker in workers {
        works_again(&fleet, worker, restarted).await;
    }
    stop.store(true, Ordering::SeqCst);
    let admitted = load.await.unwrap();

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("postgres restart: {summary:?}");
}

/// A 30 s Postgres outage (`docker pause`, then `docker unpause`: the database answers nothing,
/// and its published port stays taken, so no other test's server can be handed that port while it
/// is down) under steady load, shorter than the workers' lease: a transient database error re-runs
/// the job and heartbeats retry until the lease's own deadline, so the outage costs no attempt.
/// Every job completes exactly once and none is past attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_shorter_than_the_lease_costs_no_attempt_under_load() {
    require_docker!();
    let fleet = Arc::new(Fleet::start("pgoutage").await);
    let workers = ["w1", "w2"];
    let spec = WorkerSpec {
        lease_ms: 60_000,
        heartbeat_ms: 2_000,
        hold_ms: 100,
        concurrency: 4,
    };
    for worker in workers {
        fleet.worker(worker, spec).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_admissions(
        fleet.clone(),
        "pgoutage",
        Duration::from_millis(50),
        stop.clone(),
    );
    for worker in workers {
        works_again(&fleet, worker, 0).await;
    }
    docker::docker(&["pause", &fleet.postgres]).await;
    // The fault itself: how long the database stays down, not a wait for a state.
    tokio::time::sleep(Duration::from_secs(30)).await;
    docker::docker(&["unpause", &fleet.postgres]).await;
    let restored = fleet.ledger.now_ms();
    for worker in workers {
        works_again(&fleet, worker, restored).await;
    }
    stop.store(true, Ordering::SeqCst);
    let admitted = load.await.unwrap();

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    let jobs = fleet.jobs().await.unwrap();
    let past_first: Vec<&JobRow> = jobs.iter().filter(|job| job.attempts > 1).collect();
    assert!(
        past_first.is_empty(),
        "an outage shorter than the lease spent attempts: {past_first:?}"
    );
    eprintln!("postgres outage: {summary:?}");
}

/// Ends every worker connection at once (`pg_terminate_backend`, as a database blip or a
/// failover does) at a moment when a settlement is in flight: a worker connection inside a
/// transaction whose latest statement wrote the probe's effect, which only the settlement
/// transaction does. Returns how many worker connections were inside a transaction. The test's
/// own connections (from the host, through the published port) are spared.
async fn blip_during_a_settlement(fleet: &Fleet) -> i64 {
    let pool = fleet.db.as_postgres().expect("the fleet runs on Postgres");
    zuno_tests::eventually(
        "a settlement is in flight when the blip comes",
        Duration::from_secs(60),
        || async {
            let (inside, terminated): (i64, i64) = sqlx::query_as(
                "WITH workers AS ( \
                   SELECT pid, xact_start, query FROM pg_stat_activity \
                   WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() \
                     AND client_addr IS DISTINCT FROM (SELECT client_addr FROM pg_stat_activity WHERE pid = pg_backend_pid())), \
                 settling AS (SELECT COUNT(*) AS n FROM workers WHERE xact_start IS NOT NULL AND query LIKE '%probe_effect%') \
                 SELECT (SELECT COUNT(*) FROM workers WHERE xact_start IS NOT NULL), \
                        COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) \
                 FROM workers WHERE (SELECT n FROM settling) > 0",
            )
            .fetch_one(pool)
            .await
            .ok()?;
            if terminated == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return None;
            }
            Some(inside)
        },
    )
    .await
}

/// The database drops every worker connection three times while a settlement is in flight,
/// under steady load: the workers reconnect, and every job is
/// applied exactly once (none lost, none duplicated, attempts within the ceiling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_blips_during_settlement_lose_and_duplicate_nothing() {
    require_docker!();
    let fleet = Arc::new(Fleet::start("blip").await);
    let workers = ["w1", "w2"];
    for worker in workers {
        fleet.worker(worker, WorkerSpec::holding(100)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_admissions(
        fleet.clone(),
        "blip",
        Duration::from_millis(50),
        stop.clone(),
    );
    for worker in workers {
        works_again(&fleet, worker, 0).await;
    }
    let mut interrupted = Vec::new();
    for _ in 0..3 {
        interrupted.push(blip_during_a_settlement(&fleet).await);
        let after = fleet.ledger.now_ms();
        for worker in workers {
            works_again(&fleet, worker, after).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let admitted = load.await.unwrap();

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("database blips (transactions cut: {interrupted:?}): {summary:?}");
    assert!(interrupted.iter().all(|n| *n >= 1), "{interrupted:?}");
}

/// A container's exit code and whether the kernel killed it for memory (`docker inspect`).
async fn exit_status(container: &str) -> (i64, bool) {
    let status = docker::docker(&[
        "inspect",
        "--format",
        "{{.State.ExitCode}} {{.State.OOMKilled}}",
        container,
    ])
    .await;
    let (code, oom) = status.split_once(' ').expect("exit code and OOM flag");
    (code.parse().expect("exit code"), oom == "true")
}

/// The probe's last stdout line: its run report (completed, leaseLost, released, abandoned…).
async fn run_report(container: &str) -> serde_json::Value {
    let logs = docker::docker(&["logs", container]).await;
    logs.lines()
        .rev()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .unwrap_or_else(|| panic!("no run report in the logs of {container}:\n{logs}"))
}

/// `docker pause` a worker while it holds leases, `docker restart` Postgres, complete its jobs
/// with another worker, then `unpause` it: each of its attempts must end — refused with a
/// `fenced` event naming the attempt, and ended in the worker's own accounting (claimed equals
/// ended) — none hangs, nothing is lost or applied twice, its fenced-writes metric equals the
/// `fenced` rows the audit table holds for it, and a SIGTERM afterwards stops it at once and
/// cleanly (exit 0, not Docker's SIGKILL 137 after the stop timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_across_a_postgres_restart_ends_every_attempt_and_stops_cleanly() {
    require_docker!();
    let fleet = Fleet::start("pausepg").await;
    let admitted = admit_all(&fleet, "pausepg", 2).await;
    let hold = 3_000;
    let metrics_port = docker::free_port();
    let frozen = fleet
        .worker_with(
            "frozen",
            Some("frozen"),
            WorkerSpec::holding(hold),
            Some(metrics_port),
        )
        .await;
    let held = held_by(&fleet, "frozen", &admitted).await;
    let paused_at = fleet.ledger.now_ms();
    docker::docker(&["pause", &frozen]).await;
    docker::docker(&["restart", "--time", "10", &fleet.postgres]).await;
    // Its connections died with the old server while it was frozen; its leases expire
    // meanwhile and the rescuer completes the jobs on their second attempt.
    fleet.worker("rescuer", WorkerSpec::holding(100)).await;
    fleet
        .wait_jobs(
            "the rescuer completes every job after the restart",
            Duration::from_secs(90),
            |jobs| {
                jobs.iter()
                    .all(|job| job.state == "completed")
                    .then_some(())
            },
        )
        .await;
    zuno_tests::eventually(
        "the frozen worker's hold has elapsed",
        Duration::from_secs(30),
        || async {
            let elapsed = fleet.ledger.now_ms() >= paused_at + hold as i64;
            if !elapsed {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            elapsed.then_some(())
        },
    )
    .await;
    docker::docker(&["unpause", &frozen]).await;

    // Every attempt it held ends in the audit trail: a refusal naming that attempt.
    fleet
        .wait_events(
            "each attempt the frozen worker held is refused and audited",
            Duration::from_secs(90),
            |events| {
                held.iter()
                    .all(|job| {
                        events.iter().any(|e| {
                            e.job_id == job.id
                                && e.event == "fenced"
                                && e.worker_id.as_deref() == Some("frozen")
                                && e.detail.as_deref().is_some_and(|detail| {
                                    detail.ends_with(&format!("attempt {}", job.attempts))
                                })
                        })
                    })
                    .then_some(())
            },
        )
        .await;
    // And in its own accounting: every claim it made has ended (the hang this guards against
    // left "claimed" one above "ended" forever).
    let text = zuno_tests::eventually(
        "the frozen worker counts every claimed attempt as ended",
        Duration::from_secs(60),
        || async {
            let text = docker::scrape(metrics_port).await;
            let done = text.as_deref().is_some_and(|text| {
                let claimed = docker::metric_sum(text, "zuno_jobs_claimed", &[]);
                let ended = docker::metric_sum(text, "zuno_job_duration", &[]);
                claimed == held.len() as f64 && ended == claimed
            });
            if !done {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            done.then_some(text).flatten()
        },
    )
    .await;
    let fenced_rows = fleet
        .events()
        .await
        .unwrap()
        .iter()
        .filter(|e| e.event == "fenced" && e.worker_id.as_deref() == Some("frozen"))
        .count();
    assert_eq!(
        docker::metric_sum(&text, "zuno_fenced_writes", &[]),
        fenced_rows as f64,
        "the fenced-writes metric counts exactly the audited refusals:\n{text}"
    );

    let summary = fleet.assert_ledger_promises(&admitted, SETTLE).await;
    eprintln!("pause across a Postgres restart: {summary:?}");
    only_rescuer_applied(&fleet, "frozen", "rescuer").await;

    // Nothing is left running in it, so SIGTERM ends it at once, well inside its 5 s grace.
    let stopping = std::time::Instant::now();
    docker::docker(&["stop", "--time", "30", &frozen]).await;
    let stopped_in = stopping.elapsed();
    let (code, oom_killed) = exit_status(&frozen).await;
    assert_eq!(
        (code, oom_killed),
        (0, false),
        "a clean exit on SIGTERM, not 137"
    );
    assert!(
        stopped_in < Duration::from_secs(5),
        "stopped within its grace: {stopped_in:?}"
    );
    let report = run_report(&frozen).await;
    let ended: u64 = [
        "completed",
        "failed",
        "retried",
        "leaseLost",
        "released",
        "abandoned",
    ]
    .iter()
    .map(|field| report[*field].as_u64().unwrap_or(0))
    .sum();
    assert_eq!(ended, held.len() as u64, "{report}");
    assert_eq!(
        (report["completed"].as_u64(), report["abandoned"].as_u64()),
        (Some(0), Some(0)),
        "its attempts were refused, none committed or was left to expire: {report}"
    );
}

/// Worker ids are drawn per process start: a container restarted by Docker (same host name,
/// the same pid 1) leases under a new id, so audit events and lease owners of the two
/// processes stay apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_container_leases_under_a_new_worker_id() {
    require_docker!();
    let fleet = Fleet::start("workerid").await;
    let container = fleet
        .worker_with("drawn", None, WorkerSpec::holding(100), None)
        .await;
    let worker_of = |job: String| {
        let fleet = &fleet;
        async move {
            fleet
                .wait_effects(
                    &format!("job {job} is applied"),
                    Duration::from_secs(60),
                    |effects| {
                        effects
                            .iter()
                            .find(|e| e.job_id == job)
                            .map(|e| e.worker_id.clone())
                    },
                )
                .await
        }
    };
    let before = worker_of(fleet.admit("workerid-before").await).await;
    docker::docker(&["restart", "--time", "10", &container]).await;
    let after = worker_of(fleet.admit("workerid-after").await).await;

    let hostname =
        docker::docker(&["inspect", "--format", "{{.Config.Hostname}}", &container]).await;
    for id in [&before, &after] {
        assert!(
            id.starts_with(&format!("zuno-probe@{hostname}:")),
            "the default id names the service and host: {id}"
        );
    }
    let host_and_pid = |id: &str| id.rsplit_once(':').map(|(prefix, _)| prefix.to_owned());
    assert_eq!(
        host_and_pid(&before),
        host_and_pid(&after),
        "host name and pid alone repeat across the restart"
    );
    assert_ne!(before, after, "the restarted process leases under a new id");
}
