//! The extraction stage: turns a closed turn's bound source into cited Experience, with the
//! built-in rules extractor or a model through the `LearningModelClient`.

pub mod extract;
pub mod prompt;
/// The provider client lives in `zuno_shared::provider` (maintenance, mining and evaluation
/// use it too); re-exported here for the extract stage's callers.
pub use zuno_shared::provider;

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
