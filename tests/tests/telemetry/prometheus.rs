//! The dashboard kept honest: a real Prometheus (Debian's 2.42) scrapes a real `zuno` API
//! process and a real `zuno-worker-extract` process (its `--metrics-addr` endpoint) while real
//! traffic flows through them, then every expression of deploy/grafana/dashboards/zuno.json is
//! asked of Prometheus's HTTP API and must return data.
//!
//! The traffic covers every panel: a completed extraction (tokens, latency, a verified
//! experience), a provider refusal (a failed settlement, an `auth` error) and a provider call
//! that hangs past the worker's lease (the lease expires, the job is rescued and completed by its
//! second attempt, and the first attempt's late write is fenced).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_tests::processes::binary;

use crate::{MODEL, PROVIDER, assistant_turn, unauthorized, user_turn, valid_answer};

/// Where Debian installs Prometheus; `ZUNO_PROMETHEUS` overrides it.
const DEFAULT_PROMETHEUS: &str = "/usr/bin/prometheus";

/// The worker's lease: long enough for an extraction against the instant fake provider on a
/// loaded machine (tens of milliseconds), short enough that the hanging call outlives it.
const LEASE_MS: u64 = 2_000;
/// The provider timeout: the hanging call ends after it, well after the lease expired and the
/// job was rescued, so its late write is the fenced one.
const PROVIDER_TIMEOUT_MS: u64 = 6_000;

/// The API's operator token: the server refuses unauthenticated requests.
const API_TOKEN: &str = "telemetry-test-token-0123456789";

/// Replaces Grafana's interval variables in dashboard expressions. The whole test runs within
/// this window, so every increase it caused is inside it.
const WINDOW: &str = "5m";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let prometheus_bin = std::env::var_os("ZUNO_PROMETHEUS")
        .map_or_else(|| PathBuf::from(DEFAULT_PROMETHEUS), PathBuf::from);
    if !prometheus_bin.exists() {
        let reason = format!(
            "{} is missing (install Debian's `prometheus` package, which scripts/bootstrap does, \
             or set ZUNO_PROMETHEUS)",
            prometheus_bin.display()
        );
        // scripts/test sets ZUNO_REQUIRE_PROMETHEUS=1 after bootstrap: there a missing
        // Prometheus is a failure. Only a developer running this binary by hand gets a skip.
        assert!(
            !crate::required("ZUNO_REQUIRE_PROMETHEUS"),
            "ZUNO_REQUIRE_PROMETHEUS is set but {reason}"
        );
        println!("SKIPPED: {reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let expressions = dashboard_expressions();
    let temp = tempfile::tempdir().unwrap();
    let home = temp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();

    let fake = FakeProvider::start().await;
    let config = json!({
        "providers": { PROVIDER: { "api": "openai_chat", "base_url": fake.base_url() } },
        "learning": {
            "extractor_model": format!("{PROVIDER}/{MODEL}"),
            "execution": { "timeout_ms": PROVIDER_TIMEOUT_MS },
        },
    });
    std::fs::write(home.join("config.json"), config.to_string()).unwrap();

    // The API alone (no in-process workers), then one extract worker on the same SQLite file.
    let mut api = zuno_command("zuno", &home);
    api.args(["serve", "--bind", "127.0.0.1:0"])
        .env("ZUNO_API_TOKEN", API_TOKEN);
    let (_api, api_address) = spawn_api(api, &temp.path().join("api.log")).await;
    let metrics_address = format!("127.0.0.1:{}", free_port());
    let mut worker = zuno_command("zuno-worker-extract", &home);
    worker.args([
        "--worker-id",
        "telemetry-extract",
        "--metrics-addr",
        &metrics_address,
        "--lease-ms",
        &LEASE_MS.to_string(),
        // No heartbeat before the lease runs out: the hanging call must lose its lease (a
        // configuration workers refuse unless told it is deliberate).
        "--heartbeat-ms",
        "600000",
        "--unchecked-heartbeat",
        "--poll-interval-ms",
        "200",
    ]);
    let worker_log = temp.path().join("worker.log");
    let mut worker = spawn_logged(worker, &worker_log);
    let http = reqwest::Client::new();
    // Serving /healthz and past the database check (it logs "worker started"), still alive.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(&worker_log).unwrap_or_default();
        if let Some(status) = worker.try_wait().unwrap() {
            panic!(
                "the worker exited ({status}) before starting; stale binaries? run `cargo build --workspace --bins`.\n{log}"
            );
        }
        let healthy = http
            .get(format!("http://{metrics_address}/healthz"))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success());
        if healthy && log.contains("worker started") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker did not start within 60 s:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let _worker = worker;
    let prometheus =
        Prometheus::start(&prometheus_bin, temp.path(), &api_address, &metrics_address).await;
    let scraped = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Ok(up) = prometheus.query("up == 1").await
                && up.len() == 2
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        scraped.is_ok(),
        "Prometheus did not scrape both targets within 60 s.\nTargets: {}\nPrometheus log:\n{}",
        prometheus.targets().await,
        prometheus.log_tail()
    );

    // Traffic.
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {API_TOKEN}").parse().unwrap(),
    );
    let api = Api {
        http: reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap(),
        base: format!("http://{api_address}"),
    };
    api.post("/api/projects", json!({"id": "p", "name": "p"}))
        .await;
    let session = api.post("/api/projects/p/sessions", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    fake.push([valid_answer()]);
    let completed = api.close_turn(&session).await;
    api.wait_state(&completed, "completed").await;
    fake.push([unauthorized()]);
    let refused = api.close_turn(&session).await;
    api.wait_state(&refused, "failed").await;
    fake.push([Reply::hang(), valid_answer()]);
    let rescued = api.close_turn(&session).await;
    api.wait_state(&rescued, "completed").await;
    api.wait_event(&rescued, "lease_expired").await;
    api.wait_event(&rescued, "fenced").await;

    // Every dashboard expression, asked until each returns data (scrapes are asynchronous).
    let mut missing: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        missing.clear();
        for expression in &expressions {
            match prometheus.query(expression).await {
                Ok(series) if has_number(&series) => {}
                Ok(series) => missing.push(format!("{expression}  →  {series:?}")),
                Err(error) => missing.push(format!("{expression}  →  {error}")),
            }
        }
        if missing.is_empty() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without data after real traffic:\n{}\nPrometheus log:\n{}",
        missing.join("\n"),
        prometheus.log_tail()
    );
    println!(
        "all {} dashboard expressions returned data",
        expressions.len()
    );
}

