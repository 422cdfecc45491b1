//! Offline cassette evaluation of Skill candidates.
//!
//! The runtime around this stage (claims, leases, heartbeats, fenced settlement) is complete;
//! the stage's own model work arrives with its issue, so for now an attempt records an explicit
//! no-op outcome rather than pretending to have learned anything.

use std::sync::Arc;

use zuno_shared::ledger::{Job, JobKind};
use zuno_shared::runtime::process::WorkerEnv;
use zuno_shared::runtime::{JobContext, JobError, JobHandler};

pub struct StageHandler {
    kind: JobKind,
}

#[async_trait::async_trait]
impl JobHandler for StageHandler {
    fn kind(&self) -> JobKind {
        self.kind
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let settlement = ctx.begin_settlement().await?;
        let result = serde_json::json!({ "outcome": "no_op", "reason": "skill evaluation is not implemented yet" });
        Ok(settlement.complete(result).await?)
    }
}

/// The handlers `zuno-worker-eval` registers.
pub fn handlers(_env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    Ok(vec![Arc::new(StageHandler {
        kind: JobKind::Evaluate,
    })])
}
