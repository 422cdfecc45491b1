//! The complete application router: the routes and every layer around them.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use tower_http::trace::TraceLayer;

use super::guard::problem_errors;
use super::json::BodyLimit;
use super::middleware;
use super::openapi::api_router;
use super::routes::{health, ui};
use super::state::AppState;

/// The complete application router.
pub fn router(state: AppState) -> Router {
    let limit = state.config.server.body_limit_bytes;
    let (api, _) = api_router().split_for_parts();
    let api = api.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        middleware::authenticate,
    ));
    Router::new()
        .merge(health::router(state.clone()))
        .merge(ui::router())
        .merge(api)
        .fallback(health::not_found)
        .layer(DefaultBodyLimit::max(
            usize::try_from(limit).unwrap_or(usize::MAX),
        ))
        .layer(axum::middleware::from_fn(
            move |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                request.extensions_mut().insert(BodyLimit(limit));
                next.run(request).await
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard,
        ))
        .layer(axum::middleware::from_fn(problem_errors))
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
