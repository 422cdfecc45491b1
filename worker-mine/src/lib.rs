//! The slow path: project and cross-project pattern mining, which consolidates repeated evidence
//! into patterns and, past their gates, Skill candidates.

pub mod mine;

use std::sync::Arc;
use std::time::Duration;

use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;
use zuno_shared::skills::SkillService;

/// The handlers `zuno-worker-mine` registers. Also starts the periodic check: at start-up
/// (restart recovery) and once per aggregation interval it admits each project's check for the
/// current bucket; identical checks from several hosts share one job.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    let skills = SkillService::new(env.ledger.clone(), config.clone());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let scheduler = skills.clone();
        let interval = Duration::from_millis(config.learning.aggregation.interval_ms.max(1000));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            loop {
                ticks.tick().await;
                if let Err(error) = scheduler.admit_checks().await {
                    tracing::warn!(%error, "periodic aggregation check could not be admitted; retrying next interval");
                }
            }
        });
    }
    let client = LearningModelClient::new();
    Ok(vec![
        Arc::new(mine::AggregateProjectHandler::new(
            skills.clone(),
            client.clone(),
        )),
        Arc::new(mine::AggregateGlobalHandler::new(skills, client)),
    ])
}
