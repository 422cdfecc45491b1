//! The HTTP API: ingestion of projects, sessions and messages; admission of extraction jobs when
//! turns close; job inspection; health, readiness, metrics and the OpenAPI document.

pub mod auth;
pub mod error;
pub mod json;
mod openapi;
mod routes;

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
    /// The Prometheus registry rendered at `/metrics` (absent in tests without telemetry).
    pub metrics: Option<prometheus::Registry>,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        db: Db,
        clock: SharedClock,
        paths: zuno_shared::paths::Paths,
        operator_token: Option<&str>,
        metrics: Option<prometheus::Registry>,
    ) -> AppState {
        let ledger = Ledger::new(db.clone(), clock.clone());
        let transcripts = TranscriptStore::new(db.clone(), clock.clone());
        let ingestion = LearningIngestion::new(transcripts.clone(), ledger.clone(), config.clone());
        AppState {
            memory: zuno_shared::memory::service::MemoryService::new(
                db.clone(),
                config.clone(),
                paths,
                clock.clone(),
            ),
            tokens: TokenStore::new(db.clone(), clock),
            auth: auth::Auth::new(operator_token),
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
        .merge(routes::health::router())
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
        .layer(
            TraceLayer::new_for_http().make_span_with(|request: &Request<_>| {
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
