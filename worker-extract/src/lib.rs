//! The extraction stage: turns a closed turn's bound source into cited Experience, with the
//! built-in rules extractor or a model through the `LearningModelClient`.

pub mod extract;
pub mod prompt;
pub mod provider;

use std::sync::Arc;

use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;

/// The handlers `zuno-worker-extract` registers.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    Ok(vec![Arc::new(extract::ExtractHandler::new(
        config,
        provider::LearningModelClient::new(),
    ))])
}
