//! One error type for every route, rendered once as RFC 9457 problem JSON.
//!
//! 4xx bodies explain what was wrong (and name the field); 5xx bodies are generic and the real
//! error is logged where it is converted.

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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "request failed");
            }
            ApiError::Unavailable(reason) => tracing::warn!(%reason, "dependency unavailable"),
            _ => {}
        }
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(problem)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if matches!(self, ApiError::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
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
        return ApiError::Unavailable(error.to_string());
    }
    if let Some(message) = error.constraint_violation() {
        return ApiError::Conflict(format!("the request conflicts with stored data: {message}"));
    }
    ApiError::Internal(error.into())
}

pub type ApiResult<T> = Result<T, ApiError>;
