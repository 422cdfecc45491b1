//! The JSON configuration file: the `learning` and `memory` objects, the model `providers` and
//! `embeddings`, plus deployment values (`server`, `database`, `telemetry`) that environment
//! variables may override. Every key, its default and its override are listed in
//! docs/configuration.md; `defaults_match_the_specification` below pins the defaults.

mod load;
mod providers;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use load::{ConfigError, EnvOverrides, load_file, parse};
pub use providers::{EmbeddingsConfig, ModelConfig, ProviderApi, ProviderConfig};

use crate::db::SqliteSynchronous;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub learning: LearningConfig,
    pub memory: MemoryConfig,
    pub guards: GuardsConfig,
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub telemetry: TelemetrySettings,
    /// Model providers by name (`openai`, `anthropic`, …). None configured = the built-in rules
    /// extractor.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// The optional semantic recall layer. None = lexical recall only, and no text leaves the
    /// machine for it.
    pub embeddings: Option<EmbeddingsConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LearningConfig {
    /// Master switch; `false` caps both `use` and `generate`.
    pub enabled: bool,
    #[serde(rename = "use")]
    pub use_: bool,
    pub generate: bool,
    /// `provider/model` used for extraction; otherwise the provider's small model, then the
    /// session model.
    pub extractor_model: Option<String>,
    /// The built-in extractor used when no provider is configured: `rules-2` (default) or
    /// `rules-1`, kept for reprocessing comparisons.
    pub rules_extractor: RulesExtractor,
    pub post_turn: PostTurnConfig,
    pub execution: ExecutionConfig,
    pub aggregation: AggregationConfig,
    pub global_promotion: GlobalPromotionConfig,
    pub retrieval: RetrievalConfig,
    pub skill: SkillConfig,
}

impl Default for LearningConfig {
    fn default() -> Self {
        LearningConfig {
            enabled: true,
            use_: true,
            generate: true,
            extractor_model: None,
            rules_extractor: RulesExtractor::default(),
            post_turn: PostTurnConfig::default(),
            execution: ExecutionConfig::default(),
            aggregation: AggregationConfig::default(),
            global_promotion: GlobalPromotionConfig::default(),
            retrieval: RetrievalConfig::default(),
            skill: SkillConfig::default(),
        }
    }
}

/// Which built-in rules extractor runs without a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RulesExtractor {
    #[serde(rename = "rules-1")]
    Rules1,
    #[default]
    #[serde(rename = "rules-2")]
    Rules2,
}

impl RulesExtractor {
    /// The extractor version its jobs are admitted under.
    pub fn version(self) -> &'static str {
        match self {
            RulesExtractor::Rules1 => "rules-1",
            RulesExtractor::Rules2 => "rules-2",
        }
    }
}

impl LearningConfig {
    /// Retrieval of existing Experience into prompts, under the master switch.
    pub fn use_enabled(&self) -> bool {
        self.enabled && self.use_
    }

    /// Recording new evidence, under the master switch.
    pub fn generate_enabled(&self) -> bool {
        self.enabled && self.generate
    }

