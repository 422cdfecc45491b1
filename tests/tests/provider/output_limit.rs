//! The output-token limit: the smallest applicable one, sent in exactly one field; a provider
//! rejecting it is reported, the limit never silently removed.

use serde_json::{Value, json};
use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::{ProviderError, effective_output_limit};

use crate::harness::*;

#[test]
fn output_limit_is_the_smallest_applicable_limit() {
    let model = |max_output_tokens, max_tokens, params_value: Value| ModelConfig {
        max_output_tokens,
        max_tokens,
        params: params(params_value),
        ..ModelConfig::default()
    };
    // The learning ceiling alone.
    assert_eq!(
        effective_output_limit(4096, &model(None, None, json!({}))),
        4096
    );
    // A smaller declared capacity or request limit wins.
    assert_eq!(
        effective_output_limit(4096, &model(Some(1024), None, json!({}))),
        1024
    );
    assert_eq!(
        effective_output_limit(4096, &model(None, Some(777), json!({}))),
        777
    );
    assert_eq!(
        effective_output_limit(2048, &model(Some(8192), Some(3000), json!({}))),
        2048
    );
    // Raising one limit does not bypass the others.
    assert_eq!(
        effective_output_limit(
            4096,
            &model(Some(100_000), Some(50_000), json!({"max_tokens": 64_000}))
        ),
        4096
    );
    // Several aliases cannot enlarge the bound: the smallest counts.
    assert_eq!(
        effective_output_limit(
            4096,
            &model(
                None,
                None,
                json!({"max_tokens": 3000, "max_completion_tokens": 2500, "max_output_tokens": 8000})
            )
        ),
        2500
    );
    // maxTokens 0 is "no additional limit", never "no ceiling".
    assert_eq!(
        effective_output_limit(4096, &model(Some(8192), Some(0), json!({}))),
        4096
    );
    assert_eq!(
        effective_output_limit(4096, &model(None, None, json!({"max_tokens": 0}))),
        4096
    );
    // A learning ceiling of 0 cannot switch the ceiling off either.
    assert_eq!(
        effective_output_limit(0, &model(None, Some(0), json!({}))),
        4096
    );
}

#[tokio::test]
async fn the_one_limit_field_carries_the_effective_limit() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer(VALID)]);
    let mut config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig {
            max_output_tokens: Some(16_384),
            max_tokens: Some(0),
            params: params(json!({"max_completion_tokens": 8000})),
            ..ModelConfig::default()
        },
    );
    config.learning.execution.max_output_tokens = 1500;
    let model = resolved(&config);
    assert_eq!(model.max_output_tokens, 1500);
    // The configured spelling is kept for chat (reasoning models reject `max_tokens`).
    assert_eq!(model.output_limit_field(), "max_completion_tokens");
    client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("answer");
    let body = only_request(&fake).body;
    assert_eq!(limit_fields(&body), vec![("max_completion_tokens", 1500)]);
}

#[tokio::test]
async fn a_rejected_output_limit_is_reported_not_removed() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::json(
        400,
        json!({"error": {
            "message": "max_tokens is too large: 4096. This model supports at most 1024 completion tokens.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "invalid_value",
        }}),
    )
    .with_header("x-request-id", "req_limit_1")]);
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("rejected");
    assert!(
        matches!(failure.error, ProviderError::OutputLimitRejected(_)),
        "{failure:?}"
    );
    assert!(failure.is_permanent());
    // One request, with the ceiling: no silent retry without it, no other model.
    let sent = only_request(&fake);
    assert_eq!(limit_fields(&sent.body), vec![("max_tokens", 4096)]);
    assert_eq!(sent.body["model"], "m");
}
