//! The learning model client against the in-process fake provider: request shapes of the
//! three wire formats, model resolution, output limits, the one repair, typed failures from
//! recorded provider responses, Retry-After, the deadline, and receipts.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use zuno_shared::config::{Config, ModelConfig, ProviderApi, ProviderConfig};
use zuno_shared::learning::extraction::{ExtractionOutput, output_schema};
use zuno_tests::fake_provider::{FakeProvider, ReceivedRequest, Reply};
use zuno_worker_extract::provider::{
    LIMIT_ALIASES, LearningModelClient, LearningRequest, ModelSource, ModelUnavailable,
    ProviderError, ResolvedModel, Usage, effective_output_limit, parse_retry_after, resolve_model,
};

/// Variable names unique to this suite; their values are injected, never set in the process.
const KEY_VAR: &str = "ZUNO_PROVIDER_SUITE_API_KEY_4F1C";
const KEY_VALUE: &str = "zk-suite-secret-value-0001-abcdef";
const ORG_VAR: &str = "ZUNO_PROVIDER_SUITE_ORG_HEADER_4F1C";
const ORG_VALUE: &str = "org-suite-secret-value-0002";

const VALID: &str = r#"{"experiences": [], "memories": []}"#;
const TIMEOUT: Duration = Duration::from_secs(10);

fn client() -> LearningModelClient {
    let env: HashMap<&str, &str> = HashMap::from([(KEY_VAR, KEY_VALUE), (ORG_VAR, ORG_VALUE)]);
    LearningModelClient::new()
        .with_env(move |name| env.get(name).map(|value| (*value).to_owned()))
        .with_retry_delays(Duration::from_millis(5), Duration::from_millis(20), 3)
}

fn request() -> LearningRequest {
    LearningRequest {
        system: String::from("You extract durable lessons. Answer with JSON only."),
        user: String::from("Transcript:\n[user] the build fails\n[assistant] fixed the path"),
        schema_name: String::from("extraction_output"),
        schema: output_schema(),
    }
}

fn provider(api: ProviderApi, base_url: &str) -> ProviderConfig {
    ProviderConfig {
        api,
        base_url: base_url.to_owned(),
        api_key_env: Some(KEY_VAR.to_owned()),
        header_envs: BTreeMap::new(),
        small_model: None,
        models: BTreeMap::new(),
    }
}

/// A config with one provider `p` serving model `m` with `model_config`.
fn single(api: ProviderApi, base_url: &str, model_config: ModelConfig) -> Config {
    let mut provider = provider(api, base_url);
    provider.models.insert(String::from("m"), model_config);
    let mut config = Config::default();
    config.providers.insert(String::from("p"), provider);
    config
}

fn resolved(config: &Config) -> ResolvedModel {
    resolve_model(config, Some("p/m")).expect("model resolves")
}

fn params(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("params must be an object, got {other}"),
    }
}

fn only_request(fake: &FakeProvider) -> ReceivedRequest {
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    requests.into_iter().next().expect("one request")
}

