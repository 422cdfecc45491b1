//! Which provider and model learning calls, and with which request parameters.

use crate::config::{Config, ModelConfig, ProviderApi, ProviderConfig};
use serde_json::{Map, Value};

/// Sampling parameters a model may not accept. Learning never adds any of them; configured ones
/// are kept only when the model declares `supports_sampling`.
pub const SAMPLING_PARAMS: [&str; 6] = [
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "seed",
];

/// Every spelling of an output-token limit a configuration may carry in `params`. Each one
/// lowers the bound; none survives into the body except the single field the API expects.
pub const LIMIT_ALIASES: [&str; 5] = [
    "max_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "maxTokens",
    "maxOutputTokens",
];

/// Body fields the client owns: the conversation, the response contract and streaming. A
/// configured value for any of them would be overwritten or would change what the answer
/// looks like (a stream, tool calls, a second output format), so they are dropped.
const OWNED_KEYS: [&str; 10] = [
    "model",
    "messages",
    "input",
    "instructions",
    "system",
    "stream",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
];

/// The output ceiling used when the learning configuration carries `0`: the ceiling can be
/// lowered but never switched off.
const DEFAULT_LEARNING_CEILING: u64 = 4096;

/// Why no model can be used for learning. Never answered by substituting another model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelUnavailable {
    #[error(
        "no learning model: set learning.extractor_model or a provider small_model, or pass the \
         session model"
    )]
    NoModel,
    #[error("model reference {value:?} is not of the form provider/model")]
    Malformed { value: String },
    #[error("model {provider}/{model} names provider {provider:?}, which is not configured")]
    ProviderNotConfigured { provider: String, model: String },
}

zuno_queue::text_enum! {
    /// Where the selected model came from, in order of authority.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ModelSource {
        /// `learning.extractor_model`.
        ExtractorModel = "extractor_model",
        /// The active provider's `small_model`.
        SmallModel = "small_model",
        /// The session's own model.
        SessionModel = "session_model",
    }
}

/// A model learning may call, with everything needed to build its requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedModel {
    pub provider: String,
    pub model: String,
    pub source: ModelSource,
    pub api: ProviderApi,
    /// Without a trailing slash (HTTP kinds; for the command-line kinds, see `command`).
    pub base_url: String,
    /// The executable a command-line kind runs (`claude_cli`, `codex_cli`); `None` for HTTP.
    pub command: Option<String>,
    /// The effective output limit (see [`effective_output_limit`]).
    pub max_output_tokens: u64,
    /// Native JSON-schema output: the configuration asks for it AND the model supports it.
    pub native_structured_output: bool,
    pub supports_sampling: bool,
    /// The model's parameters as they go into the body: unsupported sampling parameters,
    /// token-limit aliases and client-owned fields removed, everything else as configured.
    pub params: Map<String, Value>,
    limit_field: &'static str,
    pub(crate) credentials: Credentials,
}

/// Names of the environment variables holding header values; the values themselves are read
/// only when a request is sent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Credentials {
    pub api_key_env: Option<String>,
    /// (header name, environment variable).
    pub header_envs: Vec<(String, String)>,
}

impl ResolvedModel {
    /// The one output-limit field the selected API receives: `max_tokens` for Chat Completions
    /// and Anthropic Messages, `max_output_tokens` for Responses. A chat configuration that
    /// spells its limit `max_completion_tokens` keeps that spelling, because OpenAI's reasoning
    /// models reject `max_tokens`.
    pub fn output_limit_field(&self) -> &'static str {
        self.limit_field
    }

    /// Names of the headers sent with every request, lower-case, in sending order. Values are
    /// never part of a resolved model.
    pub fn header_names(&self) -> Vec<String> {
        if self.api.is_cli() {
            // A command line is not an HTTP request: no headers are sent.
            return Vec::new();
        }
        let mut names = vec![String::from("content-type")];
        if self.credentials.api_key_env.is_some() {
            names.push(String::from(match self.api {
                ProviderApi::AnthropicMessages => "x-api-key",
                _ => "authorization",
            }));
        }
        if self.api == ProviderApi::AnthropicMessages {
            names.push(String::from("anthropic-version"));
        }
        names.extend(
            self.credentials
                .header_envs
                .iter()
                .map(|(name, _)| name.to_ascii_lowercase()),
        );
        names
    }
}

