//! The extraction job: one closed turn's bound source in, cited Experience out.
//!
//! 1. The bound manifest, rebuilt from stored rows by the claim gate in the claim transaction
//!    (or here, when the job was claimed without it); a changed source is skipped.
//! 2. Persist the exact manifest and a `learning.extraction.request` event on the job, fenced by
//!    the lease, before any provider request (one transaction with step 1's reads).
//! 3. Run the extractor: the built-in rules (`rules-1`) or the model (`model-1`), the latter
//!    with no tools, no filesystem and no foreground identity.
//! 4. Record token usage and provider health, whatever the outcome.
//! 5. Validate the answer against the manifest (per-item refusal, exact-excerpt citations).
//! 6. Settle in one transaction that proves the lease, rechecks the source and the session's
//!    policy, stores experiences, evidence and raw memory hints idempotently by
//!    `(job, ordinal)`, and appends the `learning.extraction.outcome` event.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use zuno_shared::config::Config;
use zuno_shared::db::Tx;
use zuno_shared::learning::events::{self, EventScope};
use zuno_shared::learning::extraction::ExtractionOutput;
use zuno_shared::learning::manifest::{self, SourceManifest};
use zuno_shared::learning::validate::{RefusedItem, ValidatedExtraction, validate};
use zuno_shared::learning::{
    CheckedSource, RULES_EXTRACTOR_VERSION, SourceCheck, SourceSnapshot, experience, policy, rules,
};
use zuno_shared::ledger::{Job, JobKind};
use zuno_shared::provider::Diagnostic;
use zuno_shared::runtime::{JobContext, JobError, JobHandler, model_call};
use zuno_shared::transcript;

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

/// The job's bound source, rebuilt from stored rows and still current.
struct Bound {
    snapshot: SourceSnapshot,
    manifest: SourceManifest,
    /// The model the session's host reported: the learning model may follow it.
    session_model: Option<String>,
}

/// What one extractor run produced.
struct Answer {
    output: ExtractionOutput,
    request_id: String,
    provider_request_id: Option<String>,
    repaired: bool,
    usage: TokenUsage,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenUsage {
    input_tokens: u64,
    output_tokens: u64,
}

/// What an extraction asks for, durable before any provider call: the built-in rules' receipt,
/// or the provider client's (endpoint, parameters, the exact prompt and its digest).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
enum Receipt {
    Rules(RulesReceipt),
    Model(serde_json::Map<String, serde_json::Value>),
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct RulesReceipt {
    request_id: String,
    extractor: String,
    /// Always `null`: the rules call no provider.
    provider: Option<String>,
    model: Option<String>,
    prompt_sha256: String,
    response_contract: RulesContract,
    tools: [String; 0],
}

#[derive(Debug, Clone, Serialize)]
struct RulesContract {
    schema: &'static str,
    mode: &'static str,
}

impl Receipt {
    fn request_id(&self) -> &str {
        match self {
            Receipt::Rules(rules) => &rules.request_id,
            Receipt::Model(map) => map
                .get("requestId")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default(),
        }
    }
}

/// The `learning.extraction.request` event: the receipt and what the attempt was bound to.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RequestEvent<'a> {
    #[serde(flatten)]
    receipt: &'a Receipt,
    attempt: i64,
    extractor_version: &'a str,
    manifest_digest: &'a str,
}

/// The result of a completed extraction, as the job stores it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExtractionResult<'a> {
    extractor_version: &'a str,
    experiences: Vec<StoredExperience<'a>>,
    verified: usize,
    unverified: usize,
    memory_hints: usize,
    reinforced: Vec<ReinforcedExperience<'a>>,
    refused_items: &'a [RefusedItem],
    truncated: usize,
    repaired: bool,
    provider_request_id: Option<&'a str>,
    usage: TokenUsage,
}

#[derive(Serialize)]
struct StoredExperience<'a> {
    ordinal: i64,
    id: &'a str,
    verified: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReinforcedExperience<'a> {
    ordinal: i64,
    experience_id: &'a str,
}

/// The `learning.extraction.outcome` event of a completed extraction: its result, closed by
/// the request it answers.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CompletedOutcome<'a> {
    #[serde(flatten)]
    result: &'a ExtractionResult<'a>,
    request_id: &'a str,
    terminal: &'static str,
}

