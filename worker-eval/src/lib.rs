//! Offline cassette evaluation of Skill candidates: a candidate is applied only after it does at
//! least as well as the baseline on a recorded suite, without running any tool for real.

pub mod eval;

use std::sync::Arc;

use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::JobHandler;
use zuno_shared::runtime::process::WorkerEnv;
use zuno_shared::skills::SkillService;

/// The handlers `zuno-worker-eval` registers. At start-up it reconciles only evaluations past
/// their deadline (another process's live evaluation is left alone) and interrupted Skill file
/// effects.
pub fn handlers(env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    let config = Arc::new(env.settings.config.clone());
    let skills = SkillService::new(env.ledger.clone(), config);
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let startup = skills.clone();
        runtime.spawn(async move {
            match startup.reconcile_expired_evaluations().await {
                Ok(expired) if !expired.is_empty() => {
                    tracing::info!(
                        count = expired.len(),
                        "expired evaluations reconciled at start-up"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "start-up evaluation reconciliation failed"),
            }
            if let Err(error) = startup.reconcile_skills().await {
                tracing::warn!(%error, "start-up Skill effect reconciliation failed");
            }
        });
    }
    Ok(vec![Arc::new(eval::EvaluateHandler::new(
        skills,
        LearningModelClient::new(),
    ))])
}
