//! One repair request for a malformed or invalid answer, then a typed failure.

use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_shared::learning::extraction::ExtractionOutput;
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::{ProviderError, Usage};

use crate::harness::*;

#[tokio::test]
async fn a_malformed_answer_is_repaired_once() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::answer_with_usage("Sure! Here is the data: {\"experiences\": [", 100, 20),
        Reply::answer_with_usage(VALID, 150, 30),
    ]);
    let response = complete(&fake, ProviderApi::OpenaiChat)
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
    let failure = complete(&fake, ProviderApi::OpenaiResponses)
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