/// The outcome event of an answer that failed validation as a whole.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InvalidOutcome<'a> {
    request_id: &'a str,
    terminal: &'static str,
    reason: &'static str,
    detail: String,
    provider_request_id: Option<&'a str>,
}

/// The outcome event of a provider call that failed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProviderFailureOutcome<'a> {
    /// `failed` or `retry`.
    terminal: &'static str,
    error_class: &'static str,
    error: String,
    diagnostic: Option<&'a Diagnostic>,
    provider_request_id: Option<&'a str>,
    requests: u32,
    usage: TokenUsage,
    request_id: &'a str,
}

fn to_json(value: &impl Serialize) -> Result<serde_json::Value, JobError> {
    serde_json::to_value(value)
        .map_err(|e| JobError::permanent(format!("an extraction record did not encode: {e}")))
}

#[async_trait::async_trait]
impl JobHandler for ExtractHandler {
    fn kind(&self) -> JobKind {
        JobKind::Extract
    }

    async fn run(&self, ctx: JobContext) -> Result<Job, JobError> {
        let job = ctx.job().clone();
        // 1. The bound source, in the lease-proven transaction that records the request.
        let mut tx = ctx.fenced_tx().await?;
        let bound = bound_source_in(&mut tx, &ctx).await?;
        let version = job
            .extractor_version
            .clone()
            .unwrap_or_else(|| RULES_EXTRACTOR_VERSION.to_owned());
        let scope = EventScope {
            project_id: Some(&bound.snapshot.project_id),
            session_id: Some(&bound.snapshot.session_id),
            job_id: Some(&job.id),
            message_id: Some(&bound.snapshot.end_message_id),
        };
        let extractor = self.extractor(&version, bound.session_model.as_deref())?;
        // 2. The exact input and the request receipt, durable before any provider call.
        let (request, receipt) = build_request(&extractor, &version, &bound.manifest);
        record_request_in(&mut tx, &ctx, &scope, &receipt, &version, &bound.manifest).await?;
        tx.commit().await?;
        // 3–4. Run the extractor; the model call records usage and provider health whatever
        // the outcome.
        let request_id = receipt.request_id().to_owned();
        let answer = match (&extractor, request) {
            (Extractor::Rules, _) => Answer {
                output: rules::extract(&version, &bound.manifest),
                request_id,
                provider_request_id: None,
                repaired: false,
                usage: TokenUsage::default(),
            },
            (Extractor::Model(model), Some(request)) => {
                self.ask_model(&ctx, &scope, &bound, model, &request, request_id)
                    .await?
            }
            (Extractor::Model(_), None) => unreachable!("a model extractor always has a request"),
        };
        // 5. Validation against the exact manifest.
        let validated = self
            .validate_answer(&ctx, &scope, &answer, &bound.manifest)
            .await?;
        // 6. Settlement: lease, source and policy rechecked in the same transaction.
        self.settle(&ctx, &scope, &bound, &version, &answer, &validated)
            .await
    }
}

/// The job's bound source: as the claim gate checked it in the claim transaction, or rebuilt
/// from stored rows when the job was claimed without that gate. A changed or unavailable source
/// skips the job.
async fn bound_source_in(tx: &mut Tx, ctx: &JobContext) -> Result<Bound, JobError> {
    let (snapshot, manifest) = match ctx.gate_findings::<CheckedSource>() {
        Some(checked) => (checked.snapshot.clone(), checked.manifest.clone()),
        None => {
            let snapshot = SourceSnapshot::load_in(tx, &ctx.job().id)
                .await?
                .ok_or_else(|| {
                    JobError::SourceChanged(String::from("the job has no bound source snapshot"))
                })?;
            match snapshot.check_in(tx).await? {
                SourceCheck::Current(manifest) => (snapshot, manifest),
                SourceCheck::Changed(reason) | SourceCheck::Unavailable(reason) => {
                    return Err(JobError::SourceChanged(reason));
                }
            }
        }
    };
    let session_model = transcript::session_model_in(tx, &snapshot.session_id).await?;
    Ok(Bound {
        snapshot,
        manifest,
        session_model,
    })
}

