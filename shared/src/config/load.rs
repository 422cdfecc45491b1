//! Parsing and validation of the configuration file and environment overrides.

use std::path::Path;

use super::Config;

/// Why a configuration was refused. Every variant names the offending key.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("unknown configuration key `{path}`")]
    UnknownKey { path: String },
    #[error(
        "configuration key `{path}` was retired: post-turn extraction now lives in \
         `learning.post_turn` (see `learning.post_turn.enabled` and `learning.generate`)"
    )]
    RetiredKey { path: String },
    #[error("invalid value for `{path}`: {reason}")]
    Invalid { path: String, reason: String },
    #[error("configuration file {path} is not valid JSON: {reason}")]
    Syntax { path: String, reason: String },
    #[error("cannot read configuration file {path}: {reason}")]
    Unreadable { path: String, reason: String },
}

/// Keys that existed in older releases and must not be silently accepted.
const RETIRED_KEYS: [(&str, &str); 2] = [("memory", "reflection"), ("memory", "nudge_interval")];

/// Parses configuration text. `origin` names the source in messages.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| ConfigError::Syntax {
            path: origin.to_owned(),
            reason: error.to_string(),
        })?;
    for (section, key) in RETIRED_KEYS {
        if value.get(section).and_then(|s| s.get(key)).is_some() {
            return Err(ConfigError::RetiredKey {
                path: format!("{section}.{key}"),
            });
        }
    }
    let config: Config = serde_path_to_error::deserialize(&value).map_err(
        |error: serde_path_to_error::Error<serde_json::Error>| {
            let parent = error.path().to_string();
            let message = error.inner().to_string();
            match unknown_field(&message) {
                // The path already ends with the unknown field's name.
                Some(field) => ConfigError::UnknownKey {
                    path: if parent == "." { field } else { parent },
                },
                None => ConfigError::Invalid {
                    path: parent,
                    reason: message,
                },
            }
        },
    )?;
    validate(&config)?;
    Ok(config)
}

/// Reads and parses a configuration file; an absent file means all defaults.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, &path.display().to_string()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
        Err(error) => Err(ConfigError::Unreadable {
            path: path.display().to_string(),
            reason: error.to_string(),
        }),
    }
}

fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// Refuses the first value out of range. The checks run in a fixed order, so a file with
/// several mistakes is always told about the same one first.
fn validate(config: &Config) -> Result<(), ConfigError> {
    validate_learning(&config.learning)?;
    if !(0.0..=1.0).contains(&config.memory.auto_confidence) {
        return invalid("memory.auto_confidence", "must be between 0 and 1");
    }
    validate_server(&config.server)?;
    validate_providers(config)?;
    if let Some(embeddings) = &config.embeddings {
        validate_embeddings(embeddings)?;
    }
    Ok(())
}

fn invalid(path: &str, reason: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        path: path.to_owned(),
        reason: reason.to_owned(),
    })
}

fn validate_learning(learning: &super::LearningConfig) -> Result<(), ConfigError> {
    if learning.post_turn.poll_interval_ms == 0 {
        return invalid("learning.post_turn.poll_interval_ms", "must be at least 1");
    }
    if learning.post_turn.max_jobs_per_wake == 0 {
        return invalid("learning.post_turn.max_jobs_per_wake", "must be at least 1");
    }
    if learning.execution.timeout_ms == 0 {
        return invalid("learning.execution.timeout_ms", "must be at least 1");
    }
    if learning.execution.max_input_bytes < 1024 {
        return invalid(
            "learning.execution.max_input_bytes",
            "must be at least 1024",
        );
    }
    if learning.execution.max_output_tokens == 0 {
        return invalid("learning.execution.max_output_tokens", "must be at least 1");
    }
    if learning.aggregation.interval_ms == 0 {
        return invalid("learning.aggregation.interval_ms", "must be at least 1");
    }
    if learning.global_promotion.interval_ms == 0 {
        return invalid(
            "learning.global_promotion.interval_ms",
            "must be at least 1",
        );
    }
    if learning.skill.max_learned_rules == 0 || learning.skill.max_learned_rules > 15 {
        return invalid(
            "learning.skill.max_learned_rules",
            "must be between 1 and 15",
        );
    }
    Ok(())
}

fn validate_server(server: &super::ServerConfig) -> Result<(), ConfigError> {
    if server.max_streams_per_token == 0 {
        return invalid("server.max_streams_per_token", "must be at least 1");
    }
    if let Some(root) = server
        .worktree_roots
        .iter()
        .find(|root| !std::path::Path::new(root).is_absolute())
    {
        return invalid(
            "server.worktree_roots",
            &format!("`{root}` is not an absolute path"),
        );
    }
    if let Some(host) = server.allowed_hosts.iter().find(|host| {
        host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    }) {
        return invalid(
            "server.allowed_hosts",
            &format!("`{host}` is not a host name (letters, digits, `.`, `-`, `_`; no port)"),
        );
    }
    Ok(())
}

