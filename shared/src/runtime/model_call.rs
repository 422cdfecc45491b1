//! A learning job's model call, charged to the job: the one path extraction, maintenance, mining
//! and evaluation use to ask the learning model, so every call records its tokens and the
//! provider's health the same way — even when the job's lease was lost while the model answered.

use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument;

use super::{JobContext, JobError};
use crate::learning::usage::{self, UsageRecord};
use crate::provider::{
    LearningModelClient, LearningRequest, LearningResponse, ProviderError, ProviderFailure,
    ResolvedModel,
};

/// Asks `model` once (the client's retries and one repair included) and, whatever the outcome,
/// records the call: its tokens against the job and `project_id`, the provider's health, the
/// provider metrics, and the release of the attempt's token reservation. The record is written
/// in its own transaction, not fenced by the lease: the tokens were spent even if another worker
/// took the job meanwhile (whose results stay fenced at settlement). Returns the provider's
/// answer or failure; `Err` only when the record could not be written.
pub async fn call_for_job(
    ctx: &JobContext,
    client: &LearningModelClient,
    model: &ResolvedModel,
    request: &LearningRequest,
    timeout: Duration,
    project_id: Option<&str>,
    validate: impl Fn(&Value) -> Result<(), String> + Sync,
) -> Result<Result<LearningResponse, ProviderFailure>, JobError> {
    let started = Instant::now();
    let called = client
        .complete_validated(model, request, timeout, validate)
        // A child of the job's span, so the provider call (repair and retries included) shows
        // in the admitting request's trace.
        .instrument(tracing::info_span!(
            "provider request",
            provider = %model.provider,
            model = %model.model,
            api = model.api.as_str(),
        ))
        .await;
    let metrics = crate::telemetry::metrics::provider();
    let (tokens, failure) = match &called {
        Ok(response) => {
            metrics.request(&model.provider, &model.model, "ok", started.elapsed());
            (response.usage, None)
        }
        Err(failure) => {
            metrics.request(&model.provider, &model.model, "error", started.elapsed());
            metrics.error(&model.provider, error_class(&failure.error));
            (failure.usage, Some(&failure.error))
        }
    };
    let job = ctx.job();
    let now = ctx.ledger.now_ms();
    usage::record_job_call(
        ctx.ledger.db(),
        &UsageRecord {
            job_id: Some(&job.id),
            project_id,
            provider: &model.provider,
            model: &model.model,
            automatic: job.origin.is_automatic(),
            input_tokens: tokens.input_tokens,
            output_tokens: tokens.output_tokens,
        },
        ctx.lease().attempt,
        failure,
        now,
    )
    .await?;
    Ok(called)
}

/// [`call_for_job`] for callers that need only the answer: a provider failure becomes a
/// permanent or retryable job error as the failure says (a retryable one honours the provider's
/// Retry-After).
pub async fn ask_for_job(
    ctx: &JobContext,
    client: &LearningModelClient,
    model: &ResolvedModel,
    request: &LearningRequest,
    timeout: Duration,
    project_id: Option<&str>,
    validate: impl Fn(&Value) -> Result<(), String> + Sync,
) -> Result<Value, JobError> {
    call_for_job(ctx, client, model, request, timeout, project_id, validate)
        .await?
        .map(|response| response.value)
        .map_err(|failure| job_error(&failure, ctx.ledger.now_ms()))
}

/// Permanent provider failures fail the job at once; the rest retry, honouring Retry-After.
pub fn job_error(failure: &ProviderFailure, now: i64) -> JobError {
    let message = failure.to_string();
    if failure.is_permanent() {
        return JobError::Permanent {
            message,
            result: Some(serde_json::json!({
                "diagnostic": failure.error.diagnostic(),
                "errorClass": error_class(&failure.error),
            })),
        };
    }
    let retry_at = failure
        .retry_after()
        .map(|wait| now.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)));
    JobError::Retryable { message, retry_at }
}

/// The provider-error label of metrics and outcome events.
pub fn error_class(error: &ProviderError) -> &'static str {
    match error {
        ProviderError::MissingCredential { .. } | ProviderError::InvalidHeader { .. } => "config",
        ProviderError::Auth(_) => "auth",
        ProviderError::ModelUnavailable(_) => "model_unavailable",
        ProviderError::OutputLimitRejected(_) => "output_limit_rejected",
        ProviderError::BadRequest(_) => "bad_request",
        ProviderError::RateLimited { .. } => "rate_limited",
        ProviderError::Unavailable { .. } => "unavailable",
        ProviderError::Network { .. } => "network",
        ProviderError::Timeout { .. } => "timeout",
        ProviderError::InvalidResponse(_) => "invalid_response",
        ProviderError::MalformedAnswer { .. } => "malformed_answer",
        ProviderError::CommandUnavailable { .. } => "command_unavailable",
        ProviderError::CommandFailed(_) => "command_failed",
    }
}
