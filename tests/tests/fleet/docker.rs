//! The fleet harness: a private Docker network, a Postgres container published on a loopback
//! port (so the test reads the ledger directly), and `zuno-probe` worker containers, all
//! removed when the [`Fleet`] is dropped. Docker is driven through its CLI: every fault is the
//! command an operator would type (`docker kill`, `pause`, `network disconnect`, `restart`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use zuno_shared::clock::system_clock;
use zuno_shared::db::{ConnectOptions, Db};
use zuno_shared::ledger::{JobIdentity, JobOrigin, Ledger, NewJob};

/// Images `scripts/images` builds; overridable for images built elsewhere.
pub fn zuno_image() -> String {
    std::env::var("ZUNO_TEST_ZUNO_IMAGE").unwrap_or_else(|_| String::from("zuno/zuno:local"))
}

pub fn postgres_image() -> String {
    zuno_tests::postgres_container::image()
}

/// `Err(reason)` when no Docker engine answers: the only reason these tests skip.
pub fn docker_available() -> Result<(), String> {
    match std::process::Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "`docker info` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => Err(format!("no docker CLI: {error}")),
    }
}

/// Whether the environment makes Docker mandatory (`ZUNO_REQUIRE_DOCKER=1`, which
/// `scripts/test` and `scripts/fault-tests` set after building the images).
pub fn docker_required() -> bool {
    std::env::var("ZUNO_REQUIRE_DOCKER")
        .is_ok_and(|value| !matches!(value.trim(), "" | "0" | "false" | "no"))
}

/// Returns early from a test, printing why, when no Docker engine is reachable and nothing
/// requires one (a developer running this binary by hand). Under `ZUNO_REQUIRE_DOCKER=1` a
/// missing engine fails the test.
macro_rules! require_docker {
    () => {
        if let Err(reason) = crate::docker::docker_available() {
            assert!(
                !crate::docker::docker_required(),
                "ZUNO_REQUIRE_DOCKER is set but no Docker engine is reachable: {reason}"
            );
            let message = format!(
                "SKIP: {reason}. The fleet fault tests need a Docker engine; run them with \
                 scripts/fault-tests where one is available."
            );
            println!("{message}");
            eprintln!("{message}");
            return;
        }
    };
}

/// Runs `docker ARGS`, returning trimmed stdout or the error output.
pub async fn try_docker(args: &[&str]) -> Result<String, String> {
    let output = tokio::process::Command::new("docker")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| format!("docker {}: {error}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

pub async fn docker(args: &[&str]) -> String {
    try_docker(args)
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

fn docker_sync(args: &[&str]) -> String {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .map(|output| {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            text
        })
        .unwrap_or_default()
}

/// How a probe worker behaves.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSpec {
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    /// Time each job "works" before settling.
    pub hold_ms: u64,
    pub concurrency: usize,
}

impl WorkerSpec {
    /// Short leases so faults resolve in seconds; heartbeats well inside them, so a live worker
    /// on a busy 2-core machine keeps its lease.
    pub fn holding(hold_ms: u64) -> WorkerSpec {
        WorkerSpec {
            lease_ms: 3_000,
            heartbeat_ms: 500,
            hold_ms,
            concurrency: 4,
        }
    }
}

/// One job row, as the checks need it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobRow {
    pub id: String,
    pub state: String,
    pub attempts: i64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
}

/// One recorded effect (`probe_effect`, written in the settlement transaction).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Effect {
    pub job_id: String,
    pub worker_id: String,
    pub attempt: i64,
    pub at: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Event {
    pub job_id: String,
    pub event: String,
    pub worker_id: Option<String>,
    pub detail: Option<String>,
}

/// What [`Fleet::assert_ledger_promises`] found.
#[derive(Debug, Default)]
pub struct Summary {
    pub jobs: usize,
    pub retried: usize,
    pub fenced: usize,
    pub effects_by_worker: BTreeMap<String, usize>,
}

/// The containers and network of one test, removed on drop (after printing the containers'
/// logs when the test is failing).
struct Resources {
    network: String,
    containers: Mutex<Vec<String>>,
}

impl Resources {
    /// `docker run -d --name NAME …` on the network; the container is removed with the rest.
    async fn run(&self, name: &str, args: &[&str]) {
        self.containers.lock().unwrap().push(name.to_owned());
        let mut full = vec![
            "run",
            "-d",
            "--name",
            name,
            "--network",
            &self.network,
            "--label",
            "zuno.test=fleet",
        ];
        full.extend_from_slice(args);
        docker(&full).await;
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        let containers = self.containers.lock().unwrap().clone();
        if std::thread::panicking() {
            for container in &containers {
                eprintln!("--- docker logs --tail 40 {container}");
                eprintln!("{}", docker_sync(&["logs", "--tail", "40", container]));
            }
        }
        if !containers.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(containers.iter().map(String::as_str));
            docker_sync(&args);
        }
        docker_sync(&["network", "rm", &self.network]);
    }
}

