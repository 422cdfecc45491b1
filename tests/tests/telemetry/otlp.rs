//! The real pipeline in one process, exporting spans and metrics over OTLP/HTTP to an
//! in-process receiver: an HTTP request admits an extraction job, a runner with the extract
//! handler claims it, the handler calls the (fake) provider and settles.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use zuno_shared::clock::system_clock;
use zuno_shared::config::Config;
use zuno_shared::learning::SourceGate;
use zuno_shared::ledger::{
    AllowAll, ClaimRequest, JobIdentity, JobKind, JobOrigin, JobState, LedgerError, NewJob,
};
use zuno_shared::runtime::{RunReport, Runner, RunnerConfig};
use zuno_shared::telemetry::{self, TelemetryConfig, TelemetryGuard};
use zuno_tests::TestDb;
use zuno_tests::fake_provider::FakeProvider;
use zuno_tests::otlp_receiver::{OtlpReceiver, ReceivedPoint, ReceivedSpan};
use zuno_tests::server::TestServer;
use zuno_worker_extract::extract::ExtractHandler;
use zuno_worker_extract::provider::LearningModelClient;

use crate::{assistant_turn, unauthorized, user_turn, valid_answer};
use zuno_tests::fake_provider::learning_config;

/// Every metric docs/operations.md marks required, by its OTLP name (Prometheus adds
/// `_total`/`_seconds`): queue depth, claim latency, job duration, attempts, fenced settlements,
/// lease expiries, provider latency/errors/tokens, retrieval latency and skips — plus the
/// counters the dashboard's throughput and learning panels read.
const REQUIRED_METRICS: [&str; 16] = [
    "zuno_queue_depth",
    "zuno_claim_latency",
    "zuno_job_duration",
    "zuno_job_attempt",
    "zuno_fenced_writes",
    "zuno_lease_expiries",
    "zuno_provider_latency",
    "zuno_provider_errors",
    "zuno_provider_tokens",
    "zuno_provider_requests",
    "zuno_retrieval_latency",
    "zuno_retrieval_skipped",
    "zuno_jobs_admitted",
    "zuno_jobs_claimed",
    "zuno_jobs_settled",
    "zuno_experiences_recorded",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_trace_from_admission_to_settlement_and_every_metric_over_otlp() {
    let receiver = OtlpReceiver::start().await;
    // Each nextest test is its own process, so the global subscriber and meter provider are
    // this test's alone. A short interval makes the periodic reader export while we poll.
    let guard = Arc::new(
        telemetry::init(&TelemetryConfig {
            service_name: String::from("zuno-telemetry-test"),
            json_logs: false,
            otlp_endpoint: Some(receiver.endpoint().to_owned()),
            metric_interval_ms: Some(200),
        })
        .expect("install telemetry"),
    );

    let fake = FakeProvider::start().await;
    let db = TestDb::sqlite().await;
    let config = learning_config(fake.base_url(), 5_000);
    let server = TestServer::start(&db, config.clone(), None).await;
    let (status, body) = server
        .post("/api/projects", serde_json::json!({"id": "p", "name": "p"}))
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let (status, session) = server
        .post("/api/projects/p/sessions", serde_json::json!({}))
        .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();

    // 1. A closed turn admitted over HTTP, extracted with a valid answer: completed.
    fake.push([valid_answer()]);
    let job_id = close_turn(&server, &session).await;
    let report = run_extract(&server, &config).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let job = server.state.ledger.get(&job_id).await.unwrap();
    assert_eq!(job.state, JobState::Completed);
    let traceparent = job.trace_parent.expect("trace context stored on the job");
    let mut parts = traceparent.split('-');
    let (trace_id, request_span_id) = (
        parts.nth(1).unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
    );

    // 2. A second turn whose provider call is refused (401): a provider error, a failed job.
    fake.push([unauthorized()]);
    let failed_id = close_turn(&server, &session).await;
    let report = run_extract(&server, &config).await;
    assert_eq!(report.failed, 1, "{report:?}");
    assert_eq!(
        server.state.ledger.get(&failed_id).await.unwrap().state,
        JobState::Failed
    );

    // 3. A lease that expires (counted by the claim that rescues it) and the stale holder's
    //    settlement that is then refused (a fenced write), on a manual clock so no one sleeps.
    expire_a_lease_and_fence_its_settlement(&db).await;

    // 4. Queue depth as `zuno serve` and the workers publish it.
    telemetry::publish_queue_depth(&server.state.ledger)
        .await
        .unwrap();

    // 5. Retrieval has no caller on this path; its instruments are exercised directly so their
    //    export is covered too.
    let retrieval = telemetry::metrics::retrieval();
    retrieval.latency(Duration::from_millis(3));
    retrieval.skipped();
    retrieval.selected(2);

    // The trace: request → job → provider request, and the settlement under the job.
    let spans = wait_for(&guard, "the spans of the first job's trace", || {
        let spans: Vec<ReceivedSpan> = receiver
            .spans()
            .into_iter()
            .filter(|span| span.trace_id == trace_id)
            .collect();
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
        (names.contains(&"job extract")
            && names.contains(&"provider request")
            && names.contains(&"settle")
            && spans.iter().any(|span| span.span_id == request_span_id))
        .then_some(spans)
    })
    .await;
    let by_name = |name: &str| -> &ReceivedSpan {
        let found: Vec<&ReceivedSpan> = spans.iter().filter(|span| span.name == name).collect();
        assert_eq!(found.len(), 1, "one `{name}` span in the trace: {spans:#?}");
        found[0]
    };
    let request = spans
        .iter()
        .find(|span| span.span_id == request_span_id)
        .unwrap();
    assert!(
        request.name.starts_with("POST /api/session/") && request.name.ends_with("/messages"),
        "the admitting request's span: {request:?}"
    );
    assert_eq!(
        request.parent_span_id, None,
        "the request started the trace"
    );
    assert_eq!(request.service.as_deref(), Some("zuno-telemetry-test"));
    let job_span = by_name("job extract");
    assert_eq!(
        job_span.parent_span_id.as_deref(),
        Some(request_span_id.as_str()),
        "the job span continues the admitting request"
    );
    assert_eq!(job_span.attributes.get("job.id"), Some(&job_id));
    let provider = by_name("provider request");
    assert_eq!(
        provider.parent_span_id.as_deref(),
        Some(job_span.span_id.as_str()),
        "the provider request runs inside the job"
    );
    assert_eq!(
        (
            attr(provider, "provider"),
            attr(provider, "model"),
            attr(provider, "api")
        ),
        ("fake", "fake-model", "openai_chat")
    );
    let settle = by_name("settle");
    assert_eq!(
        settle.parent_span_id.as_deref(),
        Some(job_span.span_id.as_str()),
        "the settlement runs inside the job"
    );
    assert_eq!(attr(settle, "settle.state"), "completed");
    assert_eq!(attr(settle, "job.id"), job_id);

    // The metrics: every required name, with the attributes the dashboards group by.
    let points = wait_for(&guard, "every required metric", || {
        let names = receiver.metric_names();
        REQUIRED_METRICS
            .iter()
            .all(|name| names.contains(*name))
            .then(|| latest_points(&receiver.points()))
    })
    .await;
    let value = |metric: &str, attributes: &[(&str, &str)]| -> f64 {
        points
            .iter()
            .filter(|point| point.metric == metric)
            .filter(|point| {
                attributes.iter().all(|(key, value)| {
                    point.attributes.get(*key).map(String::as_str) == Some(*value)
                })
            })
            .map(|point| point.value)
            .sum()
    };
    assert_eq!(
        value(
            "zuno_queue_depth",
            &[("kind", "extract"), ("state", "completed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "zuno_queue_depth",
            &[("kind", "extract"), ("state", "failed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "zuno_queue_depth",
            &[("kind", "extract"), ("state", "running")]
        ),
        0.0,
        "an empty state is published as zero"
    );
    assert_eq!(
        value(
            "zuno_provider_errors",
            &[("provider", "fake"), ("class", "auth")]
        ),
        1.0
    );
    assert_eq!(
        value("zuno_provider_tokens", &[("direction", "input")]),
        100.0
    );
    assert_eq!(
        value("zuno_provider_tokens", &[("direction", "output")]),
        20.0
    );
    assert_eq!(
        value("zuno_provider_latency", &[("model", "fake-model")]),
        2.0
    );
    assert_eq!(
        value(
            "zuno_jobs_settled",
            &[("kind", "extract"), ("state", "completed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "zuno_jobs_settled",
            &[("kind", "extract"), ("state", "failed")]
        ),
        1.0
    );
    assert_eq!(value("zuno_job_attempt", &[("kind", "extract")]), 2.0);
    assert!(value("zuno_job_duration", &[("kind", "extract")]) >= 2.0);
    assert!(value("zuno_claim_latency", &[]) >= 2.0);
    assert_eq!(
        value(
            "zuno_fenced_writes",
            &[("kind", "maintain"), ("operation", "settlement")]
        ),
        1.0
    );
    assert_eq!(value("zuno_lease_expiries", &[]), 1.0);
    assert_eq!(
        value("zuno_experiences_recorded", &[("verification", "verified")]),
        1.0
    );
    assert_eq!(value("zuno_retrieval_latency", &[]), 1.0);
    assert_eq!(value("zuno_retrieval_skipped", &[]), 1.0);
    for point in points
        .iter()
        .filter(|p| p.metric.ends_with("latency") || p.metric.ends_with("duration"))
    {
        assert_eq!(point.unit, "s", "{point:?}");
    }
}

/// Posts the user's correction and the completed assistant turn; returns the admitted job.
async fn close_turn(server: &TestServer, session: &str) -> String {
    let path = format!("/api/session/{session}/messages");
    let (status, body) = server.post(&path, user_turn()).await;
    assert_eq!(status, 201, "{body}");
    let (status, outcome) = server.post(&path, assistant_turn()).await;
    assert_eq!(status, 201, "{outcome}");
    assert_eq!(outcome["admission"]["outcome"], "queued", "{outcome}");
    outcome["admission"]["job"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An extract worker, in process, until the queue is empty.
async fn run_extract(server: &TestServer, config: &Config) -> RunReport {
    let config = Arc::new(config.clone());
    let mut runner_config = RunnerConfig::new("telemetry-worker");
    runner_config.exit_when_idle = true;
    Runner::new(server.state.ledger.clone(), runner_config)
        .with_gate(Arc::new(SourceGate::new(config.clone(), system_clock())))
        .register(Arc::new(ExtractHandler::new(
            config,
            LearningModelClient::new(),
        )))
        .run(CancellationToken::new())
        .await
}

async fn expire_a_lease_and_fence_its_settlement(db: &TestDb) {
    let (ledger, clock) = db.manual_ledger();
    ledger
        .admit(NewJob::new(
            JobIdentity::maintain("p", "/telemetry", "lease-expiry"),
            JobOrigin::Explicit,
        ))
        .await
        .unwrap();
    let claim = |worker: &'static str| ClaimRequest {
        worker_id: worker,
        kinds: &[JobKind::Maintain],
        limit: 1,
        lease_ms: 1_000,
        scopes: None,
    };
    let stale = ledger.claim(&claim("stale"), &AllowAll).await.unwrap();
    let stale = stale.claimed.into_iter().next().expect("claimed").lease;
    clock.advance(5_000);
    let taken = ledger.claim(&claim("fresh"), &AllowAll).await.unwrap();
    assert_eq!(taken.rescued.len(), 1, "the expired lease was rescued");
    let fresh = taken.claimed.into_iter().next().expect("reclaimed").lease;
    let refused = ledger
        .begin_settlement(&stale)
        .await
        .unwrap()
        .complete(serde_json::json!({}))
        .await;
    assert!(
        matches!(refused, Err(LedgerError::LeaseLost { .. })),
        "{refused:?}"
    );
    ledger
        .begin_settlement(&fresh)
        .await
        .unwrap()
        .complete(serde_json::json!({}))
        .await
        .unwrap();
}

fn attr<'s>(span: &'s ReceivedSpan, key: &str) -> &'s str {
    span.attributes.get(key).map_or("<absent>", String::as_str)
}

/// Exports are cumulative: keep the last point of each series (metric + attributes).
fn latest_points(points: &[ReceivedPoint]) -> Vec<ReceivedPoint> {
    let mut latest: BTreeMap<(String, Vec<(String, String)>), ReceivedPoint> = BTreeMap::new();
    for point in points {
        let key = (
            point.metric.clone(),
            point
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        latest.insert(key, point.clone());
    }
    latest.into_values().collect()
}

/// Flushes telemetry and polls `check` until it holds, failing after a deadline. Flushing runs
/// on a blocking thread: the exporters block on their HTTP request until the receiver (on this
/// runtime) answers.
async fn wait_for<T>(
    guard: &Arc<TelemetryGuard>,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let flushing = Arc::clone(guard);
        tokio::task::spawn_blocking(move || flushing.flush())
            .await
            .unwrap();
        if let Some(found) = check() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
