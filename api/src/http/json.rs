//! A JSON body extractor whose rejections are problem documents naming the offending field.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Like `axum::Json`, but every rejection is an [`ApiError`]: 415 unless the body is sent as
/// `application/json`, 413 over the body limit, 400 with the JSON path of the first bad field
/// otherwise.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !super::guard::is_json(request.headers().get(axum::http::header::CONTENT_TYPE)) {
            return Err(ApiError::UnsupportedMediaType(String::from(
                "this route takes a JSON body sent as `Content-Type: application/json`",
            )));
        }
        let limit = request
            .extensions()
            .get::<BodyLimit>()
            .map_or(u64::MAX, |limit| limit.0);
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge { limit }
                } else {
                    ApiError::BadRequest {
                        detail: format!("cannot read the request body: {rejection}"),
                        field: None,
                    }
                }
            })?;
        parse(&bytes).map(ApiJson)
    }
}

/// The configured body limit, attached to each request so rejections can name it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub u64);

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::BadRequest {
                detail: format!("the body is not valid JSON: {inner}"),
                field: None,
            }
        } else {
            let field = (path != ".").then_some(path);
            ApiError::BadRequest {
                detail: match &field {
                    Some(field) => format!("invalid `{field}`: {inner}"),
                    None => format!("invalid body: {inner}"),
                },
                field,
            }
        }
    })?;
    deserializer.end().map_err(|error| ApiError::BadRequest {
        detail: format!("unexpected data after the JSON body: {error}"),
        field: None,
    })?;
    Ok(value)
}