/// Every `expr` of every panel (rows' nested panels included), with Grafana's interval
/// variables replaced. Fails on any other `$` variable: the test could not evaluate it.
fn dashboard_expressions() -> Vec<String> {
    let path = repository().join("deploy/grafana/dashboards/zuno.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    fn walk(panels: &Value, out: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_owned());
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut raw = Vec::new();
    walk(&dashboard["panels"], &mut raw);
    assert!(raw.len() >= 10, "the dashboard has panels: {raw:?}");
    raw.into_iter()
        .map(|expr| {
            let expr = ["$__rate_interval", "$__interval", "$__range"]
                .iter()
                .fold(expr, |expr, variable| expr.replace(variable, WINDOW));
            assert!(!expr.contains('$'), "unsupported variable in `{expr}`");
            expr
        })
        .collect()
}

/// Some series with a numeric (not NaN) value: a panel that would draw something.
fn has_number(series: &[Value]) -> bool {
    series.iter().any(|sample| {
        sample["value"][1]
            .as_str()
            .and_then(|value| value.parse::<f64>().ok())
            .is_some_and(|value| !value.is_nan())
    })
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

/// A workspace binary with a private home and none of the caller's Zuno environment.
fn zuno_command(name: &str, home: &Path) -> Command {
    let mut command = Command::new(binary(name));
    command.env("ZUNO_HOME", home).env("ZUNO_LOG", "info");
    for variable in [
        "DATABASE_URL",
        "ZUNO_DATABASE_URL",
        "ZUNO_BIND",
        "ZUNO_API_TOKEN",
        "ZUNO_CONFIG",
        "ZUNO_METRICS_ADDR",
        "ZUNO_LOG_FORMAT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        command.env_remove(variable);
    }
    command.kill_on_drop(true);
    command
}

fn spawn_logged(mut command: Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap();
    command
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap_or_else(|error| panic!("spawn {command:?}: {error}"))
}

/// Starts `zuno serve` and reads the address from its start-up line on stdout.
async fn spawn_api(mut command: Command, log: &Path) -> (Child, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .expect("spawn zuno serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("zuno serve printed its address in time")
        .unwrap()
        .unwrap_or_else(|| {
            panic!(
                "zuno serve exited: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let address = line
        .strip_prefix("zuno listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected start-up line: {line}"))
        .to_owned();
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, address)
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "POST {path}: {status} {body}");
        body
    }

    async fn job(&self, id: &str) -> Value {
        self.http
            .get(format!("{}/api/jobs/{id}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The user's correction and the completed assistant turn; returns the admitted job's id.
    async fn close_turn(&self, session: &str) -> String {
        let path = format!("/api/session/{session}/messages");
        self.post(&path, user_turn()).await;
        let outcome = self.post(&path, assistant_turn()).await;
        assert_eq!(outcome["admission"]["outcome"], "queued", "{outcome}");
        outcome["admission"]["job"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn wait_state(&self, id: &str, state: &str) {
        let what = format!("job {id} is {state}");
        zuno_tests::eventually(&what, Duration::from_secs(60), || async {
            let detail = self.job(id).await;
            let current = detail["job"]["state"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                current == state || !matches!(current.as_str(), "completed" | "failed" | "skipped"),
                "job {id} settled {current}, expected {state}: {detail}"
            );
            (current == state).then_some(())
        })
        .await;
    }

    async fn wait_event(&self, id: &str, event: &str) {
        let what = format!("job {id} has a `{event}` event");
        zuno_tests::eventually(&what, Duration::from_secs(60), || async {
            let detail = self.job(id).await;
            detail["events"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["event"] == event)
                .then_some(())
        })
        .await;
    }
}

/// A private Prometheus on a free port, with a configuration derived from deploy/prometheus.yml.
struct Prometheus {
    _child: Child,
    base: String,
    log: PathBuf,
    http: reqwest::Client,
}

impl Prometheus {
    async fn start(bin: &Path, dir: &Path, api: &str, worker: &str) -> Prometheus {
        let config = test_config(api, worker);
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let address = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let mut command = Command::new(bin);
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .kill_on_drop(true);
        let child = spawn_logged(command, &log);
        let prometheus = Prometheus {
            _child: child,
            base: format!("http://{address}"),
            log,
            http: reqwest::Client::new(),
        };
        zuno_tests::eventually("Prometheus is ready", Duration::from_secs(60), || async {
            let response = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.base))
                .send()
                .await
                .ok()?;
            response.status().is_success().then_some(())
        })
        .await;
        prometheus
    }

    /// An instant query's result vector.
    async fn query(&self, expression: &str) -> Result<Vec<Value>, String> {
        let response = self
            .http
            .get(format!(
                "{}/api/v1/query?query={}",
                self.base,
                zuno_tests::percent_encode(expression)
            ))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(body.to_string());
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The scrape targets' health and last errors, for failure messages.
    async fn targets(&self) -> String {
        let response = self
            .http
            .get(format!("{}/api/v1/targets", self.base))
            .send()
            .await;
        match response {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(error) => error.to_string(),
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// deploy/prometheus.yml with its service discovery pointed at the processes of this test: the
/// `api` job at the API, the `worker-extract` job at the worker's metrics endpoint (its DNS
/// discovery only works inside the compose network), the other jobs dropped, and a 1 s scrape
/// interval. Deriving it keeps the job names the dashboard filters on the deployed ones.
fn test_config(api: &str, worker: &str) -> String {
    let path = repository().join("deploy/prometheus.yml");
    let mut config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let jobs: Vec<String> = config["scrape_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|job| job["job_name"].as_str().map(str::to_owned))
        .collect();
    for expected in [
        "api",
        "worker-extract",
        "worker-maintain",
        "worker-mine",
        "worker-eval",
    ] {
        assert!(
            jobs.iter().any(|job| job == expected),
            "deploy/prometheus.yml scrapes `{expected}`: {jobs:?}"
        );
    }
    let scrape_configs: Vec<serde_yaml_ng::Value> = config["scrape_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|job| {
            let target = match job["job_name"].as_str()? {
                "api" => api,
                "worker-extract" => worker,
                _ => return None,
            };
            let mut job = job.clone();
            let map = job.as_mapping_mut()?;
            map.remove("dns_sd_configs");
            map.insert(
                "static_configs".into(),
                serde_yaml_ng::from_str(&format!("[{{targets: [\"{target}\"]}}]")).unwrap(),
            );
            Some(job)
        })
        .collect();
    config["scrape_configs"] = serde_yaml_ng::Value::Sequence(scrape_configs);
    config["global"]["scrape_interval"] = "1s".into();
    config["global"]["scrape_timeout"] = "1s".into();
    config["global"]["evaluation_interval"] = "1s".into();
    serde_yaml_ng::to_string(&config).unwrap()
}