/// Selects the learning model: `learning.extractor_model` (authoritative), else the active
/// provider's `small_model`, else the session model (`provider/model`). The active provider is
/// the session model's provider or, without a session model, the only configured provider.
///
/// A reference naming a provider that is not configured is [`ModelUnavailable`]; it is never
/// replaced by another provider or model. Model names may themselves contain `/` (OpenRouter's
/// `google/gemini-…`): the provider is everything before the first `/`. `small_model` is a
/// model name within its own provider.
pub fn resolve_model(
    config: &Config,
    session_model: Option<&str>,
) -> Result<ResolvedModel, ModelUnavailable> {
    let session = session_model
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(split_reference)
        .transpose()?;
    let (provider, model, source) = if let Some(reference) = &config.learning.extractor_model {
        let (provider, model) = split_reference(reference)?;
        (provider, model, ModelSource::ExtractorModel)
    } else {
        let active = match &session {
            Some((provider, _)) => Some(provider.clone()),
            None if config.providers.len() == 1 => config.providers.keys().next().cloned(),
            None => None,
        };
        let small = active.and_then(|name| {
            let small = config.providers.get(&name)?.small_model.clone()?;
            Some((name, small))
        });
        match (small, session) {
            (Some((provider, model)), _) => (provider, model, ModelSource::SmallModel),
            (None, Some((provider, model))) => (provider, model, ModelSource::SessionModel),
            (None, None) => return Err(ModelUnavailable::NoModel),
        }
    };
    let Some(provider_config) = config.providers.get(&provider) else {
        return Err(ModelUnavailable::ProviderNotConfigured { provider, model });
    };
    Ok(resolve_with(
        config,
        provider,
        model,
        source,
        provider_config,
    ))
}

fn split_reference(reference: &str) -> Result<(String, String), ModelUnavailable> {
    match reference.trim().split_once('/') {
        Some((provider, model)) if !provider.is_empty() && !model.is_empty() => {
            Ok((provider.to_owned(), model.to_owned()))
        }
        _ => Err(ModelUnavailable::Malformed {
            value: reference.to_owned(),
        }),
    }
}

fn resolve_with(
    config: &Config,
    provider: String,
    model: String,
    source: ModelSource,
    provider_config: &ProviderConfig,
) -> ResolvedModel {
    let defaults = ModelConfig::default();
    let model_config = provider_config.models.get(&model).unwrap_or(&defaults);
    let limit_field = match provider_config.api {
        ProviderApi::OpenaiChat
            if model_config.params.contains_key("max_completion_tokens")
                && !model_config.params.contains_key("max_tokens") =>
        {
            "max_completion_tokens"
        }
        ProviderApi::OpenaiResponses => "max_output_tokens",
        // The command lines take no limit field; Claude Code reads its ceiling from the
        // environment (provider/cli.rs), under the same name.
        ProviderApi::OpenaiChat
        | ProviderApi::AnthropicMessages
        | ProviderApi::ClaudeCli
        | ProviderApi::CodexCli => "max_tokens",
    };
    ResolvedModel {
        max_output_tokens: effective_output_limit(
            config.learning.execution.max_output_tokens,
            model_config,
        ),
        native_structured_output: config.learning.execution.structured_output
            && model_config.supports_structured_output
            && !provider_config.api.is_cli(),
        supports_sampling: model_config.supports_sampling,
        params: pass_through_params(model_config),
        api: provider_config.api,
        base_url: match provider_config.api.is_cli() {
            true => String::new(),
            false => provider_config.base_url.trim_end_matches('/').to_owned(),
        },
        command: provider_config.command().map(str::to_owned),
        limit_field,
        credentials: Credentials {
            api_key_env: provider_config.api_key_env.clone(),
            header_envs: provider_config
                .header_envs
                .iter()
                .map(|(name, var)| (name.clone(), var.clone()))
                .collect(),
        },
        provider,
        model,
        source,
    }
}

/// The smallest applicable limit: the learning ceiling, the model's declared output capacity,
/// its explicit request limit and every token-limit alias in its params. `0` anywhere means
/// "no additional limit" from that source; a learning ceiling of `0` falls back to the default
/// ceiling rather than removing it. Taking the minimum is why raising one limit, or adding a
/// second alias, can never enlarge the bound.
pub fn effective_output_limit(learning_ceiling: u64, model: &ModelConfig) -> u64 {
    let ceiling = if learning_ceiling == 0 {
        DEFAULT_LEARNING_CEILING
    } else {
        learning_ceiling
    };
    let aliases = LIMIT_ALIASES
        .iter()
        .filter_map(|alias| model.params.get(*alias))
        .filter_map(limit_value);
    [model.max_output_tokens, model.max_tokens]
        .into_iter()
        .flatten()
        .chain(aliases)
        .filter(|limit| *limit > 0)
        .fold(ceiling, u64::min)
}

/// A limit from a params value: a non-negative integer, or an integral float / numeric string
/// as some configuration writers produce.
fn limit_value(value: &Value) -> Option<u64> {
    match value {
        Value::Number(number) => number.as_u64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0)
                // In range: finite, non-negative and integral; saturates above u64::MAX.
                .map(|f| f as u64)
        }),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn pass_through_params(model: &ModelConfig) -> Map<String, Value> {
    model
        .params
        .iter()
        .filter(|(key, _)| {
            let key = key.as_str();
            !OWNED_KEYS.contains(&key)
                && !LIMIT_ALIASES.contains(&key)
                && (model.supports_sampling || !SAMPLING_PARAMS.contains(&key))
        })
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}
