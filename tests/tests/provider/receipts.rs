//! Receipts describe the request (model, contract, limits) without header values.

use serde_json::json;
use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::LearningModelClient;

use crate::harness::*;

#[tokio::test]
async fn receipts_describe_the_request_without_header_values() {
    let fake = FakeProvider::start().await;
    let mut config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig {
            supports_sampling: false,
            params: params(json!({"temperature": 0.7, "reasoning_effort": "low"})),
            ..ModelConfig::default()
        },
    );
    if let Some(provider) = config.providers.get_mut("p") {
        provider
            .header_envs
            .insert(String::from("X-Org-Tag"), ORG_VAR.to_owned());
    }
    let model = resolved(&config);
    let receipt = LearningModelClient::receipt(&model, &request());
    let text = receipt.to_string();
    assert!(
        !text.contains(KEY_VALUE) && !text.contains(ORG_VALUE),
        "{text}"
    );

    assert_eq!(receipt["provider"], "p");
    assert_eq!(receipt["model"], "m");
    assert_eq!(receipt["api"], "openai_chat");
    assert_eq!(receipt["tools"], json!([]));
    assert_eq!(
        receipt["headerNames"],
        json!(["content-type", "authorization", "x-org-tag"])
    );
    assert_eq!(
        receipt["parameters"],
        json!({"model": "m", "reasoning_effort": "low", "max_tokens": 4096})
    );
    assert_eq!(
        receipt["prompt"],
        json!({"system": request().system, "user": request().user})
    );
    let digest = receipt["promptSha256"].as_str().expect("digest");
    assert_eq!(digest.len(), 64);
    assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(
        receipt["responseContract"]["schemaName"],
        "extraction_output"
    );
    assert_eq!(receipt["responseContract"]["mode"], "prompt");

    // Deterministic digest, fresh request id per call, and the digest follows the prompt.
    let again = LearningModelClient::receipt(&model, &request());
    assert_eq!(again["promptSha256"], receipt["promptSha256"]);
    assert_ne!(again["requestId"], receipt["requestId"]);
    let mut other = request();
    other.user.push('!');
    assert_ne!(
        LearningModelClient::receipt(&model, &other)["promptSha256"],
        receipt["promptSha256"]
    );

    // The parameters are exactly what is sent, minus the conversation.
    fake.push([Reply::answer(VALID)]);
    client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("answer");
    let mut sent = only_request(&fake).body;
    if let Some(body) = sent.as_object_mut() {
        body.remove("messages");
    }
    assert_eq!(sent, receipt["parameters"]);
}

#[test]
fn native_anthropic_receipt_names_its_contract() {
    let mut config = single(
        ProviderApi::AnthropicMessages,
        "http://127.0.0.1:9/v1",
        ModelConfig {
            supports_structured_output: true,
            ..ModelConfig::default()
        },
    );
    config.learning.execution.structured_output = true;
    let receipt = LearningModelClient::receipt(&resolved(&config), &request());
    assert_eq!(receipt["responseContract"]["mode"], "native_tool");
    assert_eq!(
        receipt["tools"],
        json!([]),
        "the extractor itself has no tools"
    );
    assert_eq!(
        receipt["headerNames"],
        json!(["content-type", "x-api-key", "anthropic-version"])
    );
    assert!(receipt["parameters"].get("system").is_none());
    assert_eq!(receipt["parameters"]["tool_choice"]["type"], "tool");
}
