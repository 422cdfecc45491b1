//! One error type for every route, rendered once as RFC 9457 problem JSON.
//!
//! 4xx bodies explain what was wrong (and name the field); 5xx bodies are generic and the real
//! error is logged where it is converted.
//!
//! A database outage (the pool timed out, the connection was refused, closed or terminated) is
//! 503 with `Retry-After`, wherever in a route it surfaced: a client that retries 503 gets its
//! write stored once the database is back, instead of dropping it on a 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use zuno_shared::ledger::LedgerError;
use zuno_shared::transcript::TranscriptError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{detail}")]
    BadRequest {
        detail: String,
        field: Option<String>,
    },
    #[error("authentication required")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the request body is larger than the {limit}-byte limit")]
    PayloadTooLarge { limit: u64 },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    TooManyRequests(String),
    /// Any other status, for responses produced outside the routes (a method the path does not
    /// allow, an extractor's own rejection) that must still be problem documents.
    #[error("{detail}")]
    Status { status: StatusCode, detail: String },
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The problem document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the problem type.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// The offending input field, for 400s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    pub fn bad_request(field: impl Into<String>, detail: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            detail: detail.into(),
            field: Some(field.into()),
        }
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::BadRequest { .. } => (StatusCode::BAD_REQUEST, "bad_request", "Bad request"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", "Not found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Payload too large",
            ),
            ApiError::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Unsupported media type",
            ),
            ApiError::TooManyRequests(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                "Too many requests",
            ),
            ApiError::Status { status, .. } => status_parts(*status),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
            ),
        }
    }

    pub fn problem(&self) -> Problem {
        let (status, code, title) = self.parts();
        let detail = match self {
            ApiError::Internal(_) => {
                String::from("the server failed to handle the request; see its log")
            }
            ApiError::Unavailable(_) => {
                String::from("a dependency of the server is unavailable; retry later")
            }
            other => other.to_string(),
        };
        Problem {
            kind: format!("https://zuno.dev/problems/{code}"),
            title,
            status: status.as_u16(),
            detail,
            code,
            field: match self {
                ApiError::BadRequest { field, .. } => field.clone(),
                _ => None,
            },
        }
    }
}

/// Code and title of a status that no dedicated variant covers.
fn status_parts(status: StatusCode) -> (StatusCode, &'static str, &'static str) {
    let code = match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        406 => "not_acceptable",
        408 => "request_timeout",
        409 => "conflict",
        411 => "length_required",
        413 => "payload_too_large",
        414 => "uri_too_long",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        429 => "too_many_requests",
        431 => "headers_too_large",
        500..=599 => "internal",
        _ => "error",
    };
    let title = status.canonical_reason().unwrap_or("Error");
    (status, code, title)
}

/// Seconds a client should wait before retrying a 503: long enough for a pool to reconnect
/// after a database restart, short enough that a hook's turn is not held up for long.
pub const RETRY_AFTER_SECONDS: u64 = 2;

/// True when a store error anywhere in `error`'s chain says the database cannot be reached.
fn is_database_outage(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<zuno_shared::db::StoreError>()
            .is_some_and(zuno_shared::db::StoreError::is_connection)
            || cause
                .downcast_ref::<sqlx::Error>()
                .is_some_and(zuno_shared::db::is_connection_error)
    })
}

impl ApiError {
    /// The error as answered: an internal error caused by a database outage (a domain error
    /// wrapping the store's) is the outage.
    fn classified(self) -> ApiError {
        match self {
            ApiError::Internal(error) if is_database_outage(&error) => {
                ApiError::Unavailable(format!("database unavailable: {error:#}"))
            }
            other => other,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let this = self.classified();
        match &this {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "request failed");
            }
            ApiError::Unavailable(reason) => outage_log::answered_503(reason),
            _ => {}
        }
        let problem = this.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(problem)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match this {
            ApiError::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Unavailable(_) => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            _ => {}
        }
        response
    }
}

impl From<TranscriptError> for ApiError {
    fn from(error: TranscriptError) -> ApiError {
        match error {
            TranscriptError::NotFound { what, id } => {
                ApiError::NotFound(format!("{what} `{id}` was not found"))
            }
            TranscriptError::Conflict(detail) => ApiError::Conflict(detail),
            TranscriptError::Invalid { field, reason } => ApiError::BadRequest {
                detail: format!("invalid `{field}`: {reason}"),
                field: Some(field),
            },
            TranscriptError::WorktreeClaimed { .. } => ApiError::BadRequest {
                detail: error.to_string(),
                field: Some(String::from("worktree")),
            },
            TranscriptError::Store(store) => store_error(store),
        }
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> ApiError {
        match error {
            LedgerError::NotFound(id) => ApiError::NotFound(format!("job `{id}` was not found")),
            LedgerError::Invalid(detail) => ApiError::BadRequest {
                detail,
                field: None,
            },
            LedgerError::LeaseLost { job_id } => {
                ApiError::Conflict(format!("the lease on job `{job_id}` was lost"))
            }
            LedgerError::Store(store) => store_error(store),
        }
    }
}

impl From<zuno_shared::db::StoreError> for ApiError {
    fn from(error: zuno_shared::db::StoreError) -> ApiError {
        store_error(error)
    }
}

fn store_error(error: zuno_shared::db::StoreError) -> ApiError {
    if error.is_connection() {
        return ApiError::Unavailable(format!("database unavailable: {error}"));
    }
    if let Some(message) = error.constraint_violation() {
        return ApiError::Conflict(format!("the request conflicts with stored data: {message}"));
    }
    ApiError::Internal(error.into())
}

pub type ApiResult<T> = Result<T, ApiError>;

/// 503s are logged once per outage: the first at WARN, then a WARN reminder a minute at most
/// with how many requests were answered 503 since; each one at DEBUG. An outage of a few
/// seconds under load otherwise logs hundreds of identical lines.
mod outage_log {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// A 503 this long after the previous one starts a new episode.
    const EPISODE_GAP: Duration = Duration::from_secs(30);
    const REMINDER: Duration = Duration::from_secs(60);

    struct Episode {
        started: Instant,
        last: Instant,
        reported: Instant,
        answered: u64,
    }

    static EPISODE: Mutex<Option<Episode>> = Mutex::new(None);

    pub(super) fn answered_503(reason: &str) {
        let now = Instant::now();
        let mut episode = EPISODE.lock().unwrap_or_else(|e| e.into_inner());
        match episode.as_mut() {
            Some(current) if now.duration_since(current.last) < EPISODE_GAP => {
                current.last = now;
                current.answered += 1;
                if now.duration_since(current.reported) >= REMINDER {
                    current.reported = now;
                    tracing::warn!(%reason, answered_503 = current.answered,
                        outage_ms = now.duration_since(current.started).as_millis() as u64,
                        "dependency still unavailable; answering 503 with Retry-After");
                } else {
                    tracing::debug!(%reason, "dependency unavailable; answered 503");
                }
            }
            _ => {
                *episode = Some(Episode {
                    started: now,
                    last: now,
                    reported: now,
                    answered: 1,
                });
                tracing::warn!(%reason,
                    "dependency unavailable; answering 503 with Retry-After \
                     (further 503s of this outage at DEBUG, a reminder a minute)");
            }
        }
    }
}
