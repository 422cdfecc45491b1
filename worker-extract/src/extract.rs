//! The extraction job: one closed turn's bound source in, cited Experience out.
//!
//! 1. Rebuild the bound manifest from stored rows; a changed source is skipped.
//! 2. Persist the exact manifest and a `learning.extraction.request` event on the job, fenced by
//!    the lease, before any provider request.
//! 3. Run the extractor: the built-in rules (`rules-1`) or the model (`model-1`), the latter
//!    with no tools, no filesystem and no foreground identity.
//! 4. Record token usage and provider health, whatever the outcome.
//! 5. Validate the answer against the manifest (per-item refusal, exact-excerpt citations).
//! 6. Settle in one transaction that proves the lease, rechecks the source and the session's
//!    policy, stores experiences, evidence and raw memory hints idempotently by
//!    `(job, ordinal)`, and appends the `learning.extraction.outcome` event.

use std::sync::Arc;
use std::time::Duration;

use zuno_shared::config::Config;
use zuno_shared::db::Tx;
use zuno_shared::learning::events::{self, EventScope};
use zuno_shared::learning::extraction::ExtractionOutput;
use zuno_shared::learning::manifest::{self, SourceManifest};
use zuno_shared::learning::validate::{ValidatedExtraction, validate};
use zuno_shared::learning::{
    RULES_EXTRACTOR_VERSION, SourceCheck, SourceSnapshot, experience, policy, rules,
};
use zuno_shared::ledger::{Job, JobKind};
use zuno_shared::runtime::{JobContext, JobError, JobHandler, model_call};

use crate::prompt;
use crate::provider::{
    LearningModelClient, LearningRequest, ProviderFailure, ResolvedModel, resolve_model,
};

pub struct ExtractHandler {
    config: Arc<Config>,
    client: LearningModelClient,
}

impl ExtractHandler {
    pub fn new(config: Arc<Config>, client: LearningModelClient) -> ExtractHandler {
        ExtractHandler { config, client }
    }
}

enum Extractor {
    Rules,
    Model(Box<ResolvedModel>),
}

/// What one extractor run produced.
struct Answer {
    output: ExtractionOutput,
    request_id: String,
    provider_request_id: Option<String>,
    repaired: bool,
    input_tokens: u64,
    output_tokens: u64,
}

