//! The extraction stage: turns a closed turn's bound source into cited Experience.
//!
//! The handler rechecks the bound source inside its settlement transaction (a concurrent edit
//! or deletion can therefore never commit a stale result) and records the outcome.

use std::sync::Arc;

use zuno_shared::learning::{SourceCheck, SourceSnapshot};
use zuno_shared::ledger::{Job, JobKind};
use zuno_shared::runtime::process::WorkerEnv;
use zuno_shared::runtime::{JobContext, JobError, JobHandler};

pub struct ExtractHandler;

#[async_trait::async_trait]
impl JobHandler for ExtractHandler {
    fn kind(&self) -> JobKind {
        JobKind::Extract
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let mut settlement = ctx.begin_settlement().await?;
        let snapshot = SourceSnapshot::load_in(settlement.tx().await?, &ctx.job().id)
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?
            .ok_or_else(|| JobError::SourceChanged(String::from("no bound source snapshot")))?;
        match snapshot
            .check_in(settlement.tx().await?)
            .await
            .map_err(|e| JobError::retryable(e.to_string()))?
        {
            SourceCheck::Current => {}
            SourceCheck::Changed(reason) | SourceCheck::Unavailable(reason) => {
                return Ok(settlement
                    .skip(&format!("source no longer current: {reason}"))
                    .await?);
            }
        }
        let result = serde_json::json!({
            "extractorVersion": ctx.job().extractor_version,
            "experiences": [],
            "source": { "startMessageId": snapshot.start_message_id, "endMessageId": snapshot.end_message_id },
        });
        Ok(settlement.complete(result).await?)
    }
}

/// The handlers `zuno-worker-extract` registers.
pub fn handlers(_env: &WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>> {
    Ok(vec![Arc::new(ExtractHandler)])
}
