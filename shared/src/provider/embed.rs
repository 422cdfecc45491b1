//! The embeddings client of the optional semantic recall layer: `POST {base_url}/embeddings`
//! in the OpenAI wire format (OpenAI, Ollama, llama.cpp, vLLM, LM Studio all speak it).
//!
//! One HTTP request per call, within one deadline, and no retry inside the call: an `embed` job
//! that fails transiently is retried by the ledger (leased, at most three attempts, honouring a
//! provider's Retry-After), and the prompt embedding of `context` must not hold the prompt up.
//! Failures use the learning client's [`ProviderError`] classification; the key is read from
//! the environment at request time and scrubbed from every diagnostic.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::ProviderError;
use super::error;
use crate::config::EmbeddingsConfig;

type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Calls the configured embeddings endpoint. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddingClient {
    http: reqwest::Client,
    env: EnvLookup,
    config: EmbeddingsConfig,
}

impl std::fmt::Debug for EmbeddingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingClient")
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

impl EmbeddingClient {
    pub fn new(config: EmbeddingsConfig) -> EmbeddingClient {
        EmbeddingClient {
            http: reqwest::Client::new(),
            env: Arc::new(|name| std::env::var(name).ok()),
            config,
        }
    }

    /// Replaces the environment lookup for the API key (tests inject values this way).
    pub fn with_env<F>(mut self, lookup: F) -> Self
    where
        F: Fn(&str) -> Option<String> + Send + Sync + 'static,
    {
        self.env = Arc::new(lookup);
        self
    }

    pub fn config(&self) -> &EmbeddingsConfig {
        &self.config
    }

    /// The model vectors are stored and compared under.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// The vector of one text, of exactly the configured length.
    pub async fn embed(&self, text: &str, timeout: Duration) -> Result<Vec<f32>, ProviderError> {
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        if let Some(variable) = &self.config.api_key_env {
            let key = (self.env)(variable)
                .filter(|value| !value.is_empty())
                .ok_or_else(|| ProviderError::MissingCredential {
                    variable: variable.clone(),
                })?;
            let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                ProviderError::InvalidHeader {
                    name: String::from("authorization"),
                }
            })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
            secrets.push(key);
        }
        let mut body = json!({
            "model": self.config.model,
            "input": [text],
            "encoding_format": "float",
        });
        if self.config.send_dimensions {
            body["dimensions"] = json!(self.config.dimensions);
        }
        let url = format!("{}/embeddings", self.config.base_url.trim_end_matches('/'));
        let transport = |failure: reqwest::Error| {
            if failure.is_timeout() {
                return ProviderError::Timeout { deadline: timeout };
            }
            ProviderError::Network {
                message: error::clean_message(&failure.without_url().to_string(), &secrets),
            }
        };
        let call = async {
            let response = self
                .http
                .post(&url)
                .headers(headers)
                .json(&body)
                .timeout(timeout)
                .send()
                .await
                .map_err(transport)?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let bytes = response.bytes().await.map_err(transport)?;
            Ok::<_, ProviderError>((status, headers, bytes))
        };
        let (status, headers, bytes) = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| ProviderError::Timeout { deadline: timeout })??;
        if !(200..300).contains(&status) {
            return Err(error::classify(
                status,
                &headers,
                &bytes,
                &secrets,
                SystemTime::now(),
            ));
        }
        let invalid =
            |problem: &str| error::invalid_response(status, &headers, &bytes, &secrets, problem);
        let parsed: Value =
            serde_json::from_slice(&bytes).map_err(|_| invalid("the response body is not JSON"))?;
        let vector = read_vector(&parsed)
            .ok_or_else(|| invalid("the response is not an embeddings list"))?;
        if vector.len() != self.config.dimensions as usize {
            return Err(invalid(&format!(
                "the vector has {} dimensions, {} are configured",
                vector.len(),
                self.config.dimensions
            )));
        }
        if vector.iter().any(|x| !x.is_finite()) {
            return Err(invalid("the vector has a non-finite component"));
        }
        Ok(vector)
    }
}

/// `data[0].embedding` of an OpenAI embeddings response.
fn read_vector(response: &Value) -> Option<Vec<f32>> {
    let embedding = response
        .get("data")?
        .as_array()?
        .iter()
        .find(|item| item.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)?
        .get("embedding")?
        .as_array()?;
    embedding
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_vector_of_an_openai_response() {
        let response = json!({"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -1.0, 0.25]},
        ], "model": "m"});
        assert_eq!(read_vector(&response), Some(vec![0.5, -1.0, 0.25]));
        assert_eq!(read_vector(&json!({"data": [{"embedding": ["x"]}]})), None);
        assert_eq!(read_vector(&json!({"choices": []})), None);
    }
}
