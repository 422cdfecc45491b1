//! The admitting request's trace continues in the worker's span for the job.

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use zuno_shared::config::Config;
use zuno_shared::learning::SourceGate;
use zuno_shared::runtime::{Runner, RunnerConfig};
use zuno_tests::TestDb;
use zuno_tests::server::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_span_continues_the_admitting_request_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let session = crate::ingestion::project_and_session(&server, "p").await;
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let response = server
        .client
        .post(server.url(&format!("/api/session/{session}/messages")))
        .header(
            "traceparent",
            format!("00-{client_trace}-00f067aa0ba902b7-01"),
        )
        .json(&crate::ingestion::tool_turn())
        .send()
        .await
        .unwrap();
    let outcome: serde_json::Value = response.json().await.unwrap();
    let job_id = outcome["admission"]["job"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = server
        .state
        .ledger
        .get(&job_id)
        .await
        .unwrap()
        .trace_parent
        .expect("trace context stored on the job");
    assert!(
        stored.starts_with(&format!("00-{client_trace}-")),
        "{stored}"
    );
    let request_span_id = stored.split('-').nth(2).unwrap().to_owned();

    let mut config = RunnerConfig::new("trace-worker");
    config.exit_when_idle = true;
    let handlers = zuno_worker_extract::handlers(&zuno_shared::runtime::process::WorkerEnv {
        settings: zuno_shared::runtime::process::Settings {
            paths: zuno_shared::paths::Paths::resolve(Some(std::path::Path::new("/nonexistent"))),
            config: Config::default(),
        },
        ledger: server.state.ledger.clone(),
    })
    .unwrap();
    let mut runner =
        Runner::new(server.state.ledger.clone(), config).with_gate(Arc::new(SourceGate::new(
            Arc::new(Config::default()),
            zuno_shared::clock::system_clock(),
        )));
    for handler in handlers {
        runner = runner.register(handler);
    }
    let report = runner.run(CancellationToken::new()).await;
    assert_eq!(report.completed, 1);
    // The job span ends when the attempt task's future is dropped, which can trail the runner's
    // view of the task's completion; wait for it (bounded) rather than reading once.
    let spans = zuno_tests::eventually(
        "the job span is exported",
        std::time::Duration::from_secs(10),
        || {
            provider.force_flush().ok();
            let spans = exporter.get_finished_spans().unwrap();
            async move {
                spans
                    .iter()
                    .any(|s| s.name == "job extract")
                    .then_some(spans)
            }
        },
    )
    .await;
    let job_span = spans
        .iter()
        .find(|s| s.name == "job extract")
        .expect("waited for above");
    assert_eq!(
        job_span.span_context.trace_id().to_string(),
        client_trace,
        "same trace as the request"
    );
    assert_eq!(
        job_span.parent_span_id.to_string(),
        request_span_id,
        "child of the admitting request's span"
    );
    let request_span = spans
        .iter()
        .find(|s| s.span_context.span_id().to_string() == request_span_id)
        .expect("request span exported");
    assert!(
        request_span.name.starts_with("POST /api/session/"),
        "{}",
        request_span.name
    );
}
