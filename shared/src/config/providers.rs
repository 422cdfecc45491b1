//! Model providers the learning extractor may call. Header and key *values* come from the
//! environment at request time and are never persisted (receipts keep header names only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderApi {
    /// OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`).
    OpenaiChat,
    /// OpenAI Responses (`POST {base_url}/responses`).
    OpenaiResponses,
    /// Anthropic Messages (`POST {base_url}/messages`).
    AnthropicMessages,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub api: ProviderApi,
    /// e.g. `https://api.openai.com/v1`, `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// Environment variable holding the API key (sent as `Authorization: Bearer` or
    /// `x-api-key` for Anthropic).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Extra request headers: name → environment variable holding the value.
    #[serde(default)]
    pub header_envs: BTreeMap<String, String>,
    /// The provider's cheap model, preferred for learning when no extractor model is set.
    #[serde(default)]
    pub small_model: Option<String>,
    /// Per-model settings; a model not listed uses the defaults.
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// The model's declared output capacity in tokens.
    pub max_output_tokens: Option<u64>,
    /// An explicit request limit for this model; `0` means "no extra limit" (it never disables
    /// the learning output ceiling).
    pub max_tokens: Option<u64>,
    /// Whether sampling parameters (temperature, top_p, …) are accepted.
    pub supports_sampling: bool,
    /// Whether the endpoint supports native JSON-schema output for this model.
    pub supports_structured_output: bool,
    /// Resolved request parameters passed through as given (reasoning effort, temperature…).
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_output_tokens: None,
            max_tokens: None,
            supports_sampling: true,
            supports_structured_output: false,
            params: serde_json::Map::new(),
        }
    }
}

/// The optional semantic recall layer: an OpenAI-compatible embeddings endpoint
/// (`POST {base_url}/embeddings`, which OpenAI, Ollama and most local servers speak). Absent =
/// recall stays lexical and nothing is sent anywhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// e.g. `https://api.openai.com/v1`, `http://localhost:11434/v1`.
    pub base_url: String,
    /// The embedding model; vectors are stored and compared per model.
    pub model: String,
    /// The vector length the model returns; an answer of another length is refused.
    pub dimensions: u32,
    /// Whether to send `dimensions` in the request (models that can shorten their vectors,
    /// such as OpenAI's `text-embedding-3-*`); most local servers reject or ignore it.
    #[serde(default)]
    pub send_dimensions: bool,
    /// Environment variable holding the API key (sent as `Authorization: Bearer`); none for
    /// local servers without authentication.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The cosine similarity a candidate found only by its vector needs to be recalled
    /// automatically; it replaces the lexical relevance floor for such candidates.
    #[serde(default = "default_min_similarity")]
    pub min_similarity: f64,
    /// Deadline of one embedding request made by an `embed` job.
    #[serde(default = "default_job_timeout_ms")]
    pub timeout_ms: u64,
    /// Deadline of embedding the prompt during `context`; when it passes, recall is lexical.
    #[serde(default = "default_query_timeout_ms")]
    pub query_timeout_ms: u64,
    /// At most this many of a project's newest vectors are compared per recall (each read costs
    /// `4 × dimensions` bytes; see docs/benchmarks.md).
    #[serde(default = "default_max_scan")]
    pub max_scan: u32,
}

fn default_min_similarity() -> f64 {
    0.75
}

fn default_job_timeout_ms() -> u64 {
    30_000
}

fn default_query_timeout_ms() -> u64 {
    2_000
}

fn default_max_scan() -> u32 {
    5_000
}
