//! Which model a job uses: the configured extractor model, else the active provider's small
//! model; an unconfigured provider is unavailable, never substituted.

use zuno_shared::config::{Config, ProviderApi};
use zuno_worker_extract::provider::{ModelSource, ModelUnavailable, resolve_model};

use crate::harness::*;

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