#[async_trait::async_trait]
impl JobHandler for ExtractHandler {
    fn kind(&self) -> JobKind {
        JobKind::Extract
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let job = ctx.job().clone();
        let db = ctx.ledger.db().clone();

        // 1. The bound source, rebuilt from stored rows.
        let mut read = db.begin_read().await?;
        let snapshot = SourceSnapshot::load_in(&mut read, &job.id)
            .await?
            .ok_or_else(|| {
                JobError::SourceChanged(String::from("the job has no bound source snapshot"))
            })?;
        let manifest = match snapshot.check_in(&mut read).await? {
            SourceCheck::Current(manifest) => manifest,
            SourceCheck::Changed(reason) | SourceCheck::Unavailable(reason) => {
                return Err(JobError::SourceChanged(reason));
            }
        };
        let session_model: Option<String> =
            zuno_shared::on_tx!(&mut read, |conn| sqlx::query_scalar(
                "SELECT model FROM session WHERE id = $1"
            )
            .bind(&snapshot.session_id)
            .fetch_optional(conn)
            .await)?
            .flatten();
        read.rollback().await?;

        let version = job
            .extractor_version
            .clone()
            .unwrap_or_else(|| RULES_EXTRACTOR_VERSION.to_owned());
        let scope = EventScope {
            project_id: Some(&snapshot.project_id),
            session_id: Some(&snapshot.session_id),
            job_id: Some(&job.id),
            message_id: Some(&snapshot.end_message_id),
        };
        let extractor = if rules::is_rules_version(&version) {
            Extractor::Rules
        } else {
            match resolve_model(&self.config, session_model.as_deref()) {
                Ok(model) => Extractor::Model(Box::new(model)),
                Err(unavailable) => {
                    let message = format!("learning model unavailable: {unavailable}");
                    return Err(JobError::Permanent {
                        message,
                        result: Some(serde_json::json!({ "extractorVersion": version })),
                    });
                }
            }
        };

        // 2. The exact input and the request receipt, durable before any provider call.
        let (request, receipt) = match &extractor {
            Extractor::Rules => {
                let receipt = serde_json::json!({
                    "requestId": uuid::Uuid::new_v4().to_string(),
                    "extractor": version,
                    "provider": null,
                    "model": null,
                    "promptSha256": manifest.digest,
                    "responseContract": { "schema": prompt::SCHEMA_NAME, "mode": "local-rules" },
                    "tools": [],
                });
                (None, receipt)
            }
            Extractor::Model(model) => {
                let (system, user) = prompt::build(&manifest, model.native_structured_output);
                let request = LearningRequest {
                    system,
                    user,
                    schema_name: prompt::SCHEMA_NAME.to_owned(),
                    schema: zuno_shared::learning::extraction::output_schema(),
                };
                let receipt = LearningModelClient::receipt(model, &request);
                (Some(request), receipt)
            }
        };
        let request_id = receipt["requestId"].as_str().unwrap_or_default().to_owned();
        let mut receipt_event = receipt.clone();
        receipt_event["attempt"] = serde_json::json!(ctx.lease().attempt);
        receipt_event["extractorVersion"] = serde_json::json!(version);
        receipt_event["manifestDigest"] = serde_json::json!(manifest.digest);
        let mut tx = ctx.fenced_tx().await?;
        manifest::persist_in(&mut tx, &job.id, &manifest).await?;
        events::append_in(
            &mut tx,
            events::EXTRACTION_REQUEST,
            &scope,
            &receipt_event,
            ctx.ledger.now_ms(),
        )
        .await?;
        tx.commit().await?;

        // 3–4. Run the extractor; the model call records usage and provider health whatever
        // the outcome.
        let answer = match (&extractor, request) {
            (Extractor::Rules, _) => Answer {
                output: rules::extract(&version, &manifest),
                request_id,
                provider_request_id: None,
                repaired: false,
                input_tokens: 0,
                output_tokens: 0,
            },
            (Extractor::Model(model), Some(request)) => {
                let timeout = Duration::from_millis(self.config.learning.execution.timeout_ms);
                let called = model_call::call_for_job(
                    &ctx,
                    &self.client,
                    model,
                    &request,
                    timeout,
                    Some(&snapshot.project_id),
                    |value| {
                        serde_json::from_value::<ExtractionOutput>(value.clone())
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    },
                )
                .await?;
                match called {
                    Ok(response) => {
                        let output: ExtractionOutput = serde_json::from_value(response.value)
                            .map_err(|e| {
                                JobError::permanent(format!(
                                    "the validated answer did not decode: {e}"
                                ))
                            })?;
                        Answer {
                            output,
                            request_id,
                            provider_request_id: response.provider_request_id,
                            repaired: response.repaired,
                            input_tokens: response.usage.input_tokens,
                            output_tokens: response.usage.output_tokens,
                        }
                    }
                    Err(failure) => {
                        self.record_outcome(
                            &ctx,
                            &scope,
                            &request_id,
                            provider_failure_outcome(&failure),
                        )
                        .await?;
                        return Err(model_call::job_error(&failure, ctx.ledger.now_ms()));
                    }
                }
            }
            (Extractor::Model(_), None) => unreachable!("a model extractor always has a request"),
        };

        // 5. Validation against the exact manifest.
        let validated = match validate(&answer.output, &manifest) {
            Ok(validated) => validated,
            Err(whole_job) => {
                let outcome = serde_json::json!({
                    "requestId": answer.request_id, "terminal": "failed", "reason": "validation",
                    "detail": whole_job.to_string(), "providerRequestId": answer.provider_request_id,
                });
                self.record_outcome(&ctx, &scope, &answer.request_id, outcome)
                    .await?;
                return Err(JobError::Permanent {
                    message: format!("the extractor's answer is unusable: {whole_job}"),
                    result: Some(serde_json::json!({ "validation": whole_job.to_string() })),
                });
            }
        };
        for item in &validated.refused_items {
            tracing::warn!(job.id = %job.id, ordinal = item.ordinal, field = %item.field, detail = %item.detail,
                "learning extraction refused experience {}", item.experience_ordinal);
        }

        // 6. Settlement: lease, source and policy rechecked in the same transaction.
        let mut settlement = ctx.begin_settlement().await?;
        let tx = settlement.tx().await?;
        if let Some(reason) = self.settlement_blocker(tx, &snapshot, &manifest).await? {
            return Err(JobError::SourceChanged(reason));
        }
        let now = ctx.ledger.now_ms();
        let stored = experience::insert_extraction_in(
            tx,
            &job.id,
            &snapshot.project_id,
            &snapshot.session_id,
            &version,
            &validated,
            now,
        )
        .await?;
        // New experiences are embedded for semantic recall (when a provider is configured).
        for (_, experience_id) in &stored.experiences {
            zuno_shared::learning::recall::semantic::admit_in(
                &ctx.ledger,
                tx,
                &self.config,
                &snapshot.project_id,
                experience_id,
                job.origin,
            )
            .await?;
        }
        // Only completed extractions enter memory maintenance.
        if stored.verified > 0 {
            let trigger = stored
                .experiences
                .last()
                .map(|(_, id)| id.clone())
                .unwrap_or_default();
            zuno_shared::memory::maintenance::admit_in(
                &ctx.ledger,
                tx,
                &snapshot.project_id,
                &trigger,
            )
            .await?;
            // The slow path's project check also runs after each successful extraction.
            zuno_shared::skills::schedule::admit_project_check_in(
                &ctx.ledger,
                tx,
                self.config.learning.aggregation.interval_ms,
                &snapshot.project_id,
                zuno_shared::ledger::JobOrigin::Explicit,
            )
            .await?;
        }
        let result = result_json(&version, &answer, &validated, &stored);
        let mut outcome = result.clone();
        outcome["requestId"] = serde_json::json!(answer.request_id);
        outcome["terminal"] = serde_json::json!("completed");
        events::append_in(tx, events::EXTRACTION_OUTCOME, &scope, &outcome, now).await?;
        let settled = settlement.complete(result).await?;
        let metrics = zuno_shared::telemetry::metrics::learning();
        for _ in 0..stored.verified {
            metrics.experience("verified");
        }
        for _ in 0..stored.unverified {
            metrics.experience("unverified");
        }
        metrics.refused(validated.refused_items.len() as u64);
        Ok(settled)
    }
}

