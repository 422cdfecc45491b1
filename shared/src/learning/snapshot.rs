//! `LearningSourceSnapshot`: the closed turn an extraction job is bound to — project, session,
//! start and end messages, completion time, terminal message digest and the digest of the exact
//! bounded source manifest — and the claim gate that revalidates it against stored rows inside
//! the ledger's own transactions (`extraction_sources_current_on`).

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::manifest::{self, FeedbackSource, SourceManifest};
use super::{
    MODEL_EXTRACTOR_VERSION, RULES_EXTRACTOR_VERSION, experience, extractor_version, feedback,
    policy, rules, usage,
};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::db::{StoreError, Tx};
use crate::ledger::{ClaimGate, GateDecision, GateFindings, Job, JobKind};
use crate::transcript::{Message, MessageStatus, TranscriptStore};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceSnapshot {
    pub project_id: String,
    pub session_id: String,
    pub start_message_id: String,
    pub end_message_id: String,
    pub start_seq: i64,
    pub end_seq: i64,
    pub completed_at: i64,
    pub terminal_digest: String,
    pub manifest_digest: String,
    /// The `max_input_bytes` the manifest was bounded by.
    pub input_bound: i64,
    /// First message of the turn before the window, bound as read-only context (its messages
    /// run up to `start_seq - 1`); `None` when the snapshot has no context.
    pub context_start_seq: Option<i64>,
}

/// The result of revalidating a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCheck {
    /// Unchanged; here is the manifest, rebuilt from the stored rows.
    Current(SourceManifest),
    Changed(String),
    Unavailable(String),
}

impl SourceSnapshot {
    /// Binds the closed `window` (oldest first, ending with a completed assistant message), the
    /// turn before it as `context`, and their bounded manifest.
    pub fn capture(
        project_id: &str,
        context: &[Message],
        window: &[Message],
        manifest: &SourceManifest,
        input_bound: usize,
    ) -> Option<SourceSnapshot> {
        let first = window.first()?;
        let last = window.last()?;
        Some(SourceSnapshot {
            project_id: project_id.to_owned(),
            session_id: last.session_id.clone(),
            start_message_id: first.id.clone(),
            end_message_id: last.id.clone(),
            start_seq: first.seq,
            end_seq: last.seq,
            completed_at: last.completed_at.unwrap_or(last.created_at),
            terminal_digest: message_digest(last),
            manifest_digest: manifest.digest.clone(),
            input_bound: i64::try_from(input_bound).unwrap_or(i64::MAX),
            context_start_seq: context.first().map(|m| m.seq),
        })
    }

    pub async fn insert_in(&self, tx: &mut Tx, job_id: &str) -> Result<(), StoreError> {
        super::store::snapshot::insert_in(tx, job_id, self).await
    }

    pub async fn load_in(tx: &mut Tx, job_id: &str) -> Result<Option<SourceSnapshot>, StoreError> {
        super::store::snapshot::load_in(tx, job_id).await
    }

    /// Rebuilds the manifest from stored rows in `tx` and compares it with the bound one.
    ///
    /// The context turn and the window are contiguous (`context_start_seq..start_seq` and
    /// `start_seq..=end_seq`), so one statement reads both; the claim gate and the settlement
    /// each run this check for every job.
    pub async fn check_in(&self, tx: &mut Tx) -> Result<SourceCheck, StoreError> {
        let first_seq = match self.context_start_seq {
            Some(start) if start < self.start_seq => start,
            _ => self.start_seq,
        };
        let mut window =
            match TranscriptStore::window_in(tx, &self.session_id, first_seq, self.end_seq).await {
                Ok(window) => window,
                Err(crate::transcript::TranscriptError::Store(error)) => return Err(error),
                Err(other) => return Ok(SourceCheck::Unavailable(other.to_string())),
            };
        let in_window = window.partition_point(|message| message.seq < self.start_seq);
        let context: Vec<Message> = window.drain(..in_window).collect();
        let (Some(first), Some(last)) = (window.first(), window.last()) else {
            return Ok(SourceCheck::Unavailable(String::from(
                "the source messages were deleted",
            )));
        };
        if first.id != self.start_message_id || last.id != self.end_message_id {
            return Ok(SourceCheck::Unavailable(String::from(
                "the source window no longer starts and ends with the bound messages",
            )));
        }
        if last.status != MessageStatus::Completed {
            return Ok(SourceCheck::Changed(format!(
                "the terminal message is now `{}`",
                last.status.as_str()
            )));
        }
        if message_digest(last) != self.terminal_digest {
            return Ok(SourceCheck::Changed(String::from(
                "the terminal message changed",
            )));
        }
        let manifest = manifest_for(
            tx,
            &context,
            &window,
            usize::try_from(self.input_bound).unwrap_or(usize::MAX),
        )
        .await?;
        if manifest.digest != self.manifest_digest {
            return Ok(SourceCheck::Changed(String::from(
                "a source record changed",
            )));
        }
        Ok(SourceCheck::Current(manifest))
    }
}

