//! The no-tools resident Memory maintenance stage.

pub mod maintain;
pub mod supersede;

use std::sync::Arc;

use zuno_shared::memory::service::MemoryService;
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;

fn memory_service(env: &WorkerEnv, config: Arc<zuno_shared::config::Config>) -> MemoryService {
    MemoryService::new(
        env.ledger.db().clone(),
        config,
        env.settings.paths.clone(),
        env.ledger.clock().clone(),
    )
}

/// The handlers `zuno-worker-maintain` registers.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    let memory = memory_service(env, config.clone());
    Ok(vec![Arc::new(maintain::MaintainHandler::new(
        config,
        memory,
        LearningModelClient::new(),
    ))])
}

/// Start-up reconciliation of resident Memory, as `zuno serve` does it: interrupted
/// `applying`/`undoing` candidates are classified (never replayed), missing projection files are
/// restored from their revision and edited ones recorded. A host running only maintenance
/// workers repairs its files this way. A failure is logged; it must not keep the worker from
/// claiming (the next start tries again).
pub async fn reconcile_at_start(env: &WorkerEnv) {
    let memory = memory_service(env, Arc::new(env.settings.config.clone()));
    match memory.reconcile().await {
        Ok(report) => tracing::info!(?report, "memory reconciliation finished"),
        Err(error) => tracing::warn!(%error, "memory reconciliation failed"),
    }
}

/// The handlers of a `zuno-worker-maintain` process, after [`reconcile_at_start`]: before the
/// first claim, so a host that runs only maintenance workers (no `zuno serve`) still gets its
/// Memory files repaired when a worker starts.
pub fn reconciled_handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(reconcile_at_start(env))
    });
    handlers(env)
}
