//! The extraction stage: turns a closed turn's bound source into cited Experience, with the
//! built-in rules extractor or a model through the `LearningModelClient`.

pub mod embed;
pub mod extract;
pub mod prompt;
/// The provider client lives in `zuno_shared::provider` (maintenance, mining and evaluation
/// use it too); re-exported here for the extract stage's callers.
pub use zuno_shared::provider;

use std::sync::Arc;

use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;

/// The handlers `zuno-worker-extract` registers: extraction, and the `embed` jobs of the
/// optional semantic recall layer. With an embeddings provider configured, start-up also queues
/// the embedding of every experience that has no vector of the configured model yet.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    if config.embeddings.is_some() {
        let (ledger, config) = (env.ledger.clone(), Arc::clone(&config));
        tokio::spawn(async move {
            match zuno_shared::learning::recall::semantic::backfill(&ledger, &config, None).await {
                Ok(report) => tracing::info!(?report, "embedding backfill queued"),
                Err(error) => tracing::warn!(%error, "embedding backfill failed"),
            }
        });
    }
    Ok(vec![
        Arc::new(extract::ExtractHandler::new(
            Arc::clone(&config),
            provider::LearningModelClient::new(),
        )),
        Arc::new(embed::EmbedHandler::new(config.embeddings.clone())),
    ])
}
