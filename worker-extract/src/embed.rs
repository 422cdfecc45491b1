//! The `embed` job of the optional semantic recall layer: one experience's text in, its vector
//! for one embedding model stored in the database.
//!
//! Idempotent per `(experience, model)`: the ledger admits one job per pair, and a vector
//! already stored for the experience's current text settles the job without a request. A
//! transient provider failure (429, 5xx, network, deadline) returns the job to the ledger, which
//! retries it (Retry-After honoured) up to its attempt ceiling; a permanent one fails it.

use std::time::Duration;

use zuno_shared::config::EmbeddingsConfig;
use zuno_shared::learning::experience::{self, ExperienceStatus};
use zuno_shared::learning::recall::semantic;
use zuno_shared::ledger::{Job, JobKind};
use zuno_shared::provider::{EmbeddingClient, ProviderError};
use zuno_shared::runtime::{JobContext, JobError, JobHandler};

pub struct EmbedHandler {
    client: Option<EmbeddingClient>,
}

impl EmbedHandler {
    /// `None`: no embeddings provider is configured, and a queued `embed` job fails saying so.
    pub fn new(config: Option<EmbeddingsConfig>) -> EmbedHandler {
        EmbedHandler {
            client: config.map(EmbeddingClient::new),
        }
    }

    pub fn with_client(client: EmbeddingClient) -> EmbedHandler {
        EmbedHandler {
            client: Some(client),
        }
    }
}

#[async_trait::async_trait]
impl JobHandler for EmbedHandler {
    fn kind(&self) -> JobKind {
        JobKind::Embed
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let job = ctx.job().clone();
        let payload_text = |key: &str| {
            job.payload
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| JobError::permanent(format!("the embed job has no `{key}`")))
        };
        let experience_id = payload_text("experienceId")?;
        let model = payload_text("model")?;
        let Some(client) = &self.client else {
            return Err(JobError::permanent(
                "no embeddings provider is configured (`embeddings` in the configuration)",
            ));
        };
        if client.model() != model {
            return Err(JobError::SourceChanged(format!(
                "the configured embedding model is `{}`, not `{model}`",
                client.model()
            )));
        }

        let db = ctx.ledger.db().clone();
        let mut read = db.begin_read().await?;
        let source = experience::embedding_source_in(&mut read, &experience_id).await?;
        let stored = semantic::stored_digest_in(&mut read, &experience_id, &model).await?;
        read.rollback().await?;
        let Some(source) = source.filter(|s| s.status == ExperienceStatus::Active) else {
            return Err(JobError::SourceChanged(String::from(
                "the experience was forgotten or deleted",
            )));
        };
        let text = semantic::embedding_text(
            &source.title,
            &source.summary,
            source.resolution.as_deref(),
            &source.keywords,
        );
        let digest = semantic::text_digest(&text);
        if stored.as_deref() == Some(digest.as_str()) {
            let settlement = ctx.begin_settlement().await?;
            let result = serde_json::json!({ "model": model, "alreadyEmbedded": true });
            return Ok(settlement.complete(result).await?);
        }

        let timeout = Duration::from_millis(client.config().timeout_ms);
        let vector = client
            .embed(&text, timeout)
            .await
            .map_err(|error| job_error(&error, ctx.ledger.now_ms()))?;

        let mut settlement = ctx.begin_settlement().await?;
        let tx = settlement.tx().await?;
        let now = ctx.ledger.now_ms();
        semantic::store_in(
            tx,
            &experience_id,
            &source.project_id,
            &model,
            &vector,
            &digest,
            now,
        )
        .await?;
        let result = serde_json::json!({
            "model": model,
            "dimensions": vector.len(),
            "contentDigest": digest,
        });
        Ok(settlement.complete(result).await?)
    }
}

/// Permanent provider failures fail the job at once; the rest go back to the ledger, at the
/// provider's Retry-After when it gave one.
fn job_error(error: &ProviderError, now: i64) -> JobError {
    let message = format!("embedding request failed: {error}");
    if error.is_permanent() {
        return JobError::Permanent {
            message,
            result: Some(serde_json::json!({ "diagnostic": error.diagnostic() })),
        };
    }
    let retry_at = error
        .retry_after()
        .map(|wait| now.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)));
    JobError::Retryable { message, retry_at }
}
