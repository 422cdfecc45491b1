//! The no-tools resident Memory maintenance stage.

pub mod maintain;

use std::sync::Arc;

use zuno_shared::memory::service::MemoryService;
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;

/// The handlers `zuno-worker-maintain` registers.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    let memory = MemoryService::new(
        env.ledger.db().clone(),
        config.clone(),
        env.settings.paths.clone(),
        env.ledger.clock().clone(),
    );
    Ok(vec![Arc::new(maintain::MaintainHandler::new(
        config,
        memory,
        LearningModelClient::new(),
    ))])
}
