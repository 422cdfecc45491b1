//! Typed failures replayed from recorded provider error responses; diagnostics never carry
//! the key.

use serde_json::json;
use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::ProviderError;

use crate::harness::*;

#[tokio::test]
async fn openai_400_is_permanent_with_status_code_and_request_id() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::cassette_response("openai-chat/error_400_unsupported_value.yaml", 0)
            .with_header("x-request-id", "req_openai_400"),
    ]);
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("400");
    let ProviderError::BadRequest(diagnostic) = &failure.error else {
        panic!("expected BadRequest, got {failure:?}");
    };
    assert!(failure.is_permanent() && failure.retry_after().is_none());
    assert_eq!(diagnostic.status, Some(400));
    assert_eq!(diagnostic.code.as_deref(), Some("unsupported_value"));
    assert_eq!(diagnostic.request_id.as_deref(), Some("req_openai_400"));
    assert!(
        diagnostic.message.contains("does not support 'system'"),
        "{diagnostic}"
    );
    assert_eq!(failure.requests, 1, "a permanent failure is not retried");
    assert_eq!(
        failure.provider_request_id.as_deref(),
        Some("req_openai_400")
    );
}

#[tokio::test]
async fn openai_400_without_code_reports_its_type() {
    let fake = FakeProvider::start().await;
    fake.push(Reply::cassette("openai-chat/error_400_code_null.yaml"));
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("400");
    let diagnostic = failure.error.diagnostic().expect("diagnostic");
    assert!(matches!(failure.error, ProviderError::BadRequest(_)));
    assert_eq!(diagnostic.code.as_deref(), Some("invalid_request_error"));
    assert_eq!(diagnostic.request_id, None, "the recording carries none");
}

#[tokio::test]
async fn anthropic_400_is_permanent_with_the_body_request_id() {
    let fake = FakeProvider::start().await;
    fake.push(Reply::cassette(
        "anthropic-messages/error_400_invalid_request.yaml",
    ));
    let failure = complete(&fake, ProviderApi::AnthropicMessages)
        .await
        .expect_err("400");
    let ProviderError::BadRequest(diagnostic) = &failure.error else {
        panic!("expected BadRequest, got {failure:?}");
    };
    assert!(failure.is_permanent());
    assert_eq!(diagnostic.status, Some(400));
    assert_eq!(diagnostic.code.as_deref(), Some("invalid_request_error"));
    assert_eq!(
        diagnostic.request_id.as_deref(),
        Some("req_011Ca7jT9AHpgXgdv8igm4z9")
    );
    assert!(diagnostic.message.contains("effort level"), "{diagnostic}");
}

#[tokio::test]
async fn anthropic_404_is_a_permanent_unavailable_model() {
    let fake = FakeProvider::start().await;
    fake.push(Reply::cassette(
        "anthropic-messages/error_404_not_found.yaml",
    ));
    let failure = complete(&fake, ProviderApi::AnthropicMessages)
        .await
        .expect_err("404");
    let ProviderError::ModelUnavailable(diagnostic) = &failure.error else {
        panic!("expected ModelUnavailable, got {failure:?}");
    };
    assert!(failure.is_permanent());
    assert_eq!(diagnostic.status, Some(404));
    assert_eq!(diagnostic.code.as_deref(), Some("not_found_error"));
    assert_eq!(
        diagnostic.request_id.as_deref(),
        Some("req_011CVEA3SF7rnb3DuBZytqQa")
    );
    assert_eq!(failure.requests, 1);
}

#[tokio::test]
async fn a_model_not_found_code_is_an_unavailable_model_whatever_the_status() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::json(
        400,
        json!({"error": {"message": "The model `m` does not exist", "type": "invalid_request_error", "code": "model_not_found"}}),
    )]);
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("unknown model");
    assert!(
        matches!(failure.error, ProviderError::ModelUnavailable(_)),
        "{failure:?}"
    );
}

#[tokio::test]
async fn a_groq_tool_validation_400_and_a_plain_text_200_are_permanent() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::cassette_response(
        "openai-compatible-other/groq_400_tool_use_failed_then_ok.yaml",
        0,
    )]);
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("400");
    assert_eq!(
        failure.error.diagnostic().and_then(|d| d.code.as_deref()),
        Some("tool_use_failed")
    );
    assert!(failure.is_permanent());

    // A 200 that is not the API's envelope (a misconfigured base URL) is not retried.
    fake.push(Reply::cassette("openai-chat/plain_text_response.yaml"));
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("not an envelope");
    assert!(
        matches!(failure.error, ProviderError::InvalidResponse(_)),
        "{failure:?}"
    );
    assert!(failure.is_permanent());
    assert_eq!(failure.requests, 1);
}

#[tokio::test]
async fn a_401_is_permanent_and_its_diagnostic_redacts_the_key() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::json(
        401,
        json!({"error": {
            "message": format!("Incorrect API key provided: {KEY_VALUE}. Also seen: sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234."),
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }}),
    )]);
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("401");
    let ProviderError::Auth(diagnostic) = &failure.error else {
        panic!("expected Auth, got {failure:?}");
    };
    assert!(failure.is_permanent());
    assert_eq!(diagnostic.code.as_deref(), Some("invalid_api_key"));
    let shown = format!("{failure} {failure:?}");
    assert!(!shown.contains(KEY_VALUE), "{shown}");
    assert!(!shown.contains("AbCdEfGhIjKlMnOpQrStUvWx1234"), "{shown}");
    assert!(diagnostic.message.contains("[REDACTED"), "{diagnostic}");
    assert!(diagnostic.message.chars().count() <= 501);
}

#[tokio::test]
async fn a_missing_credential_names_the_variable_and_sends_nothing() {
    let fake = FakeProvider::start().await;
    let mut config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    if let Some(provider) = config.providers.get_mut("p") {
        provider.api_key_env = Some(String::from("ZUNO_PROVIDER_SUITE_UNSET_VAR_4F1C"));
    }
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("missing key");
    assert_eq!(
        failure.error,
        ProviderError::MissingCredential {
            variable: String::from("ZUNO_PROVIDER_SUITE_UNSET_VAR_4F1C")
        }
    );
    assert!(failure.is_permanent());
    assert_eq!(failure.requests, 0);
    assert!(fake.requests().is_empty());
}