    /// Automatic post-turn extraction (manual reflection needs only `generate`).
    pub fn post_turn_enabled(&self) -> bool {
        self.generate_enabled() && self.post_turn.enabled
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostTurnConfig {
    pub enabled: bool,
    pub idle_delay_ms: u64,
    pub poll_interval_ms: u64,
    pub max_jobs_per_wake: u32,
    pub disable_on_external_context: bool,
}

impl Default for PostTurnConfig {
    fn default() -> Self {
        PostTurnConfig {
            enabled: true,
            idle_delay_ms: 0,
            poll_interval_ms: 60_000,
            max_jobs_per_wake: 2,
            disable_on_external_context: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutionConfig {
    pub timeout_ms: u64,
    pub max_input_bytes: u64,
    pub max_output_tokens: u64,
    pub max_steps: u32,
    pub structured_output: bool,
    /// Optional daily cap on provider tokens of automatic model calls (never manual commands),
    /// reserved at claim; absent = unlimited.
    pub max_tokens_per_day: Option<u64>,
    /// Daily cap on automatic model calls (never manual commands), reserved at claim; absent =
    /// 200 when the learning model is an agent's command line (`claude_cli`, `codex_cli`: the
    /// calls spend the user's subscription), unlimited for API providers.
    pub max_calls_per_day: Option<u64>,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            timeout_ms: 120_000,
            max_input_bytes: 131_072,
            max_output_tokens: 4096,
            max_steps: 8,
            structured_output: false,
            max_tokens_per_day: None,
            max_calls_per_day: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregationConfig {
    pub interval_ms: u64,
    pub min_new_records: u32,
}

impl Default for AggregationConfig {
    fn default() -> Self {
        AggregationConfig {
            interval_ms: 86_400_000,
            min_new_records: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GlobalPromotionConfig {
    pub interval_ms: u64,
    pub min_projects: u32,
}

impl Default for GlobalPromotionConfig {
    fn default() -> Self {
        GlobalPromotionConfig {
            interval_ms: 604_800_000,
            min_projects: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrievalConfig {
    pub max_items: u32,
    pub max_context_tokens: u32,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        RetrievalConfig {
            max_items: 5,
            max_context_tokens: 1200,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SkillConfig {
    pub min_independent_sessions: u32,
    pub max_learned_rules: u32,
    pub require_review: bool,
}

impl Default for SkillConfig {
    fn default() -> Self {
        SkillConfig {
            min_independent_sessions: 3,
            max_learned_rules: 15,
            require_review: true,
        }
    }
}

/// When proposals become resident Memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryPromotion {
    Review,
    HighConfidence,
    #[default]
    Automatic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    pub promotion: MemoryPromotion,
    pub auto_confidence: f64,
    pub global_char_limit: u32,
    pub project_char_limit: u32,
    /// Days without use after which maintenance withholds a derived entry as stale; `0` (the
    /// default) never does: a rule the agent obeys is rarely restated, so its evidence ages
    /// while it works.
    pub stale_after_unused_days: u32,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            promotion: MemoryPromotion::Automatic,
            auto_confidence: 0.9,
            global_char_limit: 2200,
            project_char_limit: 3000,
            stale_after_unused_days: 0,
        }
    }
}

/// Guards: checkable lessons enforced by the agents' `PreToolUse` hooks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardsConfig {
    /// Whether a compiled guard takes effect at once (`automatic`) or after a person approves it
    /// (`review`, the default: a guard stops the agent, so a person decides).
    pub promotion: GuardPromotion,
    /// What the hook answers for a guarded call: `ask` (the agent asks the user; default) or
    /// `deny` (the call is refused with the lesson as the reason).
    pub decision: GuardDecision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardPromotion {
    #[default]
    Review,
    Automatic,
}

pub use crate::guards::store::GuardDecision;

/// HTTP server deployment values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to bind; overridden by `ZUNO_BIND`.
    pub bind: String,
    /// Largest accepted request body.
    pub body_limit_bytes: u64,
    /// Directories a project's worktree must lie under (absolute). Empty = the home directory of
    /// the user running the server.
    pub worktree_roots: Vec<String>,
    /// Host names (besides the bound address, `localhost`, `127.0.0.1` and `[::1]`) that requests
    /// may name in `Host`, e.g. the name a reverse proxy or another container uses. Any other
    /// name is refused: it is what a DNS-rebinding web page would send.
    pub allowed_hosts: Vec<String>,
    /// Whether `/metrics` needs the server's token. Absent = required when bound off loopback.
    pub metrics_auth: Option<bool>,
    /// Concurrent live-event streams one token may hold open.
    pub max_streams_per_token: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: String::from("127.0.0.1:7878"),
            body_limit_bytes: 4 * 1024 * 1024,
            worktree_roots: Vec::new(),
            allowed_hosts: Vec::new(),
            metrics_auth: None,
            max_streams_per_token: 8,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `sqlite:<path>` or `postgres://…`; overridden by `ZUNO_DATABASE_URL` / `DATABASE_URL`.
    /// Absent = the SQLite file in the data directory.
    pub url: Option<String>,
    pub sqlite_synchronous: SqliteSynchronous,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// OTLP/HTTP endpoint; overridden by `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    pub json_logs: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_specification() {
        let config = Config::default();
        let learning = &config.learning;
        assert!(learning.enabled && learning.use_ && learning.generate);
        assert_eq!(learning.post_turn.idle_delay_ms, 0);
        assert_eq!(learning.post_turn.poll_interval_ms, 60_000);
        assert_eq!(learning.post_turn.max_jobs_per_wake, 2);
        assert!(!learning.post_turn.disable_on_external_context);
        assert_eq!(learning.execution.timeout_ms, 120_000);
        assert_eq!(learning.execution.max_input_bytes, 131_072);
        assert_eq!(learning.execution.max_output_tokens, 4096);
        assert_eq!(learning.execution.max_steps, 8);
        assert!(!learning.execution.structured_output);
        assert_eq!(learning.execution.max_tokens_per_day, None);
        assert_eq!(learning.execution.max_calls_per_day, None);
        assert_eq!(learning.aggregation.interval_ms, 86_400_000);
        assert_eq!(learning.aggregation.min_new_records, 3);
        assert_eq!(learning.global_promotion.interval_ms, 604_800_000);
        assert_eq!(learning.global_promotion.min_projects, 2);
        assert_eq!(learning.retrieval.max_items, 5);
        assert_eq!(learning.retrieval.max_context_tokens, 1200);
        assert_eq!(learning.skill.min_independent_sessions, 3);
        assert_eq!(learning.skill.max_learned_rules, 15);
        assert!(learning.skill.require_review);
        assert_eq!(config.memory.promotion, MemoryPromotion::Automatic);
        assert_eq!(config.memory.auto_confidence, 0.9);
        assert_eq!(config.memory.global_char_limit, 2200);
        assert_eq!(config.memory.project_char_limit, 3000);
        assert_eq!(config.database.sqlite_synchronous, SqliteSynchronous::Full);
        assert!(config.providers.is_empty() && config.embeddings.is_none());
        // A command-line provider without `command` runs the agent's own executable.
        assert_eq!(ProviderApi::ClaudeCli.default_command(), Some("claude"));
        assert_eq!(ProviderApi::CodexCli.default_command(), Some("codex"));
        assert_eq!(ProviderApi::OpenaiChat.default_command(), None);
    }

    #[test]
    fn master_switch_caps_use_and_generate() {
        let mut learning = LearningConfig {
            enabled: false,
            ..LearningConfig::default()
        };
        assert!(!learning.use_enabled());
        assert!(!learning.generate_enabled());
        assert!(!learning.post_turn_enabled());
        learning.enabled = true;
        learning.generate = false;
        assert!(learning.use_enabled());
        assert!(!learning.generate_enabled());
    }
}