/// The output-limit fields present in a body.
fn limit_fields(body: &Value) -> Vec<(&str, u64)> {
    LIMIT_ALIASES
        .iter()
        .filter_map(|alias| Some((*alias, body.get(*alias)?.as_u64()?)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Wire formats

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

// ---------------------------------------------------------------------------------------------
// Model resolution

fn two_providers() -> Config {
    let mut config = Config::default();
    let mut openai = provider(ProviderApi::OpenaiChat, "http://127.0.0.1:9/v1");
    openai.small_model = Some(String::from("gpt-small"));
    let anthropic = provider(ProviderApi::AnthropicMessages, "http://127.0.0.1:9/v1");
    config.providers.insert(String::from("openai"), openai);
    config
        .providers
        .insert(String::from("anthropic"), anthropic);
    config
}

fn pick(
    config: &Config,
    session: Option<&str>,
) -> Result<(String, String, ModelSource), ModelUnavailable> {
    resolve_model(config, session).map(|m| (m.provider, m.model, m.source))
}

fn found(
    provider: &str,
    model: &str,
    source: ModelSource,
) -> Result<(String, String, ModelSource), ModelUnavailable> {
    Ok((provider.to_owned(), model.to_owned(), source))
}

#[test]
fn extractor_model_is_authoritative() {
    let mut config = two_providers();
    config.learning.extractor_model = Some(String::from("anthropic/claude-haiku"));
    assert_eq!(
        pick(&config, Some("openai/gpt-big")),
        found("anthropic", "claude-haiku", ModelSource::ExtractorModel)
    );
    assert_eq!(
        pick(&config, None),
        found("anthropic", "claude-haiku", ModelSource::ExtractorModel)
    );
}

#[test]
fn small_model_of_the_active_provider_beats_the_session_model() {
    let config = two_providers();
    assert_eq!(
        pick(&config, Some("openai/gpt-big")),
        found("openai", "gpt-small", ModelSource::SmallModel)
    );
    // The session's provider is active; another provider's small model is not borrowed.
    assert_eq!(
        pick(&config, Some("anthropic/claude-big")),
        found("anthropic", "claude-big", ModelSource::SessionModel)
    );
}

#[test]
fn without_a_session_model_only_a_single_provider_is_active() {
    let config = two_providers();
    assert_eq!(pick(&config, None), Err(ModelUnavailable::NoModel));
    let mut single = Config::default();
    let mut only = provider(ProviderApi::OpenaiChat, "http://127.0.0.1:9/v1");
    only.small_model = Some(String::from("mini"));
    single.providers.insert(String::from("solo"), only);
    assert_eq!(
        pick(&single, None),
        found("solo", "mini", ModelSource::SmallModel)
    );
    assert_eq!(
        pick(&Config::default(), None),
        Err(ModelUnavailable::NoModel)
    );
}

#[test]
fn an_unconfigured_provider_is_unavailable_never_substituted() {
    let mut config = two_providers();
    assert_eq!(
        pick(&config, Some("mistral/large")),
        Err(ModelUnavailable::ProviderNotConfigured {
            provider: String::from("mistral"),
            model: String::from("large"),
        })
    );
    config.learning.extractor_model = Some(String::from("mistral/small"));
    assert_eq!(
        pick(&config, Some("openai/gpt-big")),
        Err(ModelUnavailable::ProviderNotConfigured {
            provider: String::from("mistral"),
            model: String::from("small"),
        })
    );
    assert_eq!(
        pick(&two_providers(), Some("gpt-4o")),
        Err(ModelUnavailable::Malformed {
            value: String::from("gpt-4o")
        })
    );
}

#[test]
fn model_names_may_contain_slashes() {
    let mut config = Config::default();
    config.providers.insert(
        String::from("openrouter"),
        provider(ProviderApi::OpenaiChat, "http://127.0.0.1:9/api/v1/"),
    );
    let model = resolve_model(&config, Some("openrouter/google/gemini-2.0-flash-exp:free"))
        .expect("resolves");
    assert_eq!(model.provider, "openrouter");
    assert_eq!(model.model, "google/gemini-2.0-flash-exp:free");
    assert_eq!(model.base_url, "http://127.0.0.1:9/api/v1");
}

// ---------------------------------------------------------------------------------------------
// Output limit

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
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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

// ---------------------------------------------------------------------------------------------
// Repair

#[tokio::test]
async fn a_malformed_answer_is_repaired_once() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::answer_with_usage("Sure! Here is the data: {\"experiences\": [", 100, 20),
        Reply::answer_with_usage(VALID, 150, 30),
    ]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let response = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect("repaired answer");
    assert!(response.repaired);
    assert_eq!(response.requests, 2);
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 250,
            output_tokens: 50
        }
    );
    assert_eq!(response.provider_request_id.as_deref(), Some("req_fake_2"));
    assert_eq!(response.raw_text, VALID);

    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4, "{messages:#?}");
    assert_eq!(
        &messages[..2],
        &requests[0].body["messages"].as_array().expect("first")[..]
    );
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(
        messages[2]["content"],
        "Sure! Here is the data: {\"experiences\": ["
    );
    assert_eq!(messages[3]["role"], "user");
    let instruction = messages[3]["content"].as_str().expect("instruction");
    assert!(instruction.contains("JSON"), "{instruction}");
    // The repair keeps the request parameters.
    assert_eq!(
        requests[1].body["max_tokens"],
        requests[0].body["max_tokens"]
    );
}

#[tokio::test]
async fn a_wrong_top_level_shape_or_a_failed_validator_triggers_the_repair() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::answer(r#"{"experiences": []}"#),
        Reply::answer(VALID),
    ]);
    let config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig::default(),
    );
    let model = resolved(&config);
    let response = client()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect("repaired");
    assert!(response.repaired);
    let repair = &fake.requests()[1].body["messages"];
    assert!(
        repair[1]["content"] == r#"{"experiences": []}"#
            && repair[2]["content"]
                .as_str()
                .is_some_and(|text| text.contains("memories")),
        "{repair:#}"
    );

    // The caller's type check counts as malformed too.
    let bad_kind = r#"{"experiences": [{"kind": "gossip", "title": "t", "summary": "s", "resolution": null, "citations": [], "confidence": 0.5}], "memories": []}"#;
    fake.push([Reply::answer(bad_kind), Reply::answer(VALID)]);
    let response = client()
        .complete_validated(&model, &request(), TIMEOUT, |value| {
            serde_json::from_value::<ExtractionOutput>(value.clone())
                .map(drop)
                .map_err(|error| error.to_string())
        })
        .await
        .expect("repaired");
    assert!(response.repaired);
    assert_eq!(fake.requests().len(), 4);
}

