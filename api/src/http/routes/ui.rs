//! The dashboard: one static page and its script (vanilla JavaScript, embedded at build time)
//! that read and act through the public `/api` routes with the caller's token. The page itself
//! holds no data, so it is served without authentication.
//!
//! Signing in: the server prints a one-time link (`/ui#code=…`) at start. The page exchanges the
//! code once, at `POST /ui/token`, for the server's token and keeps it in the tab's session
//! storage; a used code is gone, so a link seen later in a log or a shell history is worthless.
//! Without a link the page asks for a token.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::json::ApiJson;

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");

/// The page runs only its own script file; styles are inline in the page.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The one-time sign-in of the dashboard.
#[derive(Clone)]
pub struct Dashboard {
    inner: Arc<DashboardInner>,
}

struct DashboardInner {
    token: Option<String>,
    code: Mutex<Option<String>>,
}

impl Dashboard {
    pub fn new(server_token: Option<&str>) -> Dashboard {
        Dashboard {
            inner: Arc::new(DashboardInner {
                token: server_token.map(str::to_owned),
                code: Mutex::new(None),
            }),
        }
    }

    /// A new one-time sign-in code (replacing any unused one), when the server has a token.
    pub fn new_code(&self) -> Option<String> {
        self.inner.token.as_ref()?;
        let code =
            uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
        *self
            .inner
            .code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(code.clone());
        Some(code)
    }

    /// The token for `code`, once.
    fn redeem(&self, code: &str) -> Option<String> {
        let mut stored = self
            .inner
            .code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let matches = stored.as_ref().is_some_and(|expected| {
            expected.len() == code.len()
                && expected
                    .bytes()
                    .zip(code.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        });
        if !matches {
            return None;
        }
        *stored = None;
        self.inner.token.clone()
    }
}

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
            "this sign-in code is unknown or was already used",
        ))),
    }
}
