//! Request shapes of the three wire formats (OpenAI chat completions, OpenAI responses,
//! Anthropic messages), native schemas, and configured headers.

use serde_json::json;
use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_shared::learning::extraction::output_schema;
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::Usage;

use crate::harness::*;

#[tokio::test]
async fn openai_chat_request_shape_and_answer() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer_with_usage(VALID, 321, 45)]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig {
            supports_sampling: false,
            params: params(json!({
                "temperature": 0.2,
                "top_p": 0.9,
                "seed": 7,
                "reasoning_effort": "low",
                "max_tokens": 1000,
                "stream": true,
                "tools": [{"type": "function"}],
            })),
            ..ModelConfig::default()
        },
    );
    let model = resolved(&config);
    let response = client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("answer");

    assert_eq!(response.value, json!({"experiences": [], "memories": []}));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 321,
            output_tokens: 45
        }
    );
    assert_eq!(response.provider_request_id.as_deref(), Some("req_fake_1"));
    assert_eq!((response.requests, response.repaired), (1, false));

    let sent = only_request(&fake);
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY_VALUE}").as_str())
    );
    assert_eq!(sent.header("x-api-key"), None);
    let body = &sent.body;
    assert_eq!(body["model"], "m");
    assert_eq!(limit_fields(body), vec![("max_tokens", 1000)]);
    // Unsupported sampling parameters are dropped; reasoning controls pass through.
    for dropped in [
        "temperature",
        "top_p",
        "seed",
        "stream",
        "tools",
        "response_format",
    ] {
        assert!(body.get(dropped).is_none(), "{dropped} sent: {body}");
    }
    assert_eq!(body["reasoning_effort"], "low");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": request().system},
            {"role": "user", "content": request().user},
        ])
    );
}

#[tokio::test]
async fn openai_responses_request_shape_with_native_schema() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer(format!("```json\n{VALID}\n```"))]);
    let mut config = single(
        ProviderApi::OpenaiResponses,
        fake.base_url(),
        ModelConfig {
            max_output_tokens: Some(3000),
            supports_sampling: true,
            supports_structured_output: true,
            params: params(json!({
                "temperature": 0.3,
                "reasoning": {"effort": "minimal"},
                "text": {"verbosity": "low"},
                "max_output_tokens": 9000,
                "max_completion_tokens": 2000,
            })),
            ..ModelConfig::default()
        },
    );
    config.learning.execution.structured_output = true;
    let model = resolved(&config);
    assert!(model.native_structured_output);
    let response = client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(response.value["memories"], json!([]));
    assert_eq!(response.provider_request_id.as_deref(), Some("req_fake_1"));

    let sent = only_request(&fake);
    assert_eq!(sent.path, "/v1/responses");
    assert!(sent.header("authorization").is_some());
    let body = &sent.body;
    // min(learning 4096, capacity 3000, aliases 9000 and 2000), under the one Responses field.
    assert_eq!(limit_fields(body), vec![("max_output_tokens", 2000)]);
    // A supported sampling setting is kept as configured.
    assert_eq!(body["temperature"], 0.3);
    assert_eq!(body["reasoning"], json!({"effort": "minimal"}));
    assert_eq!(body["instructions"], request().system.as_str());
    assert_eq!(
        body["input"],
        json!([{"role": "user", "content": request().user}])
    );
    assert_eq!(body["text"]["verbosity"], "low");
    assert_eq!(
        body["text"]["format"],
        json!({
            "type": "json_schema",
            "name": "extraction_output",
            "schema": output_schema(),
            "strict": true,
        })
    );
}

#[tokio::test]
async fn anthropic_messages_request_shape_in_prompt_mode() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer_with_usage(VALID, 14, 65)]);
    let config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig {
            params: params(json!({"thinking": {"type": "disabled"}})),
            ..ModelConfig::default()
        },
    );
    let model = resolved(&config);
    let response = client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(response.usage.total(), 79);
    assert_eq!(response.provider_request_id.as_deref(), Some("req_fake_1"));

    let sent = only_request(&fake);
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY_VALUE));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    let body = &sent.body;
    assert_eq!(limit_fields(body), vec![("max_tokens", 4096)]);
    assert!(body.get("temperature").is_none(), "no temperature added");
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
    assert_eq!(body["thinking"], json!({"type": "disabled"}));
    assert_eq!(body["system"], request().system.as_str());
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": request().user}])
    );
}

#[tokio::test]
async fn anthropic_native_output_is_a_single_forced_tool() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer(VALID)]);
    let mut config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig {
            supports_structured_output: true,
            ..ModelConfig::default()
        },
    );
    config.learning.execution.structured_output = true;
    let response = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(response.value, json!({"experiences": [], "memories": []}));

    let body = only_request(&fake).body;
    let tools = body["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "extraction_output");
    assert_eq!(tools[0]["input_schema"], output_schema());
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "extraction_output"})
    );
}

#[tokio::test]
async fn native_schema_only_when_enabled_and_supported() {
    for (enabled, supported) in [(true, true), (true, false), (false, true), (false, false)] {
        let fake = FakeProvider::start().await;
        fake.push([Reply::answer(VALID)]);
        let mut config = single(
            ProviderApi::OpenaiChat,
            fake.base_url(),
            ModelConfig {
                supports_structured_output: supported,
                params: params(json!({"response_format": {"type": "json_object"}})),
                ..ModelConfig::default()
            },
        );
        config.learning.execution.structured_output = enabled;
        let model = resolved(&config);
        assert_eq!(model.native_structured_output, enabled && supported);
        client()
            .complete_json(&model, &request(), TIMEOUT)
            .await
            .expect("answer");
        let body = only_request(&fake).body;
        if enabled && supported {
            assert_eq!(
                body["response_format"],
                json!({
                    "type": "json_schema",
                    "json_schema": {
                        "name": "extraction_output",
                        "schema": output_schema(),
                        "strict": true,
                    },
                })
            );
        } else {
            assert!(
                body.get("response_format").is_none(),
                "({enabled}, {supported}) sent {body}"
            );
        }
    }
}

#[tokio::test]
async fn configured_headers_reach_the_provider() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer(VALID)]);
    let mut config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    if let Some(provider) = config.providers.get_mut("p") {
        provider
            .header_envs
            .insert(String::from("X-Org-Tag"), ORG_VAR.to_owned());
    }
    client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(only_request(&fake).header("x-org-tag"), Some(ORG_VALUE));
}
