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

/// The body as `T`. Every body of this API is a JSON object: an array is refused (serde would
/// read a struct from one). A number written with a zero fraction (`3.0`) is an integer, as JSON
/// Schema's `integer` says, also where `T` wants an integer.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::BadRequest {
            detail: String::from("the body must be a JSON object"),
            field: None,
        });
    }
    match parse_exact(bytes) {
        Err(ApiError::BadRequest { detail, .. }) if detail.contains("floating point") => {
            let mut value: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|error| ApiError::BadRequest {
                    detail: format!("the body is not valid JSON: {error}"),
                    field: None,
                })?;
            integral_floats_as_integers(&mut value);
            parse_exact(&serde_json::to_vec(&value).unwrap_or_default())
        }
        other => other,
    }
}

/// Rewrites every number with a zero fraction that an `f64` holds exactly (|n| ≤ 2^53) as an
/// integer.
fn integral_floats_as_integers(value: &mut serde_json::Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        serde_json::Value::Number(number) => {
            if let Some(float) = number.as_f64().filter(|_| number.is_f64())
                && float.fract() == 0.0
                && float.abs() <= EXACT
            {
                // In range and integral: the conversion is exact.
                *value = serde_json::Value::from(float as i64);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        serde_json::Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

fn parse_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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
