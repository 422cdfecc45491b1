//! Shared set-up: a model client with injected credentials, configs for one fake provider,
//! and readers of what the fake received.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value;
use zuno_shared::config::{Config, ModelConfig, ProviderApi, ProviderConfig};
use zuno_shared::learning::extraction::output_schema;
use zuno_tests::fake_provider::{FakeProvider, ReceivedRequest};
use zuno_worker_extract::provider::{
    LIMIT_ALIASES, LearningModelClient, LearningRequest, LearningResponse, ProviderFailure,
    ResolvedModel, resolve_model,
};

/// Variable names unique to this suite; their values are injected, never set in the process.
pub(crate) const KEY_VAR: &str = "ZUNO_PROVIDER_SUITE_API_KEY_4F1C";
pub(crate) const KEY_VALUE: &str = "zk-suite-secret-value-0001-abcdef";
pub(crate) const ORG_VAR: &str = "ZUNO_PROVIDER_SUITE_ORG_HEADER_4F1C";
pub(crate) const ORG_VALUE: &str = "org-suite-secret-value-0002";

pub(crate) const VALID: &str = r#"{"experiences": [], "memories": []}"#;
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn client() -> LearningModelClient {
    let env: HashMap<&str, &str> = HashMap::from([(KEY_VAR, KEY_VALUE), (ORG_VAR, ORG_VALUE)]);
    LearningModelClient::new()
        .with_env(move |name| env.get(name).map(|value| (*value).to_owned()))
        .with_retry_delays(Duration::from_millis(5), Duration::from_millis(20), 3)
}

pub(crate) fn request() -> LearningRequest {
    LearningRequest {
        system: String::from("You extract durable lessons. Answer with JSON only."),
        user: String::from("Transcript:\n[user] the build fails\n[assistant] fixed the path"),
        schema_name: String::from("extraction_output"),
        schema: output_schema(),
    }
}

pub(crate) fn provider(api: ProviderApi, base_url: &str) -> ProviderConfig {
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
pub(crate) fn single(api: ProviderApi, base_url: &str, model_config: ModelConfig) -> Config {
    let mut provider = provider(api, base_url);
    provider.models.insert(String::from("m"), model_config);
    let mut config = Config::default();
    config.providers.insert(String::from("p"), provider);
    config
}

/// One `complete_json` call of the suite's request to model `p/m` of `fake`, speaking `api`
/// with the default model settings.
pub(crate) async fn complete(
    fake: &FakeProvider,
    api: ProviderApi,
) -> Result<LearningResponse, ProviderFailure> {
    let config = single(api, fake.base_url(), ModelConfig::default());
    client()
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
}

pub(crate) fn resolved(config: &Config) -> ResolvedModel {
    resolve_model(config, Some("p/m")).expect("model resolves")
}

pub(crate) fn params(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("params must be an object, got {other}"),
    }
}

pub(crate) fn only_request(fake: &FakeProvider) -> ReceivedRequest {
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    requests.into_iter().next().expect("one request")
}

/// The output-limit fields present in a body.
pub(crate) fn limit_fields(body: &Value) -> Vec<(&str, u64)> {
    LIMIT_ALIASES
        .iter()
        .filter_map(|alias| Some((*alias, body.get(*alias)?.as_u64()?)))
        .collect()
}