pub struct Fleet {
    pub name: String,
    /// `10.231.N`: the network's /24, so a reconnected worker can get its old address back.
    subnet_prefix: String,
    pub postgres: String,
    /// The ledger database, reached from the host through a loopback port.
    pub db: Db,
    pub ledger: Ledger,
    resources: Resources,
    /// The host part of the next worker's fixed address (see [`Fleet::worker`]).
    next_host: std::sync::atomic::AtomicU8,
}

/// The database URL inside the fleet network.
const FLEET_DATABASE_URL: &str = "postgres://postgres@postgres:5432/postgres";

impl Fleet {
    /// A network, a migrated Postgres and the effect table; no workers yet.
    pub async fn start(test: &str) -> Fleet {
        let zuno = zuno_image();
        let postgres_image = postgres_image();
        for image in [&zuno, &postgres_image] {
            if try_docker(&["image", "inspect", "--format", "{{.Id}}", image])
                .await
                .is_err()
            {
                panic!(
                    "image {image} is missing: build the images with `scripts/images` (scripts/test \
                     and scripts/fault-tests do) or name others with ZUNO_TEST_ZUNO_IMAGE / \
                     ZUNO_TEST_POSTGRES_IMAGE"
                );
            }
        }
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let name = format!("zuno-fleet-{test}-{suffix}");
        let subnet_prefix = create_network(&name).await;
        let resources = Resources {
            network: name.clone(),
            containers: Mutex::new(Vec::new()),
        };
        let postgres = format!("{name}-postgres");
        let port = free_port();
        let published = format!("127.0.0.1:{port}:5432");
        resources
            .run(
                &postgres,
                &[
                    "--network-alias",
                    "postgres",
                    "-p",
                    &published,
                    "-e",
                    "POSTGRES_HOST_AUTH_METHOD=trust",
                    &postgres_image,
                    "postgres",
                    "-c",
                    "max_connections=200",
                    // No `idle_in_transaction_session_timeout` here: a frozen or cut-off worker's
                    // open transaction (and a job row's lock with it) is ended by the setting
                    // every Zuno connection carries, whatever the server's configuration.
                ],
            )
            .await;
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let db = zuno_tests::eventually(
            "Postgres accepts connections and the schema migrates",
            Duration::from_secs(90),
            || {
                let url = url.clone();
                async move {
                    let opened =
                        Db::open(&ConnectOptions::new(url), zuno_shared::migrations::schema())
                            .await
                            .ok();
                    if opened.is_none() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    opened
                }
            },
        )
        .await;
        sqlx::query(EFFECT_TABLE)
            .execute(db.as_postgres().expect("postgres"))
            .await
            .expect("create probe_effect");
        Fleet {
            name,
            subnet_prefix,
            postgres,
            ledger: Ledger::new(db.clone(), system_clock()),
            db,
            resources,
            next_host: std::sync::atomic::AtomicU8::new(100),
        }
    }

    /// Starts a probe worker container named `<fleet>-<id>` with worker id `id`.
    pub async fn worker(&self, id: &str, spec: WorkerSpec) -> String {
        self.worker_with(id, Some(id), spec, None).await
    }

    /// Starts a probe worker container named `<fleet>-<name>`: with `worker_id` `None` it
    /// draws its own id as every worker binary does; with `metrics_port` its `/metrics` is
    /// published on that loopback port (see [`scrape`]).
    pub async fn worker_with(
        &self,
        name: &str,
        worker_id: Option<&str>,
        spec: WorkerSpec,
        metrics_port: Option<u16>,
    ) -> String {
        let container = format!("{}-{name}", self.name);
        let (lease, heartbeat, hold, concurrency) = (
            spec.lease_ms.to_string(),
            spec.heartbeat_ms.to_string(),
            spec.hold_ms.to_string(),
            spec.concurrency.to_string(),
        );
        let image = zuno_image();
        // A fixed address above Docker's dynamic range in use here (Postgres is .2): a worker
        // cut off the network keeps its address free, so it can reconnect with it, and no
        // later worker is handed it meanwhile.
        let host = self
            .next_host
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let address = format!("{}.{host}", self.subnet_prefix);
        let published = metrics_port.map(|port| format!("127.0.0.1:{port}:9100"));
        let mut args = vec!["--ip", &address];
        if let Some(published) = &published {
            args.extend(["-p", published]);
        }
        args.extend([
            &image,
            "zuno-probe",
            "--database-url",
            FLEET_DATABASE_URL,
            "work",
            "--lease-ms",
            &lease,
            "--heartbeat-ms",
            &heartbeat,
            "--hold-ms",
            &hold,
            "--concurrency",
            &concurrency,
        ]);
        if let Some(id) = worker_id {
            args.extend(["--worker-id", id]);
        }
        if published.is_some() {
            args.extend(["--metrics-addr", "0.0.0.0:9100"]);
        }
        self.resources.run(&container, &args).await;
        container
    }

