//! The HTTP API: ingestion of projects, sessions and messages; admission of extraction jobs when
//! turns close; job inspection; health, readiness, metrics and the OpenAPI document.

pub mod auth;
pub mod error;
pub mod guard;
pub mod json;
mod openapi;
mod routes;
pub mod transport;
pub mod worktree;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use tower_http::trace::TraceLayer;
use zuno_shared::clock::SharedClock;
use zuno_shared::config::Config;
use zuno_shared::db::Db;
use zuno_shared::learning::LearningIngestion;
use zuno_shared::ledger::Ledger;
use zuno_shared::tokens::TokenStore;
use zuno_shared::transcript::TranscriptStore;

pub use openapi::openapi_document;

/// Shared state of every route.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: Db,
    pub ledger: Ledger,
    pub transcripts: TranscriptStore,
    pub ingestion: LearningIngestion,
    pub tokens: TokenStore,
    pub memory: zuno_shared::memory::service::MemoryService,
    pub auth: auth::Auth,
    /// The `Host` names this server answers to.
    pub hosts: guard::HostPolicy,
    /// Whether `/metrics` needs the server's token.
    pub metrics_auth: bool,
    /// The live-stream change poller and per-token stream counts.
    pub live: routes::live::LiveHub,
    /// The one-time dashboard sign-in.
    pub dashboard: routes::ui::Dashboard,
    /// The Prometheus registry rendered at `/metrics` (absent in tests without telemetry).
    pub metrics: Option<prometheus::Registry>,
    /// The server's data and configuration directories (never a worktree).
    pub paths: zuno_shared::paths::Paths,
}

impl AppState {
    /// The state of a router. `server_token` is the server's own token (the operator's
    /// `ZUNO_API_TOKEN` or the generated local token); `None` turns authentication off and makes
    /// every caller the local user, which is right for the CLI's in-process router and for
    /// `--insecure-no-auth` on loopback only. The `Host`, `Origin` and content-type rules apply
    /// either way.
    pub fn new(
        config: Arc<Config>,
        db: Db,
        clock: SharedClock,
        paths: zuno_shared::paths::Paths,
        server_token: Option<&str>,
        metrics: Option<prometheus::Registry>,
    ) -> AppState {
        let ledger = Ledger::new(db.clone(), clock.clone());
        let transcripts = TranscriptStore::new(db.clone(), clock.clone());
        let ingestion = LearningIngestion::new(transcripts.clone(), ledger.clone(), config.clone());
        AppState {
            memory: zuno_shared::memory::service::MemoryService::new(
                db.clone(),
                config.clone(),
                paths.clone(),
                clock.clone(),
            ),
            paths,
            tokens: TokenStore::new(db.clone(), clock.clone()),
            auth: auth::Auth::new(server_token),
            hosts: guard::HostPolicy::new(&config.server.bind, &config.server.allowed_hosts),
            metrics_auth: server_token.is_some()
                && config
                    .server
                    .metrics_auth
                    .unwrap_or_else(|| !crate::serve::is_loopback(&config.server.bind)),
            live: routes::live::LiveHub::new(db.clone(), config.server.max_streams_per_token),
            dashboard: routes::ui::Dashboard::new(server_token, clock.clone()),
            config,
            db,
            ledger,
            transcripts,
            ingestion,
            metrics,
        }
    }
}

/// The complete application router.
pub fn router(state: AppState) -> Router {
    let limit = state.config.server.body_limit_bytes;
    let (api, _) = openapi::api_router().split_for_parts();
    let api = api.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::authenticate,
    ));
    Router::new()
        .merge(routes::health::router(state.clone()))
        .merge(routes::ui::router())
        .merge(api)
        .fallback(routes::health::not_found)
        .layer(DefaultBodyLimit::max(
            usize::try_from(limit).unwrap_or(usize::MAX),
        ))
        .layer(axum::middleware::from_fn(
            move |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                request.extensions_mut().insert(json::BodyLimit(limit));
                next.run(request).await
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn(guard::problem_errors))
        .layer(
            TraceLayer::new_for_http()
                .on_failure(log_failure)
                .make_span_with(|request: &Request<_>| {
                    let span = tracing::info_span!(
                        "http request",
                        otel.name = %format!("{} {}", request.method(), request.uri().path()),
                        http.method = %request.method(),
                        http.path = %request.uri().path(),
                    );
                    // Continue a caller's trace when it sent one.
                    let parent = request
                        .headers()
                        .get("traceparent")
                        .and_then(|value| value.to_str().ok());
                    zuno_shared::telemetry::continue_trace(&span, parent);
                    span
                }),
        )
        .with_state(state)
}

/// The HTTP layer's log of a failed response. A 503 is already logged where it is answered
/// (once per outage, see `error.rs`); every other server error at ERROR as before.
fn log_failure(
    failure: tower_http::classify::ServerErrorsFailureClass,
    latency: std::time::Duration,
    _span: &tracing::Span,
) {
    use tower_http::classify::ServerErrorsFailureClass;
    match failure {
        ServerErrorsFailureClass::StatusCode(status)
            if status == axum::http::StatusCode::SERVICE_UNAVAILABLE => {}
        failure => tracing::error!(classification = %failure,
            latency_ms = latency.as_millis() as u64, "response failed"),
    }
}
