//! Model providers the learning extractor may call. Header and key *values* come from the
//! environment at request time and are never persisted (receipts keep header names only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

zuno_queue::text_enum! {
    /// How a provider is reached: one of three HTTP wire formats, or an agent's own command line
    /// run headless under the user's existing login.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum ProviderApi {
        /// OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`).
        OpenaiChat = "openai_chat",
        /// OpenAI Responses (`POST {base_url}/responses`).
        OpenaiResponses = "openai_responses",
        /// Anthropic Messages (`POST {base_url}/messages`).
        AnthropicMessages = "anthropic_messages",
        /// Claude Code's command line, `claude -p --output-format json`, under the user's login.
        ClaudeCli = "claude_cli",
        /// Codex's command line, `codex exec --json`, under the user's login.
        CodexCli = "codex_cli",
    }
}

impl ProviderApi {
    /// The executable a command-line kind runs when `command` is not configured; `None` for
    /// the HTTP kinds.
    pub fn default_command(self) -> Option<&'static str> {
        match self {
            ProviderApi::ClaudeCli => Some("claude"),
            ProviderApi::CodexCli => Some("codex"),
            ProviderApi::OpenaiChat
            | ProviderApi::OpenaiResponses
            | ProviderApi::AnthropicMessages => None,
        }
    }

    /// Whether the provider is an agent's command line rather than an HTTP endpoint.
    pub fn is_cli(self) -> bool {
        self.default_command().is_some()
    }
}

/// One configured provider.
///
/// In the file an HTTP kind names its endpoint in `base_url` and a command-line kind
/// (`claude_cli`, `codex_cli`) its executable in `command` (optional: `claude` / `codex`, looked
/// up on `PATH`); each key is refused on the other kind, and the command-line kinds take no
/// credentials (they run under the agent's own login). In memory both live in `base_url`, read
/// through [`ProviderConfig::command`] for the command-line kinds, so code that builds or
/// rewrites a provider keeps one field for "where requests go".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ProviderFile", into = "ProviderFile")]
pub struct ProviderConfig {
    pub api: ProviderApi,
    /// HTTP kinds: the endpoint, e.g. `https://api.openai.com/v1`, `https://api.anthropic.com/v1`.
    /// Command-line kinds: the configured `command` (empty = the kind's default).
    pub base_url: String,
    /// Environment variable holding the API key (sent as `Authorization: Bearer` or
    /// `x-api-key` for Anthropic).
    pub api_key_env: Option<String>,
    /// Extra request headers: name → environment variable holding the value.
    pub header_envs: BTreeMap<String, String>,
    /// The provider's cheap model, preferred for learning when no extractor model is set.
    pub small_model: Option<String>,
    /// Per-model settings; a model not listed uses the defaults.
    pub models: BTreeMap<String, ModelConfig>,
}

impl ProviderConfig {
    /// The executable a command-line kind runs (the configured `command`, else `claude` /
    /// `codex`); `None` for the HTTP kinds.
    pub fn command(&self) -> Option<&str> {
        let default = self.api.default_command()?;
        Some(if self.base_url.trim().is_empty() {
            default
        } else {
            self.base_url.as_str()
        })
    }
}

/// A provider as written in `config.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderFile {
    api: ProviderApi,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    header_envs: BTreeMap<String, String>,
    #[serde(default)]
    small_model: Option<String>,
    #[serde(default)]
    models: BTreeMap<String, ModelConfig>,
}

impl TryFrom<ProviderFile> for ProviderConfig {
    type Error = String;

    fn try_from(file: ProviderFile) -> Result<Self, String> {
        let api = file.api.as_str();
        let base_url = if file.api.is_cli() {
            if file.base_url.is_some() {
                return Err(format!(
                    "`base_url` is not used by `{api}` (it runs a command line); name the \
                     executable in `command`"
                ));
            }
            if file.api_key_env.is_some() || !file.header_envs.is_empty() {
                return Err(format!(
                    "`api_key_env` and `header_envs` are not used by `{api}`: it runs under the \
                     agent's own login"
                ));
            }
            match file.command {
                Some(command) if command.trim().is_empty() => {
                    return Err(String::from("`command` must not be empty"));
                }
                Some(command) => command,
                None => String::new(),
            }
        } else {
            if file.command.is_some() {
                return Err(format!(
                    "`command` is only for `claude_cli` and `codex_cli`, not `{api}`"
                ));
            }
            file.base_url
                .ok_or_else(|| format!("`base_url` is required for `{api}`"))?
        };
        Ok(ProviderConfig {
            api: file.api,
            base_url,
            api_key_env: file.api_key_env,
            header_envs: file.header_envs,
            small_model: file.small_model,
            models: file.models,
        })
    }
}

impl From<ProviderConfig> for ProviderFile {
    fn from(config: ProviderConfig) -> Self {
        let (base_url, command) = match (config.api.is_cli(), config.base_url.is_empty()) {
            (false, _) => (Some(config.base_url), None),
            (true, true) => (None, None),
            (true, false) => (None, Some(config.base_url)),
        };
        ProviderFile {
            api: config.api,
            base_url,
            command,
            api_key_env: config.api_key_env,
            header_envs: config.header_envs,
            small_model: config.small_model,
            models: config.models,
        }
    }
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