/// The provider request (none for the rules) and the receipt that records it.
fn build_request(
    extractor: &Extractor,
    version: &str,
    manifest: &SourceManifest,
) -> (Option<LearningRequest>, Receipt) {
    match extractor {
        Extractor::Rules => {
            let receipt = RulesReceipt {
                request_id: uuid::Uuid::new_v4().to_string(),
                extractor: version.to_owned(),
                provider: None,
                model: None,
                prompt_sha256: manifest.digest.clone(),
                response_contract: RulesContract {
                    schema: prompt::SCHEMA_NAME,
                    mode: "local-rules",
                },
                tools: [],
            };
            (None, Receipt::Rules(receipt))
        }
        Extractor::Model(model) => {
            let (system, user) = prompt::build(manifest, model.native_structured_output);
            let request = LearningRequest {
                system,
                user,
                schema_name: prompt::SCHEMA_NAME.to_owned(),
                schema: zuno_shared::learning::extraction::output_schema(),
            };
            let receipt = match LearningModelClient::receipt(model, &request) {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            (Some(request), Receipt::Model(receipt))
        }
    }
}

/// Persists the exact manifest and the `learning.extraction.request` event in `tx`, the
/// lease-proven transaction the caller commits.
async fn record_request_in(
    tx: &mut Tx,
    ctx: &JobContext,
    scope: &EventScope<'_>,
    receipt: &Receipt,
    version: &str,
    manifest: &SourceManifest,
) -> Result<(), JobError> {
    let event = to_json(&RequestEvent {
        receipt,
        attempt: ctx.lease().attempt,
        extractor_version: version,
        manifest_digest: &manifest.digest,
    })?;
    manifest::persist_in(tx, &ctx.job().id, manifest).await?;
    events::append_in(
        tx,
        events::EXTRACTION_REQUEST,
        scope,
        &event,
        ctx.ledger.now_ms(),
    )
    .await?;
    Ok(())
}

impl ExtractHandler {
    /// The extractor `version` names: the built-in rules, or the learning model (which may
    /// follow the session's model). No usable model fails the job for good.
    fn extractor(&self, version: &str, session_model: Option<&str>) -> Result<Extractor, JobError> {
        if rules::is_rules_version(version) {
            return Ok(Extractor::Rules);
        }
        match resolve_model(&self.config, session_model) {
            Ok(model) => Ok(Extractor::Model(Box::new(model))),
            Err(unavailable) => Err(JobError::Permanent {
                message: format!("learning model unavailable: {unavailable}"),
                result: Some(serde_json::json!({ "extractorVersion": version })),
            }),
        }
    }

    /// Asks the model through the job's model call; a failed call records its outcome event
    /// before the job fails or retries.
    async fn ask_model(
        &self,
        ctx: &JobContext,
        scope: &EventScope<'_>,
        bound: &Bound,
        model: &ResolvedModel,
        request: &LearningRequest,
        request_id: String,
    ) -> Result<Answer, JobError> {
        let timeout = Duration::from_millis(self.config.learning.execution.timeout_ms);
        let called = model_call::call_for_job(
            ctx,
            &self.client,
            model,
            request,
            timeout,
            Some(&bound.snapshot.project_id),
            |value| {
                serde_json::from_value::<ExtractionOutput>(value.clone())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        match called {
            Ok(response) => {
                let output: ExtractionOutput =
                    serde_json::from_value(response.value).map_err(|e| {
                        JobError::permanent(format!("the validated answer did not decode: {e}"))
                    })?;
                Ok(Answer {
                    output,
                    request_id,
                    provider_request_id: response.provider_request_id,
                    repaired: response.repaired,
                    usage: TokenUsage {
                        input_tokens: response.usage.input_tokens,
                        output_tokens: response.usage.output_tokens,
                    },
                })
            }
            Err(failure) => {
                let outcome = provider_failure_outcome(&failure, &request_id);
                record_outcome(ctx, scope, &to_json(&outcome)?).await?;
                Err(model_call::job_error(&failure, ctx.ledger.now_ms()))
            }
        }
    }

    /// Validates the answer against the exact manifest; an answer unusable as a whole records
    /// its outcome event and fails the job for good. Refused items are logged and left out.
    async fn validate_answer(
        &self,
        ctx: &JobContext,
        scope: &EventScope<'_>,
        answer: &Answer,
        manifest: &SourceManifest,
    ) -> Result<ValidatedExtraction, JobError> {
        let validated = match validate(&answer.output, manifest) {
            Ok(validated) => validated,
            Err(whole_job) => {
                let outcome = InvalidOutcome {
                    request_id: &answer.request_id,
                    terminal: "failed",
                    reason: "validation",
                    detail: whole_job.to_string(),
                    provider_request_id: answer.provider_request_id.as_deref(),
                };
                record_outcome(ctx, scope, &to_json(&outcome)?).await?;
                return Err(JobError::Permanent {
                    message: format!("the extractor's answer is unusable: {whole_job}"),
                    result: Some(serde_json::json!({ "validation": whole_job.to_string() })),
                });
            }
        };
        for item in &validated.refused_items {
            tracing::warn!(
                job.id = %ctx.job().id,
                ordinal = item.ordinal,
                field = %item.field,
                detail = %item.detail,
                "learning extraction refused experience {}",
                item.experience_ordinal
            );
        }
        Ok(validated)
    }

    /// Settles the job in one transaction that proves the lease, rechecks the source and the
    /// session's policy, stores the experiences and admits the work they start, and appends the
    /// outcome event.
    async fn settle(
        &self,
        ctx: &JobContext,
        scope: &EventScope<'_>,
        bound: &Bound,
        version: &str,
        answer: &Answer,
        validated: &ValidatedExtraction,
    ) -> Result<Job, JobError> {
        let mut settlement = ctx.begin_settlement().await?;
        let tx = settlement.tx().await?;
        if let Some(reason) = self
            .settlement_blocker(tx, &bound.snapshot, &bound.manifest)
            .await?
        {
            return Err(JobError::SourceChanged(reason));
        }
        let now = ctx.ledger.now_ms();
        let (stored, reinforcements) = experience::stage_extraction_in(
            tx,
            &ctx.job().id,
            &bound.snapshot.project_id,
            &bound.snapshot.session_id,
            version,
            validated,
            now,
        )
        .await?;
        self.admit_follow_ups_in(ctx, tx, &bound.snapshot.project_id, &stored)
            .await?;
        let result = extraction_result(version, answer, validated, &stored);
        let outcome = CompletedOutcome {
            result: &result,
            request_id: &answer.request_id,
            terminal: "completed",
        };
        events::append_in(
            tx,
            events::EXTRACTION_OUTCOME,
            scope,
            &to_json(&outcome)?,
            now,
        )
        .await?;
        reinforcements.apply_in(tx).await?;
        let settled = settlement.complete(to_json(&result)?).await?;
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

    /// The work stored experiences start, in the settlement transaction: embedding for semantic
    /// recall (when a provider is configured), and, for completed extractions only, memory
    /// maintenance and the slow path's project check.
    async fn admit_follow_ups_in(
        &self,
        ctx: &JobContext,
        tx: &mut Tx,
        project_id: &str,
        stored: &experience::StoredExtraction,
    ) -> Result<(), JobError> {
        for (_, experience_id) in &stored.experiences {
            zuno_shared::learning::recall::semantic::admit_in(
                &ctx.ledger,
                tx,
                &self.config,
                project_id,
                experience_id,
                ctx.job().origin,
            )
            .await?;
        }
        if stored.verified == 0 {
            return Ok(());
        }
        let trigger = stored
            .experiences
            .last()
            .map(|(_, id)| id.clone())
            .unwrap_or_default();
        zuno_shared::memory::maintenance::admit_in(&ctx.ledger, tx, project_id, &trigger).await?;
        zuno_shared::skills::schedule::admit_project_check_in(
            &ctx.ledger,
            tx,
            self.config.learning.aggregation.interval_ms,
            project_id,
            zuno_shared::ledger::JobOrigin::Explicit,
        )
        .await?;
        Ok(())
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
        let (project, current) = policy::session_project_and_effective_in(
            tx,
            &snapshot.session_id,
            &self.config.learning,
            0,
        )
        .await?;
        if project.as_deref() != Some(snapshot.project_id.as_str()) {
            return Err(JobError::permanent(
                "no durable project or session for this extraction",
            ));
        }
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
}

/// Appends a `learning.extraction.outcome` event for an attempt that ends without settling,
/// fenced by the lease.
async fn record_outcome(
    ctx: &JobContext,
    scope: &EventScope<'_>,
    outcome: &serde_json::Value,
) -> Result<(), JobError> {
    let mut tx = ctx.fenced_tx().await?;
    events::append_in(
        &mut tx,
        events::EXTRACTION_OUTCOME,
        scope,
        outcome,
        ctx.ledger.now_ms(),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

fn provider_failure_outcome<'a>(
    failure: &'a ProviderFailure,
    request_id: &'a str,
) -> ProviderFailureOutcome<'a> {
    ProviderFailureOutcome {
        terminal: if failure.is_permanent() {
            "failed"
        } else {
            "retry"
        },
        error_class: model_call::error_class(&failure.error),
        error: failure.error.to_string(),
        diagnostic: failure.error.diagnostic(),
        provider_request_id: failure.provider_request_id.as_deref(),
        requests: failure.requests,
        usage: TokenUsage {
            input_tokens: failure.usage.input_tokens,
            output_tokens: failure.usage.output_tokens,
        },
        request_id,
    }
}

fn extraction_result<'a>(
    version: &'a str,
    answer: &'a Answer,
    validated: &'a ValidatedExtraction,
    stored: &'a experience::StoredExtraction,
) -> ExtractionResult<'a> {
    let verified: std::collections::HashMap<i64, bool> = validated
        .experiences
        .iter()
        .map(|e| (e.ordinal, e.verified))
        .collect();
    ExtractionResult {
        extractor_version: version,
        experiences: stored
            .experiences
            .iter()
            .map(|(ordinal, id)| StoredExperience {
                ordinal: *ordinal,
                id,
                verified: verified.get(ordinal).copied().unwrap_or(false),
            })
            .collect(),
        verified: stored.verified,
        unverified: stored.unverified,
        memory_hints: stored.hints,
        reinforced: stored
            .reinforced
            .iter()
            .map(|(ordinal, id)| ReinforcedExperience {
                ordinal: *ordinal,
                experience_id: id,
            })
            .collect(),
        refused_items: &validated.refused_items,
        truncated: validated.truncated,
        repaired: answer.repaired,
        provider_request_id: answer.provider_request_id.as_deref(),
        usage: answer.usage,
    }
}

#[cfg(test)]
mod tests {
    //! Stored request and outcome events are read back by replay and by the learning views, so
    //! the typed records must write exactly the JSON text (keys and their order) the handler
    //! wrote when it assembled these documents by key.
    use serde_json::json;
    use zuno_shared::provider::{ProviderError, Usage};

    use super::*;

    #[test]
    fn the_rules_request_event_keeps_its_stored_shape() {
        let receipt = Receipt::Rules(RulesReceipt {
            request_id: String::from("req-1"),
            extractor: String::from("rules-2"),
            provider: None,
            model: None,
            prompt_sha256: String::from("digest"),
            response_contract: RulesContract {
                schema: prompt::SCHEMA_NAME,
                mode: "local-rules",
            },
            tools: [],
        });
        let typed = to_json(&RequestEvent {
            receipt: &receipt,
            attempt: 2,
            extractor_version: "rules-2",
            manifest_digest: "digest",
        })
        .unwrap();
        let mut by_key = json!({
            "requestId": "req-1",
            "extractor": "rules-2",
            "provider": null,
            "model": null,
            "promptSha256": "digest",
            "responseContract": { "schema": prompt::SCHEMA_NAME, "mode": "local-rules" },
            "tools": [],
        });
        by_key["attempt"] = json!(2);
        by_key["extractorVersion"] = json!("rules-2");
        by_key["manifestDigest"] = json!("digest");
        assert_eq!(typed.to_string(), by_key.to_string());
        assert_eq!(receipt.request_id(), "req-1");
    }

    #[test]
    fn the_model_request_event_appends_to_the_provider_receipt() {
        let provider = json!({
            "requestId": "req-2", "provider": "fake", "model": "fake-model", "tools": [],
            "responseContract": { "schemaName": "zuno_extraction", "mode": "prompt" },
        });
        let receipt = Receipt::Model(provider.as_object().unwrap().clone());
        let typed = to_json(&RequestEvent {
            receipt: &receipt,
            attempt: 1,
            extractor_version: "model-1",
            manifest_digest: "d",
        })
        .unwrap();
        let mut by_key = provider.clone();
        by_key["attempt"] = json!(1);
        by_key["extractorVersion"] = json!("model-1");
        by_key["manifestDigest"] = json!("d");
        assert_eq!(typed.to_string(), by_key.to_string());
        assert_eq!(receipt.request_id(), "req-2");
    }

    #[test]
    fn the_result_and_outcomes_keep_their_stored_shape() {
        let answer = Answer {
            output: ExtractionOutput::default(),
            request_id: String::from("req-3"),
            provider_request_id: Some(String::from("prov-1")),
            repaired: true,
            usage: TokenUsage {
                input_tokens: 900,
                output_tokens: 120,
            },
        };
        let validated = ValidatedExtraction {
            experiences: Vec::new(),
            hints: Vec::new(),
            refused_items: vec![RefusedItem {
                ordinal: 1,
                experience_ordinal: 1,
                field: String::from("experiences.summary"),
                detail: String::from("refused"),
            }],
            truncated: 2,
        };
        let stored = experience::StoredExtraction {
            experiences: vec![(0, String::from("exp_a"))],
            verified: 1,
            unverified: 0,
            hints: 3,
            existing: 0,
            reinforced: vec![(2, String::from("exp_b"))],
        };
        let result = extraction_result("model-1", &answer, &validated, &stored);
        let by_key = json!({
            "extractorVersion": "model-1",
            "experiences": [{ "ordinal": 0, "id": "exp_a", "verified": false }],
            "verified": 1,
            "unverified": 0,
            "memoryHints": 3,
            "reinforced": [{ "ordinal": 2, "experienceId": "exp_b" }],
            "refusedItems": validated.refused_items,
            "truncated": 2,
            "repaired": true,
            "providerRequestId": "prov-1",
            "usage": { "inputTokens": 900, "outputTokens": 120 },
        });
        assert_eq!(to_json(&result).unwrap().to_string(), by_key.to_string());

        let mut outcome = by_key.clone();
        outcome["requestId"] = json!("req-3");
        outcome["terminal"] = json!("completed");
        let typed = CompletedOutcome {
            result: &result,
            request_id: "req-3",
            terminal: "completed",
        };
        assert_eq!(to_json(&typed).unwrap().to_string(), outcome.to_string());

        let invalid = InvalidOutcome {
            request_id: "req-3",
            terminal: "failed",
            reason: "validation",
            detail: String::from("unusable"),
            provider_request_id: None,
        };
        let by_key = json!({
            "requestId": "req-3", "terminal": "failed", "reason": "validation",
            "detail": "unusable", "providerRequestId": null,
        });
        assert_eq!(to_json(&invalid).unwrap().to_string(), by_key.to_string());
    }

    #[test]
    fn the_provider_failure_outcome_keeps_its_stored_shape() {
        let failure = ProviderFailure {
            error: ProviderError::MissingCredential {
                variable: String::from("API_KEY"),
            },
            usage: Usage {
                input_tokens: 5,
                output_tokens: 0,
            },
            requests: 1,
            provider_request_id: None,
        };
        let mut by_key = json!({
            "terminal": if failure.is_permanent() { "failed" } else { "retry" },
            "errorClass": model_call::error_class(&failure.error),
            "error": failure.error.to_string(),
            "diagnostic": failure.error.diagnostic(),
            "providerRequestId": failure.provider_request_id,
            "requests": failure.requests,
            "usage": { "inputTokens": 5, "outputTokens": 0 },
        });
        by_key["requestId"] = json!("req-4");
        let typed = to_json(&provider_failure_outcome(&failure, "req-4")).unwrap();
        assert_eq!(typed.to_string(), by_key.to_string());
    }
}