/// The extractor model and the providers it may name.
fn validate_providers(config: &Config) -> Result<(), ConfigError> {
    if let Some(model) = &config.learning.extractor_model
        && !model.contains('/')
    {
        return invalid("learning.extractor_model", "must be `provider/model`");
    }
    for (name, provider) in &config.providers {
        if !crate::ids::is_valid_external_id(name) {
            return invalid(
                &format!("providers.{name}"),
                "provider names are 1–128 of [A-Za-z0-9._:@-]",
            );
        }
        let http_url =
            provider.base_url.starts_with("http://") || provider.base_url.starts_with("https://");
        if !(provider.api.is_cli() || http_url) {
            return invalid(
                &format!("providers.{name}.base_url"),
                "must be an http(s) URL",
            );
        }
    }
    Ok(())
}

fn validate_embeddings(embeddings: &super::EmbeddingsConfig) -> Result<(), ConfigError> {
    if !(embeddings.base_url.starts_with("http://") || embeddings.base_url.starts_with("https://"))
    {
        return invalid("embeddings.base_url", "must be an http(s) URL");
    }
    if embeddings.model.trim().is_empty() {
        return invalid("embeddings.model", "must not be empty");
    }
    if embeddings.dimensions == 0 || embeddings.dimensions > 16_384 {
        return invalid("embeddings.dimensions", "must be between 1 and 16384");
    }
    if !(-1.0..=1.0).contains(&embeddings.min_similarity) {
        return invalid("embeddings.min_similarity", "must be between -1 and 1");
    }
    if embeddings.timeout_ms == 0 || embeddings.query_timeout_ms == 0 {
        return invalid("embeddings.timeout_ms", "deadlines must be at least 1 ms");
    }
    if embeddings.max_scan == 0 {
        return invalid("embeddings.max_scan", "must be at least 1");
    }
    Ok(())
}

/// Deployment values taken from the environment, applied over the file.
#[derive(Debug, Clone, Default)]
pub struct EnvOverrides {
    pub database_url: Option<String>,
    pub bind: Option<String>,
    pub otlp_endpoint: Option<String>,
    pub json_logs: Option<bool>,
}

impl EnvOverrides {
    /// Reads `ZUNO_DATABASE_URL` (else `DATABASE_URL`), `ZUNO_BIND`,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and `ZUNO_LOG_FORMAT=json`.
    pub fn from_env() -> EnvOverrides {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        EnvOverrides {
            database_url: var("ZUNO_DATABASE_URL").or_else(|| var("DATABASE_URL")),
            bind: var("ZUNO_BIND"),
            otlp_endpoint: var("OTEL_EXPORTER_OTLP_ENDPOINT"),
            json_logs: var("ZUNO_LOG_FORMAT").map(|format| format == "json"),
        }
    }