impl ExtractHandler {
    /// Why the result must not commit, if it must not: the session or project is gone, the
    /// session's generation policy no longer allows learning, or the source changed.
    async fn settlement_blocker(
        &self,
        tx: &mut Tx,
        snapshot: &SourceSnapshot,
        manifest: &SourceManifest,
    ) -> Result<Option<String>, JobError> {
        let project: Option<String> = zuno_shared::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT project_id FROM session WHERE id = $1"
        )
        .bind(&snapshot.session_id)
        .fetch_optional(conn)
        .await)?;
        if project.as_deref() != Some(snapshot.project_id.as_str()) {
            return Err(JobError::permanent(
                "no durable project or session for this extraction",
            ));
        }
        let current =
            policy::effective_in(tx, &snapshot.session_id, &self.config.learning, 0).await?;
        if current.generation != policy::Generation::Enabled {
            return Ok(Some(format!(
                "learning generation became `{}` for this session",
                current.generation.as_str()
            )));
        }
        Ok(match snapshot.check_in(tx).await? {
            SourceCheck::Current(now) if now.digest == manifest.digest => None,
            SourceCheck::Current(_) => Some(String::from(
                "the source manifest changed during extraction",
            )),
            SourceCheck::Changed(reason) | SourceCheck::Unavailable(reason) => Some(reason),
        })
    }

    async fn record_outcome(
        &self,
        ctx: &JobContext,
        scope: &EventScope<'_>,
        request_id: &str,
        mut outcome: serde_json::Value,
    ) -> Result<(), JobError> {
        outcome["requestId"] = serde_json::json!(request_id);
        let mut tx = ctx.fenced_tx().await?;
        events::append_in(
            &mut tx,
            events::EXTRACTION_OUTCOME,
            scope,
            &outcome,
            ctx.ledger.now_ms(),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

fn provider_failure_outcome(failure: &ProviderFailure) -> serde_json::Value {
    serde_json::json!({
        "terminal": if failure.is_permanent() { "failed" } else { "retry" },
        "errorClass": model_call::error_class(&failure.error),
        "error": failure.error.to_string(),
        "diagnostic": failure.error.diagnostic(),
        "providerRequestId": failure.provider_request_id,
        "requests": failure.requests,
        "usage": { "inputTokens": failure.usage.input_tokens, "outputTokens": failure.usage.output_tokens },
    })
}

fn result_json(
    version: &str,
    answer: &Answer,
    validated: &ValidatedExtraction,
    stored: &experience::StoredExtraction,
) -> serde_json::Value {
    let verified: std::collections::HashMap<i64, bool> = validated
        .experiences
        .iter()
        .map(|e| (e.ordinal, e.verified))
        .collect();
    serde_json::json!({
        "extractorVersion": version,
        "experiences": stored.experiences.iter().map(|(ordinal, id)| serde_json::json!({
            "ordinal": ordinal, "id": id, "verified": verified.get(ordinal).copied().unwrap_or(false),
        })).collect::<Vec<_>>(),
        "verified": stored.verified,
        "unverified": stored.unverified,
        "memoryHints": stored.hints,
        "reinforced": stored.reinforced.iter().map(|(ordinal, id)| serde_json::json!({
            "ordinal": ordinal, "experienceId": id,
        })).collect::<Vec<_>>(),
        "refusedItems": validated.refused_items,
        "truncated": validated.truncated,
        "repaired": answer.repaired,
        "providerRequestId": answer.provider_request_id,
        "usage": { "inputTokens": answer.input_tokens, "outputTokens": answer.output_tokens },
    })
}
