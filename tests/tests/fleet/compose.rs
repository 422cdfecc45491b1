//! The documented local stack, exactly as a user starts it:
//! `docker compose -f docker-compose.yml -f docker-compose.local.yml up -d --scale
//! worker-extract=3`, on a private project name and free host ports. It must become healthy in
//! start order, learn from a closed turn end to end (API → ledger → an extract worker → the fake
//! provider → a verified experience) and be scraped whole by its Prometheus (every replica of
//! the scaled worker included); then `down -v` removes it. Beyond extraction, the fake provider
//! answers maintenance plans and pattern grouping in their own schemas, so the maintain and
//! aggregate jobs of three corrected sessions complete (none fails) and mining turns the fake's
//! groups into patterns. A worker that exits is restarted, a `docker kill`ed one comes back
//! with `up -d`, and a stopping one gets more than its 30 s grace (`stop_grace_period`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

/// The project's bearer token (docker-compose.yml's default, set explicitly here).
const TOKEN: &str = "zuno-fleet-compose-token-0123456789abcdef";
const EXTRACT_REPLICAS: usize = 3;
/// What a user would type as a correction; the fake provider cites it verbatim.
const CORRECTION: &str = "No, use pnpm, not npm.";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("free port")
}

/// One compose project: `docker compose -p NAME -f docker-compose.yml -f
/// docker-compose.local.yml …`, taken down with its volumes on drop (after printing the
/// services' logs when the test is failing).
struct Stack {
    project: String,
    api_port: u16,
    prometheus_port: u16,
}

impl Stack {
    fn command(&self, args: &[&str]) -> std::process::Command {
        let repository = repository();
        let mut command = std::process::Command::new("docker");
        command
            .current_dir(&repository)
            .args(["compose", "-p", &self.project])
            .args(["-f", "docker-compose.yml", "-f", "docker-compose.local.yml"])
            .args(args)
            .env("ZUNO_API_PORT", self.api_port.to_string())
            .env("PROMETHEUS_PORT", self.prometheus_port.to_string())
            .env("ZUNO_API_TOKEN", TOKEN)
            // The caller's environment must not leak into the stack.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("ZUNO_IMAGE")
            .env_remove("POSTGRES_IMAGE")
            .env_remove("PROMETHEUS_IMAGE")
            .env_remove("COMPOSE_PROFILES")
            .env_remove("COMPOSE_FILE");
        command
    }

    async fn run(&self, args: &[&str]) -> String {
        let mut command = tokio::process::Command::from(self.command(args));
        command.kill_on_drop(true);
        let output = command
            .output()
            .await
            .unwrap_or_else(|error| panic!("docker compose {}: {error}", args.join(" ")));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "docker compose {} failed ({}):\n{stdout}\n{stderr}",
            args.join(" "),
            output.status
        );
        stdout
    }

    /// The ids of the containers of one service.
    async fn service_containers(&self, service: &str) -> Vec<String> {
        super::docker::docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
        ])
        .await
        .split_whitespace()
        .map(str::to_owned)
        .collect()
    }

    /// Each running container of the project: (service, health or state).
    async fn containers(&self) -> Vec<(String, String)> {
        let ids = super::docker::docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
        ])
        .await;
        let mut containers = Vec::new();
        for id in ids.split_whitespace() {
            let line = super::docker::docker(&[
                "inspect",
                "--format",
                "{{ index .Config.Labels \"com.docker.compose.service\" }} \
                 {{ if .State.Health }}{{ .State.Health.Status }}{{ else }}{{ .State.Status }}{{ end }}",
                id,
            ])
            .await;
            if let Some((service, state)) = line.split_once(' ') {
                containers.push((service.to_owned(), state.to_owned()));
            }
        }
        containers.sort();
        containers
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(output) = self.command(&["ps"]).output() {
                eprintln!("{}", String::from_utf8_lossy(&output.stdout));
            }
            if let Ok(output) = self
                .command(&["logs", "--no-color", "--tail", "30"])
                .output()
            {
                eprintln!("{}", String::from_utf8_lossy(&output.stdout));
            }
        }
        let down = self
            .command(&["down", "-v", "--remove-orphans", "--timeout", "5"])
            .output();
        match down {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "docker compose down -v failed for {}: {}",
                self.project,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("docker compose down -v: {error}"),
        }
    }
}

