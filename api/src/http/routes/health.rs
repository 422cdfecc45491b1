//! Liveness, readiness and metrics, outside `/api`: unauthenticated, except `/metrics` under
//! `server.metrics_auth` (the default when bound off loopback).

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use crate::http::error::ApiError;
use crate::http::state::AppState;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(metrics).route_layer(axum::middleware::from_fn_with_state(
                state,
                crate::http::middleware::metrics_gate,
            )),
        )
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({ "status": "ok" }))
}

/// Ready when the database answers and its schema is the verified one.
async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    state.db.ping().await?;
    let schema = state
        .db
        .check_schema()
        .await
        .map_err(|error| ApiError::Unavailable(error.to_string()))?;
    Ok(axum::Json(json!({
        "status": "ready",
        "backend": state.db.backend().as_str(),
        "schemaVersion": schema.current_version,
    })))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let body = state
        .metrics
        .as_ref()
        .map(zuno_shared::telemetry::render_prometheus)
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no route for `{}`", uri.path()))
}
