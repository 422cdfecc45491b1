//! A database outage shorter than the lease costs no attempt: a worker process whose handlers
//! are mid-attempt when the database goes away re-runs them within their attempts and leases
//! (heartbeats retried meanwhile) and completes every job on attempt 1 once it is back. An
//! outage longer than the lease ends the attempt without committing it. Measured against a
//! real server stopped and started again (`scripts/pg-cluster halt|resume`) and a SQLite
//! database whose write lock another connection holds.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::Connection;
use tokio::process::{Child, Command};
use zuno_shared::clock::system_clock;
use zuno_shared::db::{ConnectOptions, Db};
use zuno_shared::ledger::{Job, JobIdentity, JobOrigin, JobState, Ledger, NewJob};
use zuno_tests::pg_cluster::PgCluster;
use zuno_tests::{TestDb, eventually};

const JOBS: usize = 4;

/// How the probe worker runs: its lease, heartbeat and time "working" before it settles.
struct Timing {
    lease_ms: u64,
    heartbeat_ms: u64,
    hold_ms: u64,
}

/// A `zuno-probe` worker for `url`, logging to `log` (its metrics endpoint turns logs on).
fn worker(url: &str, timing: &Timing, log: &Path, extra: &[&str]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_zuno-probe"))
        .args(["--database-url", url])
        .args(extra)
        .args(["work", "--worker-id", "w", "--metrics-addr", "127.0.0.1:0"])
        .args(["--concurrency", "4", "--max-jobs-per-wake", "2"])
        .args(["--lease-ms", &timing.lease_ms.to_string()])
        .args(["--heartbeat-ms", &timing.heartbeat_ms.to_string()])
        .args(["--hold-ms", &timing.hold_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn prepare(db: &Db, prefix: &str) -> (Ledger, Vec<String>) {
    zuno_shared::on_db!(db, |pool| sqlx::query(
        "CREATE TABLE probe_effect (job_id TEXT NOT NULL, worker_id TEXT NOT NULL, attempt BIGINT NOT NULL)")
        .execute(pool).await.map(|d| d.rows_affected())).unwrap();
    let ledger = Ledger::new(db.clone(), system_clock());
    let mut ids = Vec::new();
    for n in 0..JOBS {
        let job = NewJob::new(
            JobIdentity::maintain("p", "/m", &format!("{prefix}-{n}")),
            JobOrigin::Explicit,
        );
        ids.push(ledger.admit(job).await.unwrap().into_job().id);
    }
    (ledger, ids)
}

/// Waits until the worker holds a lease on every job (its handlers are mid-attempt).
async fn all_running(ledger: &Ledger, ids: &[String]) {
    eventually(
        "the worker holds every job",
        Duration::from_secs(30),
        || async {
            for id in ids {
                if ledger.get(id).await.ok()?.state != JobState::Running {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// Waits until every job is completed; returns the rows.
async fn all_completed(ledger: &Ledger, ids: &[String], within: Duration) -> Vec<Job> {
    eventually("every job completes", within, || async {
        let mut jobs = Vec::new();
        for id in ids {
            let job = ledger.get(id).await.ok()?;
            if job.state != JobState::Completed {
                return None;
            }
            jobs.push(job);
        }
        Some(jobs)
    })
    .await
}

/// (job, attempt) of every recorded effect, sorted.
async fn effects(db: &Db) -> Vec<(String, i64)> {
    zuno_shared::on_db!(db, |pool| sqlx::query_as(
        "SELECT job_id, attempt FROM probe_effect ORDER BY job_id, attempt"
    )
    .fetch_all(pool)
    .await)
    .unwrap()
}

/// Every job completed on attempt 1, after its handler met the outage (so the test did not
/// pass by settling before it).
fn assert_completed_on_attempt_one(jobs: &[Job], log: &Path) {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        log.contains("database error inside the attempt"),
        "the handlers met the outage:\n{log}"
    );
    for job in jobs {
        assert_eq!(
            (job.attempts, job.last_error.as_deref()),
            (1, None),
            "job {} spent an attempt on the outage; worker log:\n{log}",
            job.id
        );
    }
}

/// Postgres stops for 15 s while every handler is about to settle: past the old budget of three
/// re-runs (each run "works" 2 s again, so about 9 s), well inside the 30 s lease. All four
/// jobs complete on attempt 1, each effect written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_shorter_than_the_lease_costs_no_attempt() {
    let cluster = PgCluster::start();
    let db = Db::open(
        &ConnectOptions::new(cluster.url.clone()),
        zuno_shared::migrations::schema(),
    )
    .await
    .unwrap();
    let (ledger, ids) = prepare(&db, "short").await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("worker.log");
    let timing = Timing {
        lease_ms: 30_000,
        heartbeat_ms: 5_000,
        hold_ms: 2_000,
    };
    let _worker = worker(&cluster.socket_url(), &timing, &log, &[]);
    all_running(&ledger, &ids).await;

    let down = Instant::now();
    cluster.halt();
    // The outage itself: the handlers wake and settle while the server is down.
    tokio::time::sleep(Duration::from_secs(15)).await;
    cluster.resume();
    let outage = down.elapsed();
    let back = Instant::now();

    let jobs = all_completed(&ledger, &ids, Duration::from_secs(60)).await;
    eprintln!(
        "postgres outage of {} ms: every job completed {} ms after the server was back",
        outage.as_millis(),
        back.elapsed().as_millis()
    );
    assert_completed_on_attempt_one(&jobs, &log);
    let mut expected: Vec<(String, i64)> = ids.iter().map(|id| (id.clone(), 1)).collect();
    expected.sort();
    assert_eq!(
        effects(&db).await,
        expected,
        "each effect once, on attempt 1"
    );
}

/// Postgres stops for 12 s, longer than the 4 s lease: the attempts end at their deadline
/// without committing (released, rescued once expired, or refused as `fenced`), and every job
/// is completed once, by a later claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_commits_nothing_of_the_expired_attempt() {
    let cluster = PgCluster::start();
    let db = Db::open(
        &ConnectOptions::new(cluster.url.clone()),
        zuno_shared::migrations::schema(),
    )
    .await
    .unwrap();
    let (ledger, ids) = prepare(&db, "long").await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("worker.log");
    let timing = Timing {
        lease_ms: 4_000,
        heartbeat_ms: 1_000,
        hold_ms: 2_000,
    };
    let _worker = worker(&cluster.socket_url(), &timing, &log, &[]);
    all_running(&ledger, &ids).await;
    cluster.halt();
    tokio::time::sleep(Duration::from_secs(12)).await;
    cluster.resume();

    all_completed(&ledger, &ids, Duration::from_secs(60)).await;
    let worker_log = std::fs::read_to_string(&log).unwrap_or_default();
    for id in &ids {
        // The first lease ended without its settlement: given back, expired and rescued, or
        // refused. Had the expired attempt committed, the job would have ended with it.
        let events = ledger.events(id).await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| matches!(e.event.as_str(), "released" | "lease_expired" | "fenced")),
            "the expired attempt of {id} ended without committing: {events:?}\n{worker_log}"
        );
    }
    let done = effects(&db).await;
    assert_eq!(done.len(), JOBS, "each effect once: {done:?}");
}

/// Another connection holds SQLite's write lock for 10 s (the probe waits 100 ms per statement
/// for it, so each statement fails with SQLITE_BUSY) while every handler is about to settle:
/// past the old budget of three re-runs (about 5 s with 1 s of "work" per run), inside the
/// 30 s lease. All jobs complete on attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_sqlite_database_costs_no_attempt() {
    let test_db = TestDb::sqlite().await;
    let (ledger, ids) = prepare(&test_db.db, "busy").await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("worker.log");
    let timing = Timing {
        lease_ms: 30_000,
        heartbeat_ms: 5_000,
        hold_ms: 1_000,
    };
    let _worker = worker(&test_db.url, &timing, &log, &["--busy-timeout-ms", "100"]);
    all_running(&ledger, &ids).await;

    let mut blocker = sqlx::SqliteConnection::connect(&test_db.url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();

    let jobs = all_completed(&ledger, &ids, Duration::from_secs(60)).await;
    assert_completed_on_attempt_one(&jobs, &log);
    assert_eq!(effects(&test_db.db).await.len(), JOBS);
}