    pub fn apply(&self, config: &mut Config) {
        if let Some(url) = &self.database_url {
            config.database.url = Some(url.clone());
        }
        if let Some(bind) = &self.bind {
            config.server.bind = bind.clone();
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            config.telemetry.otlp_endpoint = Some(endpoint.clone());
        }
        if let Some(json) = self.json_logs {
            config.telemetry.json_logs = json;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_is_all_defaults() {
        assert_eq!(parse("{}", "test").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_path() {
        let error = parse(
            r#"{"learning":{"post_turn":{"enabled":true,"wake_every":3}}}"#,
            "t",
        )
        .unwrap_err();
        assert_eq!(
            error,
            ConfigError::UnknownKey {
                path: "learning.post_turn.wake_every".into()
            }
        );
        let error = parse(r#"{"lerning":{}}"#, "t").unwrap_err();
        assert_eq!(
            error,
            ConfigError::UnknownKey {
                path: "lerning".into()
            }
        );
    }

    #[test]
    fn retired_keys_say_where_extraction_lives_now() {
        for key in ["reflection", "nudge_interval"] {
            let text = format!(r#"{{"memory":{{"{key}":true}}}}"#);
            let error = parse(&text, "t").unwrap_err();
            assert_eq!(
                error,
                ConfigError::RetiredKey {
                    path: format!("memory.{key}")
                }
            );
            assert!(error.to_string().contains("learning.post_turn"), "{error}");
        }
    }

    #[test]
    fn spec_minimal_override_parses() {
        let config = parse(
            r#"{"memory":{"promotion":"automatic"},"learning":{"use":true,"generate":false}}"#,
            "t",
        )
        .unwrap();
        assert!(config.learning.use_enabled());
        assert!(!config.learning.generate_enabled());
    }

    #[test]
    fn bad_values_name_their_key() {
        let error =
            parse(r#"{"learning":{"post_turn":{"max_jobs_per_wake":0}}}"#, "t").unwrap_err();
        assert!(
            matches!(error, ConfigError::Invalid { ref path, .. } if path == "learning.post_turn.max_jobs_per_wake")
        );
        let error = parse(r#"{"learning":{"retrieval":{"max_items":"five"}}}"#, "t").unwrap_err();
        assert!(
            matches!(error, ConfigError::Invalid { ref path, .. } if path == "learning.retrieval.max_items"),
            "{error:?}"
        );
        let error = parse(r#"{"memory":{"auto_confidence":1.5}}"#, "t").unwrap_err();
        assert!(
            matches!(error, ConfigError::Invalid { ref path, .. } if path == "memory.auto_confidence")
        );
    }

    #[test]
    fn command_line_providers_name_a_command_not_an_endpoint() {
        use super::super::ProviderApi;
        let config = parse(
            r#"{"providers":{"cc":{"api":"claude_cli","small_model":"haiku"},
                "cx":{"api":"codex_cli","command":"/opt/codex/bin/codex"},
                "http":{"api":"openai_chat","base_url":"http://127.0.0.1:11434/v1"}}}"#,
            "t",
        )
        .unwrap();
        assert_eq!(config.providers["cc"].api, ProviderApi::ClaudeCli);
        assert_eq!(config.providers["cc"].command(), Some("claude"));
        assert_eq!(
            config.providers["cx"].command(),
            Some("/opt/codex/bin/codex")
        );
        assert_eq!(config.providers["http"].command(), None);
        // Written back in the file's own shape.
        let written = serde_json::to_value(&config.providers).unwrap();
        assert_eq!(written["cx"]["command"], "/opt/codex/bin/codex");
        assert!(written["cc"].get("command").is_none() && written["cc"].get("base_url").is_none());
        assert_eq!(written["http"]["base_url"], "http://127.0.0.1:11434/v1");
        for (text, needle) in [
            (
                r#"{"api":"claude_cli","base_url":"https://x"}"#,
                "`base_url` is not used",
            ),
            (r#"{"api":"codex_cli","api_key_env":"K"}"#, "own login"),
            (r#"{"api":"codex_cli","command":" "}"#, "must not be empty"),
            (
                r#"{"api":"openai_chat","base_url":"https://x","command":"claude"}"#,
                "only for",
            ),
            (r#"{"api":"openai_chat"}"#, "`base_url` is required"),
        ] {
            let error = parse(&format!(r#"{{"providers":{{"p":{text}}}}}"#), "t").unwrap_err();
            assert!(
                matches!(error, ConfigError::Invalid { ref path, ref reason }
                    if path == "providers.p" && reason.contains(needle)),
                "{text}: {error:?}"
            );
        }
        let error = parse(
            r#"{"providers":{"p":{"api":"claude_cli","colour":1}}}"#,
            "t",
        )
        .unwrap_err();
        assert_eq!(
            error,
            ConfigError::UnknownKey {
                path: "providers.p.colour".into()
            }
        );
    }

    #[test]
    fn embeddings_are_off_by_default_and_validated_when_on() {
        assert_eq!(parse("{}", "t").unwrap().embeddings, None);
        let config = parse(
            r#"{"embeddings":{"base_url":"http://localhost:11434/v1","model":"nomic-embed-text","dimensions":768,"api_key_env":"EMBED_KEY"}}"#,
            "t",
        )
        .unwrap();
        let embeddings = config.embeddings.unwrap();
        assert_eq!(embeddings.dimensions, 768);
        assert_eq!(embeddings.api_key_env.as_deref(), Some("EMBED_KEY"));
        assert_eq!(embeddings.min_similarity, 0.75);
        assert!(!embeddings.send_dimensions);
        let error = parse(
            r#"{"embeddings":{"base_url":"file:///x","model":"m","dimensions":8}}"#,
            "t",
        )
        .unwrap_err();
        assert!(
            matches!(error, ConfigError::Invalid { ref path, .. } if path == "embeddings.base_url")
        );
        let error = parse(
            r#"{"embeddings":{"base_url":"http://h/v1","model":"m","dimensions":0}}"#,
            "t",
        )
        .unwrap_err();
        assert!(
            matches!(error, ConfigError::Invalid { ref path, .. } if path == "embeddings.dimensions")
        );
        let error = parse(
            r#"{"embeddings":{"base_url":"http://h/v1","model":"m","dimensions":8,"key":"x"}}"#,
            "t",
        )
        .unwrap_err();
        assert!(matches!(error, ConfigError::UnknownKey { .. }), "{error:?}");
    }

    #[test]
    fn environment_overrides_deployment_values_only() {
        let mut config = Config::default();
        EnvOverrides {
            database_url: Some("postgres://db/zuno".into()),
            bind: Some("0.0.0.0:9000".into()),
            otlp_endpoint: Some("http://collector:4318".into()),
            json_logs: Some(true),
        }
        .apply(&mut config);
        assert_eq!(config.database.url.as_deref(), Some("postgres://db/zuno"));
        assert_eq!(config.server.bind, "0.0.0.0:9000");
        assert_eq!(
            config.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        assert!(config.telemetry.json_logs);
        assert_eq!(config.learning, Config::default().learning);
    }
}