    /// The container's address on the fleet network.
    pub async fn address(&self, container: &str) -> String {
        let format = format!(
            "{{{{ (index .NetworkSettings.Networks \"{}\").IPAddress }}}}",
            self.name
        );
        docker(&["inspect", "--format", &format, container]).await
    }

    /// Cuts a container off the fleet network.
    pub async fn disconnect(&self, container: &str) {
        docker(&["network", "disconnect", &self.name, container]).await;
    }

    /// Reconnects a container with the address it had, so the TCP connections it kept open
    /// resume (as after a real partition heals) instead of hanging until the kernel gives up.
    pub async fn reconnect(&self, container: &str, address: &str) {
        assert!(address.starts_with(&self.subnet_prefix), "{address}");
        docker(&["network", "connect", "--ip", address, &self.name, container]).await;
    }

    pub async fn state(&self, container: &str) -> String {
        docker(&["inspect", "--format", "{{.State.Status}}", container]).await
    }

    /// Admits one probe job (idempotent by key), retrying while the database is unreachable:
    /// after an ambiguous failure the retry finds the job if the first attempt committed.
    pub async fn admit(&self, key: &str) -> String {
        let ledger = self.ledger.clone();
        zuno_tests::eventually(
            &format!("admission of {key}"),
            Duration::from_secs(90),
            || {
                let ledger = ledger.clone();
                async move {
                    let job = NewJob::new(
                        JobIdentity::maintain("fleet", "/fleet", key),
                        JobOrigin::Explicit,
                    );
                    match ledger.admit(job).await {
                        Ok(admission) => Some(admission.into_job().id),
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            None
                        }
                    }
                }
            },
        )
        .await
    }

    pub async fn jobs(&self) -> Result<Vec<JobRow>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, state, attempts, lease_owner, lease_expires_at FROM learning_job ORDER BY id",
        )
        .fetch_all(self.db.as_postgres().expect("postgres"))
        .await
    }

    pub async fn effects(&self) -> Result<Vec<Effect>, sqlx::Error> {
        sqlx::query_as("SELECT job_id, worker_id, attempt, at FROM probe_effect ORDER BY at")
            .fetch_all(self.db.as_postgres().expect("postgres"))
            .await
    }

    pub async fn events(&self) -> Result<Vec<Event>, sqlx::Error> {
        sqlx::query_as(
            "SELECT job_id, event, worker_id, detail FROM learning_job_event ORDER BY at",
        )
        .fetch_all(self.db.as_postgres().expect("postgres"))
        .await
    }

    /// Polls the jobs until `check` accepts them (database errors count as "not yet").
    pub async fn wait_jobs<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[JobRow]) -> Option<T>,
    ) -> T {
        zuno_tests::eventually(what, timeout, || async {
            let jobs = self.jobs().await.ok()?;
            let found = check(&jobs);
            if found.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            found
        })
        .await
    }

    /// Polls the events until `check` accepts them.
    pub async fn wait_events<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[Event]) -> Option<T>,
    ) -> T {
        zuno_tests::eventually(what, timeout, || async {
            let events = self.events().await.ok()?;
            let found = check(&events);
            if found.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            found
        })
        .await
    }

    /// Polls the effects until `check` accepts them.
    pub async fn wait_effects<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[Effect]) -> Option<T>,
    ) -> T {
        zuno_tests::eventually(what, timeout, || async {
            let effects = self.effects().await.ok()?;
            let found = check(&effects);
            if found.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            found
        })
        .await
    }

    /// Waits until every job in `admitted` is settled, then checks the ledger's promises:
    /// - no job lost: exactly the admitted jobs exist, and every one completed;
    /// - none applied twice: exactly one effect per job, and none for anything else;
    /// - every settlement accepted or fenced correctly: the one effect is the final attempt's
    ///   (earlier attempts never committed), and every refusal is of an earlier attempt;
    /// - attempts never above three.
    pub async fn assert_ledger_promises(
        &self,
        admitted: &BTreeSet<String>,
        timeout: Duration,
    ) -> Summary {
        let jobs = self
            .wait_jobs(
                &format!("all {} admitted jobs settle", admitted.len()),
                timeout,
                |jobs| {
                    (jobs.len() >= admitted.len()
                        && jobs
                            .iter()
                            .all(|job| !matches!(job.state.as_str(), "queued" | "running")))
                    .then(|| jobs.to_vec())
                },
            )
            .await;
        let ids: BTreeSet<String> = jobs.iter().map(|job| job.id.clone()).collect();
        assert_eq!(&ids, admitted, "exactly the admitted jobs exist");
        let not_completed: Vec<&JobRow> =
            jobs.iter().filter(|job| job.state != "completed").collect();
        assert!(
            not_completed.is_empty(),
            "every job completed: {not_completed:?}"
        );
        assert!(
            jobs.iter().all(|job| (1..=3).contains(&job.attempts)),
            "attempts within 1..=3: {jobs:?}"
        );

        let effects = self.effects().await.expect("effects");
        let mut per_job: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
        for effect in &effects {
            per_job.entry(&effect.job_id).or_default().push(effect);
        }
        let attempts: BTreeMap<&str, i64> = jobs
            .iter()
            .map(|job| (job.id.as_str(), job.attempts))
            .collect();
        for job in &jobs {
            let recorded = per_job.get(job.id.as_str()).cloned().unwrap_or_default();
            assert_eq!(
                recorded.len(),
                1,
                "job {} applied exactly once: {recorded:?}",
                job.id
            );
            assert_eq!(
                recorded[0].attempt, job.attempts,
                "job {}: the accepted settlement is the final attempt's",
                job.id
            );
        }
        assert_eq!(effects.len(), jobs.len(), "no effect outside the jobs");

        let events = self.events().await.expect("events");
        let mut fenced = 0;
        for event in events.iter().filter(|event| event.event == "fenced") {
            fenced += 1;
            let refused_attempt: i64 = event
                .detail
                .as_deref()
                .and_then(|detail| detail.rsplit(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("fenced event names its attempt: {event:?}"));
            let last = attempts
                .get(event.job_id.as_str())
                .copied()
                .unwrap_or_default();
            assert!(
                refused_attempt < last,
                "only superseded attempts are refused: {event:?} (final attempt {last})"
            );
        }
        let mut effects_by_worker = BTreeMap::new();
        for effect in &effects {
            *effects_by_worker
                .entry(effect.worker_id.clone())
                .or_insert(0) += 1;
        }
        Summary {
            jobs: jobs.len(),
            retried: jobs.iter().filter(|job| job.attempts > 1).count(),
            fenced,
            effects_by_worker,
        }
    }
}

