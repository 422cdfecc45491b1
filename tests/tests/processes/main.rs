//! Claims about processes, proven with separate OS processes on both backends: concurrent
//! admission, interval buckets across hosts, a 4-process drain of 2,000 jobs, a stopped worker
//! whose stale settlement is refused, a killed worker whose job is reclaimed, a sleeping worker
//! woken by another process's admission, and processes starting together on a fresh database.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use zuno_shared::db::Backend;
use zuno_shared::ledger::{JobIdentity, JobOrigin, JobState, NewJob};
use zuno_tests::processes::binary;
use zuno_tests::{TestDb, eventually, on_both_backends};

mod outage;

fn probe(db: &TestDb) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_zuno-probe"));
    command
        .arg("--database-url")
        .arg(&db.url)
        .kill_on_drop(true);
    command
}

async fn output_json(child: Child) -> serde_json::Value {
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("probe finished in time")
        .expect("probe ran");
    assert!(
        output.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("bad probe output: {stdout}"))
}

async fn create_effect_table(db: &TestDb) {
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "CREATE TABLE probe_effect (job_id TEXT NOT NULL, worker_id TEXT NOT NULL, attempt BIGINT NOT NULL)")
        .execute(pool).await.map(|d| d.rows_affected())).unwrap();
}

async fn scalar(db: &TestDb, sql: &'static str) -> i64 {
    zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(sql).fetch_one(pool).await).unwrap()
}

/// Waits (up to 30 s) until job `id` is in `state`.
async fn wait_for_state(
    ledger: &zuno_shared::ledger::Ledger,
    id: &str,
    state: JobState,
    what: &str,
) {
    eventually(what, Duration::from_secs(30), || async move {
        (ledger.get(id).await.ok()?.state == state).then_some(())
    })
    .await;
}