#[tokio::test]
async fn two_malformed_answers_are_a_typed_failure() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::answer_with_usage("no JSON here", 100, 20),
        Reply::answer_with_usage("still no JSON", 130, 25),
    ]);
    let config = single(
        ProviderApi::OpenaiResponses,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("malformed twice");
    assert!(
        matches!(failure.error, ProviderError::MalformedAnswer { .. }),
        "{failure:?}"
    );
    assert!(failure.is_permanent());
    assert_eq!(failure.requests, 2);
    assert_eq!(
        failure.usage,
        Usage {
            input_tokens: 230,
            output_tokens: 45
        }
    );
    assert_eq!(fake.remaining(), 0);
    assert_eq!(fake.requests().len(), 2, "exactly one repair");
}

// ---------------------------------------------------------------------------------------------
// Failures replayed from recorded provider responses

#[tokio::test]
async fn openai_400_is_permanent_with_status_code_and_request_id() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::cassette_response("openai-chat/error_400_unsupported_value.yaml", 0)
            .with_header("x-request-id", "req_openai_400"),
    ]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("400");
    assert_eq!(
        failure.error.diagnostic().and_then(|d| d.code.as_deref()),
        Some("tool_use_failed")
    );
    assert!(failure.is_permanent());

    // A 200 that is not the API's envelope (a misconfigured base URL) is not retried.
    fake.push(Reply::cassette("openai-chat/plain_text_response.yaml"));
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
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

// ---------------------------------------------------------------------------------------------
// Rate limits, retries, deadline

#[test]
fn retry_after_parser() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_450); // 07:27:30 GMT
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    };
    let parse = |pairs: &[(&'static str, &'static str)], text: &str| {
        parse_retry_after(&headers(pairs), text, now)
    };
    assert_eq!(
        parse(&[("retry-after", "55")], ""),
        Some(Duration::from_secs(55))
    );
    assert_eq!(
        parse(&[("retry-after", "1.5")], ""),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        parse(&[("retry-after-ms", "250")], ""),
        Some(Duration::from_millis(250))
    );
    // The millisecond header wins over the seconds header.
    assert_eq!(
        parse(&[("retry-after", "9"), ("retry-after-ms", "120")], ""),
        Some(Duration::from_millis(120))
    );
    assert_eq!(
        parse(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")], ""),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse(&[("retry-after", "Wed, 21 Oct 2015 07:00:00 GMT")], ""),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    let message = "Rate limit reached for gpt-4o in organization XXX on tokens per min (TPM): \
                   Limit 30000, Used 14567, Requested 24754. Please try again in 18.642s.";
    assert_eq!(parse(&[], message), Some(Duration::from_millis(18_642)));
    assert_eq!(
        parse(&[], "Please try again in 174ms."),
        Some(Duration::from_millis(174))
    );
    // A header beats the text; garbage is no hint at all.
    assert_eq!(
        parse(&[("retry-after", "2")], message),
        Some(Duration::from_secs(2))
    );
    assert_eq!(parse(&[("retry-after", "soon")], "slow down"), None);
    assert_eq!(parse(&[], ""), None);
}

fn http_date_in(seconds: u64) -> String {
    let at = time::OffsetDateTime::now_utc() + Duration::from_secs(seconds);
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    at.format(&format).expect("format HTTP-date")
}

/// A 429 whose wait does not fit in the deadline is returned at once, with the wait.
async fn rate_limited_by(reply: Reply) -> (ProviderError, u32) {
    let fake = FakeProvider::start().await;
    fake.push([reply]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), Duration::from_secs(5))
        .await
        .expect_err("429");
    assert!(!failure.is_permanent());
    assert_eq!(
        fake.requests().len(),
        1,
        "a wait past the deadline is not taken"
    );
    (failure.error, failure.requests)
}

fn rate_limit_body(message: &str) -> Value {
    json!({"error": {"message": message, "type": "tokens", "code": "rate_limit_exceeded"}})
}