const EFFECT_TABLE: &str = "CREATE TABLE probe_effect (\
     job_id TEXT NOT NULL, worker_id TEXT NOT NULL, attempt BIGINT NOT NULL, \
     at BIGINT NOT NULL DEFAULT (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint)";

/// Creates the network on a free 10.231.N.0/24 (a user-configured subnet is what lets a
/// container reconnect with a fixed address). Returns `10.231.N`.
async fn create_network(name: &str) -> String {
    let mut last_error = String::new();
    for _ in 0..20 {
        let prefix = format!("10.231.{}", rand_byte());
        let subnet = format!("{prefix}.0/24");
        match try_docker(&[
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &subnet,
            "--label",
            "zuno.test=fleet",
            name,
        ])
        .await
        {
            Ok(_) => return prefix,
            Err(error) => last_error = error,
        }
    }
    panic!("cannot create network {name}: {last_error}");
}

fn rand_byte() -> u8 {
    uuid::Uuid::new_v4().as_bytes()[0]
}

/// A probe's `/metrics` text (published with [`Fleet::worker_with`]); `None` while it does not
/// answer.
pub async fn scrape(port: u16) -> Option<String> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()
}

/// The sum of every sample of the metric family `name` (counters may carry a `_total` suffix,
/// histograms are read through their `_count` series) whose labels contain each of `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let family = series.split('{').next()?;
            let wanted = family == name
                || family == format!("{name}_total")
                || (family.starts_with(name) && family.ends_with("_count"));
            (wanted && labels.iter().all(|label| series.contains(label)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// A loopback port nothing listens on now. Chosen up front (not `-p 127.0.0.1::5432`) because
/// Docker may publish a restarted container on a different ephemeral port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("free port")
}