async fn a_hundred_admissions_from_four_processes_leave_one_row(db: TestDb) {
    let children: Vec<Child> = (0..4)
        .map(|_| {
            probe(&db)
                .args(["admit", "--key", "shared", "--count", "25"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut queued = 0;
    let mut ids = std::collections::BTreeSet::new();
    for child in children {
        let out = output_json(child).await;
        queued += out["queued"].as_u64().unwrap();
        for id in out["ids"].as_array().unwrap() {
            ids.insert(id.as_str().unwrap().to_owned());
        }
    }
    assert_eq!(queued, 1, "exactly one of 100 admissions created the job");
    assert_eq!(ids.len(), 1, "every process saw the same job");
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM learning_job").await, 1);
}

async fn hosts_checking_one_bucket_create_one_job(db: TestDb) {
    const DAY: i64 = 86_400_000;
    let base = 1_900_000_000_000 - 1_900_000_000_000 % DAY;
    let children: Vec<Child> = (0..6)
        .map(|host| {
            probe(&db)
                .args([
                    "admit-bucket",
                    "--project",
                    "proj",
                    "--period-ms",
                    &DAY.to_string(),
                ])
                .args(["--now-ms", &(base + host * 3_000_000 + 5).to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut queued = 0;
    for child in children {
        if output_json(child).await["outcome"] == "queued" {
            queued += 1;
        }
    }
    assert_eq!(queued, 1);
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM learning_job").await, 1);
}

async fn four_worker_processes_drain_two_thousand_jobs_exactly_once(db: TestDb) {
    create_effect_table(&db).await;
    let ledger = db.ledger();
    for chunk in 0..8 {
        let jobs = (0..250)
            .map(|i| {
                NewJob::new(
                    JobIdentity::maintain("p", "/m", &format!("j{}", chunk * 250 + i)),
                    JobOrigin::Explicit,
                )
            })
            .collect();
        ledger.admit_batch(jobs).await.unwrap();
    }
    let workers: Vec<Child> = (0..4)
        .map(|w| {
            probe(&db)
                .args([
                    "work",
                    "--worker-id",
                    &format!("w{w}"),
                    "--concurrency",
                    "4",
                    "--max-jobs-per-wake",
                    "4",
                    "--exit-when-idle",
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut completed = 0;
    let mut per_worker = Vec::new();
    for worker in workers {
        let report = output_json(worker).await;
        assert_eq!(report["leaseLost"], 0, "{report}");
        assert_eq!(report["abandoned"], 0, "{report}");
        completed += report["completed"].as_u64().unwrap();
        per_worker.push(report["completed"].as_u64().unwrap());
    }
    assert_eq!(completed, 2000, "per worker: {per_worker:?}");
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM probe_effect").await,
        2000,
        "no effect lost or duplicated"
    );
    assert_eq!(
        scalar(&db, "SELECT COUNT(DISTINCT job_id) FROM probe_effect").await,
        2000
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM learning_job WHERE state = 'completed' AND attempts = 1"
        )
        .await,
        2000
    );
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "work was shared: {per_worker:?}"
    );
}

async fn a_stopped_worker_past_its_lease_cannot_settle(db: TestDb) {
    create_effect_table(&db).await;
    let ledger = db.ledger();
    let job = ledger
        .admit(NewJob::new(
            JobIdentity::maintain("p", "/m", "stalled"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    // Worker A: one job at a time, a 1.5 s lease and no heartbeat before it would settle.
    let stalled = probe(&db)
        .args([
            "work",
            "--worker-id",
            "stalled",
            "--concurrency",
            "1",
            "--lease-ms",
            "1500",
        ])
        .args([
            "--heartbeat-ms",
            "3600000",
            "--hold-ms",
            "2500",
            "--exit-when-idle",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(stalled.id().unwrap() as i32);
    eventually("worker A holds the lease", Duration::from_secs(30), || {
        let ledger = ledger.clone();
        let id = job.id.clone();
        async move {
            let job = ledger.get(&id).await.ok()?;
            (job.lease_owner.as_deref() == Some("stalled")).then_some(())
        }
    })
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Past A's lease, worker B reclaims and completes the job.
    eventually("A's lease expires", Duration::from_secs(30), || {
        let ledger = ledger.clone();
        let id = job.id.clone();
        async move {
            let job = ledger.get(&id).await.ok()?;
            (job.lease_expires_at? < ledger.now_ms()).then_some(())
        }
    })
    .await;
    let rescuer = probe(&db)
        .args(["work", "--worker-id", "rescuer", "--exit-when-idle"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rescue = output_json(rescuer).await;
    assert_eq!(rescue["completed"], 1, "{rescue}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let stale = output_json(stalled).await;
    assert_eq!(stale["completed"], 0, "{stale}");
    assert_eq!(stale["leaseLost"], 1, "A's settlement was refused: {stale}");

    let settled = ledger.get(&job.id).await.unwrap();
    assert_eq!(settled.state, JobState::Completed);
    assert_eq!(settled.attempts, 2);
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM probe_effect").await,
        1,
        "the effect is recorded once"
    );
    let effect_worker: String = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT worker_id FROM probe_effect"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(effect_worker, "rescuer");
    let events = ledger.events(&job.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.event == "fenced" && e.worker_id.as_deref() == Some("stalled")),
        "{events:?}"
    );
    assert!(events.iter().any(|e| e.event == "lease_expired"));
}

async fn a_killed_worker_job_is_reclaimed_after_its_lease(db: TestDb) {
    create_effect_table(&db).await;
    let ledger = db.ledger();
    let job = ledger
        .admit(NewJob::new(
            JobIdentity::maintain("p", "/m", "killed"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    let mut victim = probe(&db)
        .args([
            "work",
            "--worker-id",
            "victim",
            "--concurrency",
            "1",
            "--lease-ms",
            "1000",
            "--heartbeat-ms",
            "250",
            "--hold-ms",
            "600000",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        "the victim holds the lease",
        Duration::from_secs(30),
        || {
            let ledger = ledger.clone();
            let id = job.id.clone();
            async move {
                (ledger.get(&id).await.ok()?.lease_owner.as_deref() == Some("victim")).then_some(())
            }
        },
    )
    .await;
    victim.kill().await.unwrap();
    victim.wait().await.unwrap();
    let survivor = probe(&db)
        .args(["work", "--worker-id", "survivor", "--concurrency", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_state(
        &ledger,
        &job.id,
        JobState::Completed,
        "another worker completes the job after the lease expires",
    )
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(survivor.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let report = output_json(survivor).await;
    assert_eq!(report["completed"], 1);
    let settled = ledger.get(&job.id).await.unwrap();
    assert_eq!(settled.attempts, 2);
    assert_eq!(settled.result.unwrap()["worker"], "survivor");
}

async fn a_real_worker_binary_drains_and_exits(db: TestDb) {
    let ledger = db.ledger();
    let job = ledger
        .admit(NewJob::new(
            JobIdentity::maintain("p", "/m", "real"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    let output = Command::new(binary("zuno-worker-maintain"))
        .args([
            "--database-url",
            &db.url,
            "--worker-id",
            "maintain-1",
            "--exit-when-idle",
        ])
        .env("ZUNO_HOME", tempfile::tempdir().unwrap().path())
        .output()
        .await
        .unwrap();
    zuno_tests::processes::assert_succeeded(&output);
    let settled = ledger.get(&job.id).await.unwrap();
    assert_eq!(
        settled.state,
        JobState::Completed,
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(settled.attempts, 1);
}

/// A real worker process exports every ledger counter of its kinds at zero before any job
/// exists, counts a job quarantined at claim, and refuses to start with a heartbeat slower than
/// half its lease.
async fn a_worker_exports_its_ledger_counters_from_zero(db: TestDb) {
    let home = tempfile::tempdir().unwrap();
    let refused = Command::new(binary("zuno-worker-maintain"))
        .args(["--database-url", &db.url, "--lease-ms", "10000"])
        .args(["--heartbeat-ms", "5000", "--exit-when-idle"])
        .env("ZUNO_HOME", home.path())
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("shorter than half the lease"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let mut worker = Command::new(binary("zuno-worker-maintain"))
        .args(["--database-url", &db.url, "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .env("ZUNO_HOME", home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let wanted = [
        "zuno_fenced_writes",
        "zuno_jobs_claimed",
        "zuno_jobs_settled",
        "zuno_jobs_quarantined",
        "zuno_jobs_released",
        "zuno_jobs_skipped_at_claim",
        "zuno_attempt_db_retries",
    ];
    let text = eventually(
        "every ledger counter is exported",
        Duration::from_secs(60),
        || {
            let url = url.clone();
            async move {
                let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
                wanted
                    .iter()
                    .all(|name| {
                        text.lines().any(|line| {
                            line.starts_with(name) && line.contains("kind=\"maintain\"")
                        })
                    })
                    .then_some(text)
            }
        },
    )
    .await;
    for name in wanted {
        for line in text.lines().filter(|line| line.starts_with(name)) {
            assert!(line.ends_with(" 0"), "no work yet, so zero: {line}");
        }
    }
    assert!(
        text.lines()
            .any(|line| line.starts_with("zuno_lease_expiries") && line.ends_with(" 0")),
        "{text}"
    );

    // A job whose row cannot be read is quarantined at claim, and the counter says so. The row
    // is corrupted in its admission's transaction, so the worker never sees it readable.
    let ledger = db.ledger();
    let mut tx = db.db.begin().await.unwrap();
    let poisoned = ledger
        .admit_in(
            &mut tx,
            NewJob::new(
                JobIdentity::maintain("p", "/m", "poisoned"),
                JobOrigin::Explicit,
            ),
        )
        .await
        .unwrap()
        .into_job();
    zuno_shared::db::execute_in(
        &mut tx,
        "UPDATE learning_job SET payload = '{not json' WHERE id = $1",
        &[poisoned.id.as_str().into()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    eventually(
        "the quarantined job is counted",
        Duration::from_secs(60),
        || {
            let url = url.clone();
            async move {
                let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
                text.lines()
                    .any(|line| {
                        line.starts_with("zuno_jobs_quarantined")
                            && line.contains("kind=\"maintain\"")
                            && line.ends_with(" 1")
                    })
                    .then_some(())
            }
        },
    )
    .await;
    let (state, error): (String, Option<String>) = zuno_shared::on_db!(db.db, |pool| {
        sqlx::query_as("SELECT state, last_error FROM learning_job WHERE id = $1")
            .bind(&poisoned.id)
            .fetch_one(pool)
            .await
    })
    .unwrap();
    assert_eq!(state, "failed");
    assert!(error.unwrap_or_default().contains("cannot be read"));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

/// A worker process that only sleeps (a 10-minute idle poll, no fast polling) is woken by an
/// admission from another process: Postgres `NOTIFY` on one backend, the SQLite commit watcher
/// on the other. The worker's first claim is observed through a job whose expired lease it
/// rescues in that claim (an `extract` job, which this worker does not take, on its final
/// attempt: it fails, and a failed rescue wakes nobody), so the admission lands while it sleeps.
async fn a_sleeping_worker_process_is_woken_by_another_process_admission(db: TestDb) {
    create_effect_table(&db).await;
    let ledger = db.ledger();
    let marker = ledger
        .admit(NewJob::new(
            JobIdentity::extract("p", "s-marker", "m-marker", "v-marker", None),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    let kinds = [zuno_shared::ledger::JobKind::Extract];
    let claimed = ledger
        .claim(
            &zuno_shared::ledger::ClaimRequest {
                worker_id: "test",
                kinds: &kinds,
                limit: 1,
                lease_ms: 30_000,
                scopes: None,
            },
            &zuno_shared::ledger::AllowAll,
        )
        .await
        .unwrap();
    assert_eq!(claimed.claimed.len(), 1);
    zuno_shared::on_db!(db.db, |pool| sqlx::query(
        "UPDATE learning_job SET lease_expires_at = 1, attempts = max_attempts WHERE id = $1"
    )
    .bind(&marker.id)
    .execute(pool)
    .await
    .map(|done| done.rows_affected()))
    .unwrap();

    let worker = probe(&db)
        .args(["work", "--worker-id", "sleeper", "--concurrency", "1"])
        .args([
            "--max-jobs-per-wake",
            "1",
            "--poll-ms",
            "600000",
            "--no-fast-poll",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
    wait_for_state(
        &ledger,
        &marker.id,
        JobState::Failed,
        "the worker's first claim rescues the marker",
    )
    .await;
    let job = ledger
        .admit(NewJob::new(
            JobIdentity::maintain("p", "/m", "woken"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap()
        .into_job();
    // The worker's next poll is ten minutes away: only a wake-up settles the job in time.
    wait_for_state(
        &ledger,
        &job.id,
        JobState::Completed,
        "the sleeping worker settles the new job",
    )
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let report = output_json(worker).await;
    assert_eq!(report["completed"], 1, "{report}");
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM probe_effect").await, 1);
}

on_both_backends!(
    a_sleeping_worker_process_is_woken_by_another_process_admission,
    a_worker_exports_its_ledger_counters_from_zero,
    a_hundred_admissions_from_four_processes_leave_one_row,
    hosts_checking_one_bucket_create_one_job,
    four_worker_processes_drain_two_thousand_jobs_exactly_once,
    a_stopped_worker_past_its_lease_cannot_settle,
    a_killed_worker_job_is_reclaimed_after_its_lease,
    a_real_worker_binary_drains_and_exits,
);

/// Starts `count` `zuno migrate` processes on `db` at once and requires every one to succeed.
async fn start_together(db: &TestDb, count: usize) {
    let home = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..count)
        .map(|_| {
            Command::new(binary("zuno"))
                .env("ZUNO_HOME", home.path())
                .env_remove("DATABASE_URL")
                .env_remove("ZUNO_DATABASE_URL")
                .args(["--database-url", &db.url, "migrate"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("zuno migrate finished in time")
            .expect("zuno migrate ran");
        assert!(
            output.status.success(),
            "a process starting beside others failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A fleet starting at once (the compose stack's first `up`) on a fresh database, and on one whose
/// last start-up crashed before recording the schema fingerprint: every process migrates or
/// waits for the one that does, none fails on another's half-built schema, and the schema they
/// leave verifies against the fingerprint they recorded. Without the start-up lock, Postgres
/// refuses concurrent `CREATE TABLE IF NOT EXISTS zuno_schema` in roughly 40 % of the second
/// kind of round (measured with 8 processes), so six of them catch it.
async fn processes_starting_together_all_start(backend: Backend) {
    let db = TestDb::unmigrated(backend).await;
    start_together(&db, 12).await;
    for _ in 0..6 {
        zuno_shared::on_db!(db.db, |pool| sqlx::query("DROP TABLE zuno_schema")
            .execute(pool)
            .await
            .map(|d| d.rows_affected()))
        .unwrap();
        start_together(&db, 8).await;
    }
    let check = db.reopen().await.check_schema().await.unwrap();
    assert!(check.pending.is_empty(), "{check:?}");
    let recorded: String = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
        "SELECT fingerprint FROM zuno_schema WHERE id = 1"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(recorded, check.fingerprint);
}

mod fresh_database {
    use zuno_shared::db::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_processes_starting_together_all_start() {
        super::processes_starting_together_all_start(Backend::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_processes_starting_together_all_start() {
        super::processes_starting_together_all_start(Backend::Postgres).await
    }
}

/// Three worker processes share a Postgres queue, one with a correct clock and two whose clocks
/// run five minutes ahead and behind (`ZUNO_CLOCK_OFFSET_MS`). Leases, rescues and due times are
/// decided by the database's clock, so the fast host rescues no live lease, the slow host still
/// sees due work, and every job runs exactly once. (SQLite serves one host and keeps its clock.)
mod skewed_clocks {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_workers_with_skewed_clocks_steal_no_live_lease() {
        let db = TestDb::postgres().await;
        create_effect_table(&db).await;
        let jobs = (0..30)
            .map(|i| {
                NewJob::new(
                    JobIdentity::maintain("p", "/m", &format!("skew-{i}")),
                    JobOrigin::Explicit,
                )
            })
            .collect();
        db.ledger().admit_batch(jobs).await.unwrap();
        let offsets = [300_000_i64, -300_000, 0];
        let workers: Vec<(i64, Child)> = offsets
            .iter()
            .map(|&offset| {
                let child = probe(&db)
                    .env(zuno_shared::clock::CLOCK_OFFSET_ENV, offset.to_string())
                    .args(["work", "--worker-id", &format!("offset{offset}")])
                    .args(["--concurrency", "2", "--max-jobs-per-wake", "2"])
                    .args(["--lease-ms", "4000", "--heartbeat-ms", "1000"])
                    .args(["--hold-ms", "500", "--exit-when-idle"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                (offset, child)
            })
            .collect();
        let mut completed = 0;
        for (offset, worker) in workers {
            let report = output_json(worker).await;
            assert_eq!(report["leaseLost"], 0, "offset {offset}: {report}");
            let done = report["completed"].as_u64().unwrap();
            if offset != 0 {
                assert!(done > 0, "the host {offset} ms off did work: {report}");
            }
            completed += done;
        }
        assert_eq!(completed, 30);
        assert_eq!(
            scalar(&db, "SELECT COUNT(*) FROM probe_effect").await,
            30,
            "no job ran twice"
        );
        assert_eq!(
            scalar(&db, "SELECT COUNT(DISTINCT job_id) FROM probe_effect").await,
            30
        );
        assert_eq!(
            scalar(
                &db,
                "SELECT COUNT(*) FROM learning_job WHERE state = 'completed' AND attempts = 1"
            )
            .await,
            30,
            "no attempt was spent on a stolen lease"
        );
        assert_eq!(
            scalar(
                &db,
                "SELECT COUNT(*) FROM learning_job_event WHERE event = 'lease_expired'"
            )
            .await,
            0,
            "no live lease was rescued"
        );
    }
}