/// The manifest of a window (with the turn before it as read-only `context`, possibly empty),
/// with current feedback on its terminal message.
pub async fn manifest_for(
    tx: &mut Tx,
    context: &[Message],
    window: &[Message],
    input_bound: usize,
) -> Result<SourceManifest, StoreError> {
    let feedback = match window.last() {
        Some(last) => feedback::load_in(tx, &last.id)
            .await?
            .map(|f| FeedbackSource {
                message_id: f.message_id,
                value: f.value.as_str().to_owned(),
                note: f.note,
                revision: f.revision,
            }),
        None => None,
    };
    Ok(manifest::build_with_context(
        context,
        window,
        feedback.as_ref(),
        input_bound,
    ))
}

/// The `(message id, raw digest)` pairs a manifest cites, for the forgotten-source check.
pub fn cited_sources(manifest: &SourceManifest) -> Vec<(String, String)> {
    manifest
        .records
        .iter()
        .filter_map(|r| r.message_id.clone().map(|m| (m, r.raw_digest.clone())))
        .collect()
}

fn message_digest(message: &Message) -> String {
    let mut hasher = Sha256::new();
    for field in [
        message.id.as_str(),
        message.role.as_str(),
        message.status.as_str(),
        &message.revision.to_string(),
    ] {
        hasher.update(field.as_bytes());
        hasher.update([0x1f]);
    }
    for part in &message.parts {
        hasher.update(part.ordinal.to_le_bytes());
        hasher.update(part.content_digest.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The claim and heartbeat gate of the learning stages. Inside the ledger's transaction it
/// checks, for extraction, in order: a verified snapshot exists; the session's generation policy
/// is `enabled`; the source is unchanged; none of its sources was explicitly forgotten.
/// Maintenance jobs pass only while the project's canonical memory path is the one they were
/// bound to at admission. Last, an automatic job that will call the model must reserve its call
/// under `learning.execution.max_tokens_per_day` (see [`usage::reserve_in`]).
pub struct SourceGate {
    config: Arc<Config>,
    clock: SharedClock,
}

impl SourceGate {
    pub fn new(config: Arc<Config>, clock: SharedClock) -> SourceGate {
        SourceGate { config, clock }
    }
}

#[async_trait]
impl ClaimGate for SourceGate {
    async fn check(&self, tx: &mut Tx, job: &Job) -> Result<GateDecision, StoreError> {
        let skip = |reason: String| Ok(GateDecision::Skip { reason });
        if job.kind == JobKind::Maintain {
            // A maintenance job runs only for the canonical memory path it was admitted for: if
            // the project's worktree moved, its plan would be written somewhere it was not made
            // for.
            if let (Some(project_id), Some(bound)) = (&job.project_id, &job.claim_scope) {
                let current = crate::memory::maintenance::memory_scope_in(tx, project_id).await?;
                if &current != bound {
                    return skip(format!(
                        "the project's memory path moved from {bound} to {current}; maintenance runs for the new path"
                    ));
                }
            }
            if crate::ledger::another_run_in(tx, job).await? {
                // One writer per document: a plan made beside another over the same revision
                // would lose its compare-and-set and spend an attempt.
                return Ok(GateDecision::Defer {
                    until: self.clock.now_ms() + FOLLOW_UP_WAIT_MS,
                    reason: String::from(
                        "another maintenance job of this project's Memory is running",
                    ),
                });
            }
            return self.reserve_tokens(tx, job).await;
        }
        if job.kind.runs_one_at_a_time() && crate::ledger::earlier_run_in(tx, job).await? {
            // Without this wait a follow-up admitted during a run would run beside it and
            // repeat its model call over the same inputs.
            return Ok(GateDecision::Defer {
                until: self.clock.now_ms() + FOLLOW_UP_WAIT_MS,
                reason: String::from("the aggregation run it follows is still running"),
            });
        }
        if job.kind != JobKind::Extract {
            return self.reserve_tokens(tx, job).await;
        }
        let Some(snapshot) = SourceSnapshot::load_in(tx, &job.id).await? else {
            return skip(String::from("the job has no verified source snapshot"));
        };
        let now = self.clock.now_ms();
        let policy =
            policy::effective_in(tx, &snapshot.session_id, &self.config.learning, now).await?;
        if policy.generation != policy::Generation::Enabled {
            return skip(format!(
                "learning generation is `{}` for this session",
                policy.generation.as_str()
            ));
        }
        let manifest = match snapshot.check_in(tx).await? {
            SourceCheck::Current(manifest) => manifest,
            SourceCheck::Changed(reason) => return skip(format!("source changed: {reason}")),
            SourceCheck::Unavailable(reason) => {
                return skip(format!("source unavailable: {reason}"));
            }
        };
        if experience::any_forgotten_in(tx, &cited_sources(&manifest)).await? {
            return skip(String::from(
                "a source of this turn was explicitly forgotten",
            ));
        }
        Ok(match self.reserve_tokens(tx, job).await? {
            // The handler starts from what was checked here instead of rebuilding it.
            GateDecision::Proceed => {
                GateDecision::ProceedWith(GateFindings::new(CheckedSource { snapshot, manifest }))
            }
            other => other,
        })
    }
}

/// What the claim gate checked for an extraction job in the claim transaction: the bound
/// snapshot and the manifest rebuilt from stored rows, found current. Settlement checks the
/// source again in its own transaction, so the attempt may start from these.
#[derive(Debug, Clone)]
pub struct CheckedSource {
    pub snapshot: SourceSnapshot,
    pub manifest: SourceManifest,
}

/// How long a follow-up aggregation waits at most before it looks again whether the run before
/// it ended; that run's settlement makes it due at once.
const FOLLOW_UP_WAIT_MS: i64 = 5_000;

/// How long a job waits when calls in flight hold the rest of today's cap: about when they
/// record their actual spend, which usually leaves room.
const IN_FLIGHT_WAIT_MS: i64 = 30_000;

impl SourceGate {
    /// Whether the job's attempt will ask the model (the rules extractor and the no-model plans
    /// spend nothing).
    fn calls_model(&self, job: &Job) -> bool {
        match job.kind {
            JobKind::Extract => !rules::is_rules_version(
                job.extractor_version
                    .as_deref()
                    .unwrap_or(RULES_EXTRACTOR_VERSION),
            ),
            JobKind::Maintain | JobKind::AggregateProject | JobKind::AggregateGlobal => {
                extractor_version(&self.config) == MODEL_EXTRACTOR_VERSION
            }
            JobKind::Evaluate => true,
            // Embeddings are not model calls: the daily cap counts the model's tokens.
            JobKind::Embed => false,
        }
    }

    /// The daily caps, last: proceeds when there is no cap, the work is manual or spends
    /// nothing, or the call was reserved; defers otherwise, without spending an attempt.
    async fn reserve_tokens(&self, tx: &mut Tx, job: &Job) -> Result<GateDecision, StoreError> {
        let caps = usage::DailyCaps::of(&self.config);
        if !caps.any() || !job.origin.is_automatic() || !self.calls_model(job) {
            return Ok(GateDecision::Proceed);
        }
        let now = self.clock.now_ms();
        let ceiling = usage::call_ceiling(&self.config.learning.execution);
        Ok(
            match usage::reserve_in(tx, &job.id, job.attempts, ceiling, caps, now).await? {
                usage::Reservation::Held => GateDecision::Proceed,
                usage::Reservation::WaitForInFlight { budget } => GateDecision::Defer {
                    until: now + IN_FLIGHT_WAIT_MS,
                    reason: format!(
                        "automatic model calls wait: the calls in flight hold the rest of \
                         today's budget ({})",
                        spent_of(&budget, ceiling, caps)
                    ),
                },
                usage::Reservation::Exhausted { budget } => {
                    let spent = spent_of(&budget, ceiling, caps);
                    tracing::warn!(job.id = %job.id, job.kind = %job.kind, %spent,
                        "today's budget for automatic model calls is spent; learning waits for tomorrow");
                    GateDecision::Defer {
                        until: usage::next_day_start(now),
                        reason: format!(
                            "automatic model calls paused until tomorrow: today's budget is \
                             spent ({spent})"
                        ),
                    }
                }
            },
        )
    }
}

/// Today's spend against each cap in force, for the deferral reason (`learn status` and the
/// job's events show it).
fn spent_of(budget: &usage::AutomaticBudget, ceiling: u64, caps: usage::DailyCaps) -> String {
    let mut parts = Vec::new();
    if let Some(cap) = caps.calls {
        parts.push(format!(
            "{} of {cap} calls done, {} in flight",
            budget.calls_spent, budget.calls_reserved
        ));
    }
    if let Some(cap) = caps.tokens {
        parts.push(format!(
            "{} tokens spent and {} reserved of the {cap}-token cap, one call reserves {ceiling}",
            budget.spent, budget.reserved
        ));
    }
    parts.join("; ")
}
