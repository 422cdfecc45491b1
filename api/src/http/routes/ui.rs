//! The dashboard: one static page and its script (vanilla JavaScript, embedded at build time)
//! that read and act through the public `/api` routes with the caller's token. The page itself
//! holds no data, so it is served without authentication.
//!
//! Signing in: the server prints a one-time link (`/ui#code=…`) at start. The page exchanges the
//! code once, at `POST /ui/token`, for the server's token and keeps it in the tab's session
//! storage; a used code is gone, so a link seen later in a log or a shell history is worthless.
//! An unused code expires ten minutes after it was issued (`http/dashboard.rs`), for the same
//! reason.
//! Without a link the page asks for a token.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::http::state::AppState;

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");

/// The page runs only its own script file; styles are inline in the page.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(page))
        .route("/ui/app.js", get(script))
        .route("/ui/token", post(redeem))
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
}

async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        SCRIPT,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Redeem {
    code: String,
}

async fn redeem(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Redeem>,
) -> Result<impl IntoResponse, ApiError> {
    match state.dashboard.redeem(&body.code) {
        Some(token) => Ok((
            [(header::CACHE_CONTROL, "no-store")],
            axum::Json(serde_json::json!({ "token": token })),
        )),
        None => Err(ApiError::Forbidden(String::from(
            "this sign-in code is unknown, expired or was already used",
        ))),
    }
}
