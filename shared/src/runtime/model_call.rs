//! A learning job's model call, charged to the job: the one path mining and evaluation use to ask
//! the learning model, so both record tokens and provider health the same way.

use std::time::Duration;

use serde_json::Value;

use super::{JobContext, JobError};
use crate::learning::usage::{self, UsageRecord};
use crate::ledger::JobOrigin;
use crate::provider::{LearningModelClient, LearningRequest, ResolvedModel};

/// Asks `model` once (the client's retries and one repair included) and, whatever the outcome,
/// records the call's tokens against the job and `project_id` and the provider's health, in a
/// transaction fenced by the job's lease. Returns the validated answer; a provider failure
/// becomes a permanent or retryable job error as the failure says.
pub async fn ask_for_job(
    ctx: &JobContext,
    client: &LearningModelClient,
    model: &ResolvedModel,
    request: &LearningRequest,
    timeout: Duration,
    project_id: Option<&str>,
    validate: impl Fn(&Value) -> Result<(), String> + Sync,
) -> Result<Value, JobError> {
    let called = client
        .complete_validated(model, request, timeout, validate)
        .await;
    let (tokens, failure) = match &called {
        Ok(response) => (response.usage, None),
        Err(failure) => (failure.usage, Some(&failure.error)),
    };
    let job = ctx.job();
    let mut tx = ctx.fenced_tx().await?;
    usage::record_call_in(
        &mut tx,
        &UsageRecord {
            job_id: Some(&job.id),
            project_id,
            provider: &model.provider,
            model: &model.model,
            automatic: job.origin != JobOrigin::Manual,
            input_tokens: tokens.input_tokens,
            output_tokens: tokens.output_tokens,
        },
        failure,
        ctx.ledger.now_ms(),
    )
    .await?;
    tx.commit().await?;
    called.map(|response| response.value).map_err(|failure| {
        if failure.is_permanent() {
            JobError::permanent(failure.to_string())
        } else {
            JobError::retryable(failure.to_string())
        }
    })
}