/// `Err(reason)` when `docker compose` does not work here (scripts/bootstrap installs it).
fn compose_available() -> Result<(), String> {
    match std::process::Command::new("docker")
        .args(["compose", "version"])
        .output()
    {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "`docker compose version` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => Err(format!("no docker CLI: {error}")),
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(u16, Value), String> {
        let response = request
            .bearer_auth(TOKEN)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let request = self.http.post(format!("{}{path}", self.base)).json(&body);
        let (status, body) = self.send(request).await.expect(path);
        assert!((200..300).contains(&status), "POST {path}: {status} {body}");
        body
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let request = self.http.get(format!("{}{path}", self.base));
        match self.send(request).await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }
}

/// Waits until `service` runs exactly one container, healthy, restarted by Docker at least
/// `restarts` times.
async fn healthy_again(stack: &Stack, service: &str, what: &str, restarts: u64) {
    zuno_tests::eventually(what, Duration::from_secs(90), || async {
        let containers = stack.service_containers(service).await;
        let mut back = containers.len() == 1;
        for container in &containers {
            let state = super::docker::docker(&[
                "inspect",
                "--format",
                "{{ .RestartCount }} {{ if .State.Health }}{{ .State.Health.Status }}{{ end }}",
                container,
            ])
            .await;
            let mut parts = state.split_whitespace();
            let count: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            back &= count >= restarts && parts.next() == Some("healthy");
        }
        if !back {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        back.then_some(())
    })
    .await;
}

/// Instant query against the stack's Prometheus.
async fn prometheus_query(http: &reqwest::Client, base: &str, expression: &str) -> Option<Value> {
    let body: Value = http
        .get(format!(
            "{base}/api/v1/query?query={}",
            zuno_tests::percent_encode(expression)
        ))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    (body["status"] == "success").then(|| body["data"]["result"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_compose_stack_starts_scales_and_learns_end_to_end() {
    require_docker!();
    if let Err(reason) = compose_available() {
        assert!(
            !super::docker::docker_required(),
            "ZUNO_REQUIRE_DOCKER is set but {reason} (scripts/bootstrap installs it)"
        );
        println!("SKIP: {reason}");
        eprintln!("SKIP: {reason}");
        return;
    }
    for image in [
        "zuno/zuno:local",
        "zuno/postgres:15",
        "zuno/prometheus:local",
    ] {
        assert!(
            super::docker::try_docker(&["image", "inspect", "--format", "{{.Id}}", image])
                .await
                .is_ok(),
            "image {image} is missing: build the images with `scripts/images`"
        );
    }
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let stack = Stack {
        project: format!("zuno-fleet-compose-{suffix}"),
        api_port: free_port(),
        prometheus_port: free_port(),
    };
    let started = std::time::Instant::now();
    // Start order: Postgres and the fake provider healthy first, then the API and the workers
    // (compose waits on `depends_on: condition: service_healthy`), Prometheus after the API.
    stack
        .run(&[
            "up",
            "-d",
            "--scale",
            &format!("worker-extract={EXTRACT_REPLICAS}"),
        ])
        .await;
    eprintln!("compose up -d returned after {:?}", started.elapsed());

    // Every service is up, and every one with a health check reports healthy.
    let expected = [
        ("api", 1),
        ("fake-provider", 1),
        ("postgres", 1),
        ("prometheus", 1),
        ("worker-eval", 1),
        ("worker-extract", EXTRACT_REPLICAS),
        ("worker-maintain", 1),
        ("worker-mine", 1),
    ];
    let containers = zuno_tests::eventually(
        "every service of the local stack is healthy",
        Duration::from_secs(120),
        || async {
            let containers = stack.containers().await;
            let ready = expected.iter().all(|(service, count)| {
                containers
                    .iter()
                    .filter(|(s, state)| s == service && state == "healthy")
                    .count()
                    == *count
            }) && containers.len() == expected.iter().map(|(_, n)| n).sum::<usize>();
            if !ready {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            ready.then_some(containers)
        },
    )
    .await;
    eprintln!(
        "stack healthy after {:?}: {containers:?}",
        started.elapsed()
    );
    for (service, state) in &containers {
        assert_eq!(
            state, "healthy",
            "{service} has a health check and passes it"
        );
    }

    // Learning end to end, through the published API port with the bearer token.
    let http = reqwest::Client::new();
    let api = Api {
        http: http.clone(),
        base: format!("http://127.0.0.1:{}", stack.api_port),
    };
    let unauthorized = http
        .get(format!("{}/api/jobs", api.base))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(unauthorized.status().as_u16(), 401, "the token is required");
    api.post("/api/projects", json!({"id": "demo", "name": "Demo"}))
        .await;
    let session = api.post("/api/projects/demo/sessions", json!({})).await["id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let messages = format!("/api/session/{session}/messages");
    api.post(
        &messages,
        json!({"role": "user", "parts": [{"type": "text", "text": CORRECTION}]}),
    )
    .await;
    let outcome = api
        .post(
            &messages,
            json!({"role": "assistant", "status": "completed", "parts": [
                {"type": "tool_call", "toolName": "bash", "arguments": {"cmd": "pnpm i"},
                 "result": "ok", "status": "completed"}]}),
        )
        .await;
    assert_eq!(outcome["admission"]["outcome"], "queued", "{outcome}");
    let job_id = outcome["admission"]["job"]["id"]
        .as_str()
        .expect("job id")
        .to_owned();
    let job = zuno_tests::eventually(
        "the extract job completes",
        Duration::from_secs(90),
        || async {
            let detail = api.get(&format!("/api/jobs/{job_id}")).await;
            let state = detail
                .as_ref()
                .and_then(|d| d["job"]["state"].as_str())
                .unwrap_or_default()
                .to_owned();
            assert!(
                !matches!(state.as_str(), "failed" | "skipped"),
                "the extract job settled {state}: {detail:?}"
            );
            if state != "completed" {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (state == "completed").then_some(detail?)
        },
    )
    .await;
    assert_eq!(
        job["job"]["attempts"], 1,
        "learned on the first attempt: {job}"
    );
    let experiences = api
        .get("/api/projects/demo/learn/experiences")
        .await
        .expect("experiences");
    let learned = experiences["experiences"]
        .as_array()
        .expect("experience list")
        .clone();
    assert_eq!(learned.len(), 1, "one experience learned: {experiences}");
    let experience = &learned[0];
    assert_eq!(experience["jobId"], job_id.as_str(), "{experience}");
    assert_eq!(experience["extractorVersion"], "model-1", "{experience}");
    assert_eq!(experience["verification"], "verified", "{experience}");
    assert!(
        experience["evidence"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["verified"] == true
                && CORRECTION.contains(e["excerpt"].as_str().unwrap_or("\u{0}"))),
        "the experience cites the correction verbatim: {experience}"
    );
    let learning = api
        .get(&format!("/api/session/{session}/learning"))
        .await
        .expect("the session's learning projection");
    assert!(
        learning
            .to_string()
            .contains(experience["id"].as_str().expect("experience id")),
        "the session projection shows the experience: {learning}"
    );
    eprintln!(
        "learned {} ({}) after {:?}",
        experience["id"],
        experience["title"],
        started.elapsed()
    );

    // Beyond extraction: two more sessions with other corrections give mining three new
    // records, so it asks the fake for pattern groups; maintenance asks it for plans. (The same
    // correction again would reinforce the first experience, not add a record.) Every job
    // completes.
    for correction in [
        "No, run the tests with cargo nextest.",
        "Wrong file: the settings live in config.toml.",
    ] {
        let session = api.post("/api/projects/demo/sessions", json!({})).await["id"]
            .as_str()
            .expect("session id")
            .to_owned();
        let messages = format!("/api/session/{session}/messages");
        api.post(
            &messages,
            json!({"role": "user", "parts": [{"type": "text", "text": correction}]}),
        )
        .await;
        api.post(
            &messages,
            json!({"role": "assistant", "status": "completed", "parts": [
                {"type": "tool_call", "toolName": "bash", "arguments": {"cmd": "ls"},
                 "result": "ok", "status": "completed"}]}),
        )
        .await;
    }
    let jobs = zuno_tests::eventually(
        "every job settles and one aggregation groups the three experiences",
        Duration::from_secs(120),
        || async {
            let page = api.get("/api/jobs?limit=1000").await?;
            let jobs = page["jobs"].as_array()?.clone();
            for job in &jobs {
                assert_ne!(job["state"], "failed", "no job fails: {job}");
            }
            let of = |kind: &'static str| jobs.iter().filter(move |j| j["kind"] == kind);
            let done = jobs.iter().all(|j| j["state"] == "completed")
                && of("extract").count() == 3
                && of("maintain").count() >= 1
                && of("aggregate_project").any(|j| j["result"]["outcome"] == "aggregated");
            if !done {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done.then_some(jobs)
        },
    )
    .await;
    let kinds: Vec<&str> = jobs.iter().filter_map(|j| j["kind"].as_str()).collect();
    eprintln!("jobs after three sessions: {kinds:?}");
    let patterns = api
        .get("/api/projects/demo/learn/patterns")
        .await
        .expect("patterns");
    let rules = patterns.to_string();
    assert!(
        rules.contains(CORRECTION) && rules.contains("cargo nextest"),
        "the fake's groups became patterns: {patterns}"
    );

    // Capacity comes back. A worker that exits by itself (a crash, the OOM killer; here a
    // signal from inside the container) is restarted by Docker. `docker kill` is an operator's
    // stop, which no restart policy undoes on this engine: `docker compose up -d` brings the
    // worker back. `docker stop` waits out the workers' 30 s grace before SIGKILL.
    let worker = stack
        .service_containers("worker-maintain")
        .await
        .pop()
        .expect("a worker-maintain container");
    let policy = super::docker::docker(&[
        "inspect",
        "--format",
        "{{ .HostConfig.RestartPolicy.Name }} {{ .Config.StopTimeout }}",
        &worker,
    ])
    .await;
    assert_eq!(
        policy.trim(),
        "unless-stopped 40",
        "restart policy and stop timeout"
    );
    super::docker::docker(&["exec", &worker, "sh", "-c", "kill -TERM 1"]).await;
    healthy_again(
        &stack,
        "worker-maintain",
        "a worker that exited is restarted",
        1,
    )
    .await;
    super::docker::docker(&["kill", &worker]).await;
    zuno_tests::eventually(
        "the killed worker stays down",
        Duration::from_secs(30),
        || async {
            let state =
                super::docker::docker(&["inspect", "--format", "{{ .State.Status }}", &worker])
                    .await;
            let exited = state.trim() == "exited";
            if !exited {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            exited.then_some(())
        },
    )
    .await;
    stack
        .run(&[
            "up",
            "-d",
            "--scale",
            &format!("worker-extract={EXTRACT_REPLICAS}"),
        ])
        .await;
    healthy_again(
        &stack,
        "worker-maintain",
        "`up -d` brings the killed worker back",
        0,
    )
    .await;
    // Prometheus scrapes every service, every replica of the scaled worker included (found
    // through Docker's DNS), and sees the completed extraction.
    let prometheus = format!("http://127.0.0.1:{}", stack.prometheus_port);
    zuno_tests::eventually(
        "Prometheus scrapes every service and replica",
        Duration::from_secs(120),
        || async {
            let up = prometheus_query(&http, &prometheus, "up == 1").await?;
            let mut jobs: Vec<String> = up
                .as_array()?
                .iter()
                .filter_map(|series| series["metric"]["job"].as_str().map(str::to_owned))
                .collect();
            jobs.sort();
            let mut wanted = vec![
                "api",
                "prometheus",
                "worker-eval",
                "worker-maintain",
                "worker-mine",
            ];
            wanted.extend(std::iter::repeat_n("worker-extract", EXTRACT_REPLICAS));
            wanted.sort();
            let done = jobs == wanted;
            if !done {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            done.then_some(())
        },
    )
    .await;
    zuno_tests::eventually(
        "Prometheus has the completed extraction",
        Duration::from_secs(60),
        || async {
            let result = prometheus_query(
                &http,
                &prometheus,
                "sum(zuno_jobs_settled_total{kind=\"extract\",state=\"completed\"})",
            )
            .await?;
            let value: f64 = result.get(0)?["value"][1].as_str()?.parse().ok()?;
            if value < 1.0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (value >= 1.0).then_some(())
        },
    )
    .await;
    eprintln!("compose stack verified after {:?}", started.elapsed());
}