#[tokio::test]
async fn a_429_reports_its_wait_from_header_or_text() {
    let started = SystemTime::now();
    let (error, requests) = rate_limited_by(
        Reply::json(429, rate_limit_body("Rate limit reached")).with_header("retry-after", "60"),
    )
    .await;
    assert_eq!(requests, 1);
    let ProviderError::RateLimited {
        retry_after,
        retry_at,
        diagnostic,
    } = &error
    else {
        panic!("expected RateLimited, got {error:?}");
    };
    assert_eq!(*retry_after, Some(Duration::from_secs(60)));
    assert!(retry_at.is_some_and(|at| at >= started + Duration::from_secs(60)));
    assert_eq!(diagnostic.code.as_deref(), Some("rate_limit_exceeded"));

    let (error, _) = rate_limited_by(
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "90000"),
    )
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_secs(90)));

    let (error, _) = rate_limited_by(
        Reply::json(429, rate_limit_body("slow down"))
            .with_header("retry-after", &http_date_in(120)),
    )
    .await;
    let wait = error.retry_after().expect("HTTP-date wait");
    assert!(
        wait > Duration::from_secs(100) && wait <= Duration::from_secs(120),
        "{wait:?}"
    );

    let (error, _) = rate_limited_by(Reply::json(
        429,
        rate_limit_body(
            "Rate limit reached for gpt-4o in organization XXX on tokens per min (TPM): \
             Limit 30000, Used 14567, Requested 24754. Please try again in 18.642s.",
        ),
    ))
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_millis(18_642)));
}

#[tokio::test]
async fn a_429_is_retried_when_its_wait_fits_the_deadline() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::json(429, rate_limit_body("Please try again in 30ms.")),
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "20"),
        Reply::answer(VALID),
    ]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let response = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect("answer after rate limits");
    assert_eq!(response.requests, 3);
    assert!(!response.repaired);
    assert_eq!(fake.remaining(), 0);
}

#[tokio::test]
async fn a_retry_after_does_not_extend_the_retry_budget() {
    let fake = FakeProvider::start().await;
    fake.push((0..6).map(|_| {
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "1")
    }));
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    // The suite's client allows 3 retries.
    let failure = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("rate limited");
    assert!(
        matches!(failure.error, ProviderError::RateLimited { .. }),
        "{failure:?}"
    );
    assert_eq!(failure.requests, 4);
    assert_eq!(fake.remaining(), 2);
}

#[tokio::test]
async fn transient_failures_are_retried_then_succeed() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        Reply::json(
            500,
            json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        ),
        Reply::answer_with_usage(VALID, 10, 5),
    ]);
    let config = single(
        ProviderApi::AnthropicMessages,
        fake.base_url(),
        ModelConfig::default(),
    );
    let response = client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect("answer after transient failures");
    assert_eq!(response.requests, 3);
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 10,
            output_tokens: 5
        }
    );
}

#[tokio::test]
async fn openrouter_429s_exhaust_the_retries_as_a_rate_limit() {
    let fake = FakeProvider::start().await;
    let recorded = Reply::cassette("openai-compatible-other/openrouter_error_429.yaml");
    assert_eq!(recorded.len(), 3);
    fake.push(recorded);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let client = client().with_retry_delays(Duration::from_millis(5), Duration::from_millis(10), 2);
    let failure = client
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("rate limited");
    let ProviderError::RateLimited { diagnostic, .. } = &failure.error else {
        panic!("expected RateLimited, got {failure:?}");
    };
    assert_eq!(failure.requests, 3);
    assert_eq!(diagnostic.code.as_deref(), Some("429"));
    assert!(
        diagnostic
            .message
            .contains("temporarily rate-limited upstream"),
        "{diagnostic}"
    );
    assert!(!failure.is_permanent());
}

#[tokio::test]
async fn openrouter_metadata_headers_give_the_wait() {
    let (error, _) = rate_limited_by(Reply::json(
        429,
        json!({"error": {
            "code": 429,
            "message": "Rate limit exceeded: free-models-per-min.",
            "metadata": {"headers": {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "Retry-After": "45"}},
        }}),
    ))
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_secs(45)));
}

#[tokio::test]
async fn a_hang_past_the_deadline_is_a_timeout() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::hang()]);
    let config = single(
        ProviderApi::OpenaiResponses,
        fake.base_url(),
        ModelConfig::default(),
    );
    let deadline = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let failure = client()
        .complete_json(&resolved(&config), &request(), deadline)
        .await
        .expect_err("timeout");
    let elapsed = started.elapsed();
    assert_eq!(failure.error, ProviderError::Timeout { deadline });
    assert!(!failure.is_permanent());
    assert_eq!(failure.requests, 1);
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn the_repair_shares_the_deadline() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer("not json"), Reply::hang()]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let deadline = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let failure = client()
        .complete_json(&resolved(&config), &request(), deadline)
        .await
        .expect_err("timeout");
    assert_eq!(failure.error, ProviderError::Timeout { deadline });
    assert_eq!(failure.requests, 2);
    assert_eq!(
        failure.usage.input_tokens, 100,
        "the first answer's tokens still count"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

// ---------------------------------------------------------------------------------------------
// Receipts

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
