//! `LearningIngestion::repair_history` and start-up catch-up: bringing a project's extractions
//! made by an older extractor version, and recent closed turns that have no extraction job of
//! the current version, up to the current extractor.
//!
//! Repair examines at most 32 legacy extraction jobs of one project (queued, completed, skipped
//! or failed; running and uncertain jobs are left alone). Exact old citations are revalidated
//! against their source addresses, excerpts and recorded raw digests without a model call; an
//! edited source does not regain verification just because the quote still appears. Fresh
//! extraction is admitted only where the source is still available and eligible and no
//! current-version job exists. A dry run performs the same checks and changes nothing.

use serde::Serialize;

use super::store::{self, Inspection, LegacyJob};
use super::{LearningIngestion, TurnOutcome};
use crate::db::Tx;
use crate::learning::experience::Verification;
use crate::learning::experience::store as experience;
use crate::learning::policy;
use crate::ledger::{Admission, JobIdentity, JobOrigin, JobState};
use crate::text::redact::redact;
use crate::text::sha256;
use crate::transcript::{MessageStatus, Part, TranscriptError};

/// At most this many legacy jobs per repair invocation.
pub const REPAIR_BATCH: i64 = 32;
/// Start-up checks at most this many recent completed turns.
pub const CATCH_UP_LIMIT: i64 = 64;
const CATCH_UP_WINDOW_MS: i64 = 7 * 86_400_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepairAction {
    pub job_id: String,
    /// `would_revalidate`, `revalidated`, `would_queue`, `queued`, `existing`, `excluded`,
    /// `unavailable` or `unchanged`.
    pub action: String,
    pub detail: Option<String>,
    /// The admitted (or existing) current-version job, when there is one.
    pub current_job_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepairReport {
    pub dry_run: bool,
    pub extractor_version: String,
    pub examined: i64,
    pub revalidated_experiences: i64,
    pub queued: i64,
    pub would_queue: i64,
    pub unavailable: i64,
    pub excluded: i64,
    pub has_more: bool,
    pub actions: Vec<RepairAction>,
}

impl RepairAction {
    fn of(
        job: &LegacyJob,
        action: &str,
        detail: Option<String>,
        current: Option<String>,
    ) -> RepairAction {
        RepairAction {
            job_id: job.id.clone(),
            action: action.to_owned(),
            detail,
            current_job_id: current,
        }
    }
}

impl LearningIngestion {
    pub async fn repair_history(
        &self,
        project_id: &str,
        dry_run: bool,
    ) -> Result<RepairReport, TranscriptError> {
        let version = self.extractor_version();
        let mut report = RepairReport {
            dry_run,
            extractor_version: version.to_owned(),
            ..RepairReport::default()
        };
        let mut tx = if dry_run {
            self.store.db().begin_read().await?
        } else {
            self.store.db().begin().await?
        };
        let mut legacy =
            store::legacy_jobs_in(&mut tx, project_id, version, REPAIR_BATCH + 1).await?;
        if legacy.len() as i64 > REPAIR_BATCH {
            report.has_more = true;
            legacy.truncate(REPAIR_BATCH as usize);
        }
        let now = self.ledger.now_ms();
        for job in legacy {
            report.examined += 1;
            let action = self
                .repair_one_in(&mut tx, project_id, &job, dry_run, now, &mut report)
                .await?;
            if !dry_run {
                let record = store::RepairRecord {
                    job_id: &job.id,
                    extractor_version: version,
                    outcome: &action.action,
                    detail: action.detail.as_deref(),
                };
                store::record_repair_in(&mut tx, &record, now).await?;
            }
            report.actions.push(action);
        }
        if dry_run {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(report)
    }

    async fn repair_one_in(
        &self,
        tx: &mut Tx,
        project_id: &str,
        job: &LegacyJob,
        dry_run: bool,
        now: i64,
        report: &mut RepairReport,
    ) -> Result<RepairAction, TranscriptError> {
        let action = |action: &str, detail: Option<String>, current: Option<String>| {
            RepairAction::of(job, action, detail, current)
        };
        let (Some(session_id), Some(message_id)) = (&job.session_id, &job.source_message_id) else {
            report.unavailable += 1;
            return Ok(action(
                "unavailable",
                Some(String::from("the job names no source message")),
                None,
            ));
        };
        let policy = policy::effective_in(tx, session_id, &self.config.learning, now).await?;
        if policy.generation != policy::Generation::Enabled {
            report.excluded += 1;
            return Ok(action(
                "excluded",
                Some(format!("generation is `{}`", policy.generation.as_str())),
                None,
            ));
        }
        // Revalidate exact old evidence of a completed job without a model request.
        let mut revalidated = 0;
        if job.state == JobState::Completed {
            revalidated = self
                .revalidate_job_evidence_in(tx, &job.id, dry_run, now)
                .await?;
            report.revalidated_experiences += revalidated;
        }
        let Some(message) = self.closed_source_in(tx, message_id).await? else {
            report.unavailable += 1;
            return Ok(action(
                "unavailable",
                Some(String::from(
                    "the source message is gone or no longer closed",
                )),
                None,
            ));
        };
        if let Some(existing) = self
            .current_job_in(tx, project_id, session_id, message_id)
            .await?
        {
            return Ok(action("existing", None, Some(existing)));
        }
        if job.state == JobState::Completed && revalidated > 0 {
            let verb = if dry_run {
                "would_revalidate"
            } else {
                "revalidated"
            };
            return Ok(action(
                verb,
                Some(format!(
                    "{revalidated} experiences revalidated from exact evidence"
                )),
                None,
            ));
        }
        if dry_run {
            report.would_queue += 1;
            return Ok(action("would_queue", None, None));
        }
        self.readmit_in(tx, job, &message, report).await
    }

    /// The job's source message, while it exists and is still closed.
    async fn closed_source_in(
        &self,
        tx: &mut Tx,
        message_id: &str,
    ) -> Result<Option<crate::transcript::Message>, TranscriptError> {
        match self.store.message_in(tx, message_id).await {
            Ok(message) if message.status == MessageStatus::Completed => Ok(Some(message)),
            Ok(_) | Err(TranscriptError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The id of the current extractor version's job for the message, when one exists.
    async fn current_job_in(
        &self,
        tx: &mut Tx,
        project_id: &str,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>, TranscriptError> {
        let identity = JobIdentity::extract(
            project_id,
            session_id,
            message_id,
            self.extractor_version(),
            None,
        );
        Ok(self
            .ledger
            .find_in(tx, &identity)
            .await
            .map_err(super::ledger_error)?
            .map(|existing| existing.id))
    }

    /// Admits a fresh extraction of the legacy job's turn, naming the job it repairs.
    async fn readmit_in(
        &self,
        tx: &mut Tx,
        job: &LegacyJob,
        message: &crate::transcript::Message,
        report: &mut RepairReport,
    ) -> Result<RepairAction, TranscriptError> {
        let window = self.turn_window_in(tx, message).await?;
        let payload = serde_json::json!({ "repairOf": job.id });
        match self
            .admit_window_in(tx, &window, false, JobOrigin::Legacy, None, None, payload)
            .await?
        {
            Ok(admission) => {
                if matches!(admission, Admission::Queued(_)) {
                    report.queued += 1;
                }
                let current = admission.job().id.clone();
                Ok(RepairAction::of(job, "queued", None, Some(current)))
            }
            Err(reason) => {
                report.excluded += 1;
                Ok(RepairAction::of(job, "excluded", Some(reason), None))
            }
        }
    }

    /// Rechecks every citation of a job's experiences against the current source text and its
    /// recorded raw digest; returns how many experiences are (or would be) verified afterwards.
    async fn revalidate_job_evidence_in(
        &self,
        tx: &mut Tx,
        job_id: &str,
        dry_run: bool,
        now: i64,
    ) -> Result<i64, TranscriptError> {
        let evidence = experience::evidence_of_job_in(tx, job_id).await?;
        let mut verdicts: std::collections::BTreeMap<String, (bool, String, String)> =
            std::collections::BTreeMap::new();
        for item in evidence {
            let ok = self.evidence_still_exact_in(tx, &item).await?;
            let entry = verdicts.entry(item.experience_id.clone()).or_insert((
                true,
                item.verification.clone(),
                item.status.clone(),
            ));
            entry.0 &= ok;
        }
        let mut verified = 0;
        for (experience_id, (ok, current, status)) in verdicts {
            // Forgotten experiences are never reverified.
            if status == "forgotten" {
                continue;
            }
            let next = if ok {
                Verification::Verified
            } else {
                Verification::Unverified
            };
            if ok {
                verified += 1;
            }
            if !dry_run && next.as_str() != current {
                experience::set_verification_in(tx, &experience_id, next, now).await?;
            }
        }
        Ok(verified)
    }

    async fn evidence_still_exact_in(
        &self,
        tx: &mut Tx,
        item: &experience::JobEvidenceRow,
    ) -> Result<bool, TranscriptError> {
        let (Some(message_id), Some(address), Some(raw_digest)) =
            (&item.message_id, &item.address, &item.raw_digest)
        else {
            return Ok(false);
        };
        let message = match self.store.message_in(tx, message_id).await {
            Ok(message) => message,
            Err(TranscriptError::NotFound { .. }) => return Ok(false),
            Err(error) => return Err(error),
        };
        // Address: message:<id>:part:<ordinal>[:arguments|:result]
        let mut fields = address.split(':');
        let (Some("message"), Some(_), Some("part"), Some(ordinal)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Ok(false);
        };
        let suffix = fields.next();
        let Ok(ordinal) = ordinal.parse::<i64>() else {
            return Ok(false);
        };
        let Some(stored) = message.parts.iter().find(|p| p.ordinal == ordinal) else {
            return Ok(false);
        };
        let raw = match (&stored.part, suffix) {
            (Part::Text { text, .. } | Part::Error { text }, None) => text.clone(),
            (
                Part::ToolCall {
                    tool_name,
                    arguments,
                    ..
                },
                Some("arguments"),
            ) => format!("{tool_name} {arguments}"),
            (
                Part::ToolCall {
                    result: Some(result),
                    ..
                },
                Some("result"),
            ) => result.clone(),
            (Part::Artifact { name, uri, text }, None) => {
                [Some(name.as_str()), uri.as_deref(), text.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join("\n")
            }
            _ => return Ok(false),
        };
        Ok(&sha256(&raw) == raw_digest && redact(&raw).text.contains(&item.excerpt))
    }

    /// Start-up catch-up: checks up to 64 completed assistant turns from the last seven days
    /// that have no current-version extraction job and were not inspected before, and admits the
    /// eligible ones. A turn with nothing to admit (not eligible, or refused by its session's
    /// policy) is recorded as inspected, so the next start-up moves on to older turns instead of
    /// re-reading the same newest ones forever. While automatic extraction is switched off
    /// globally, eligible turns are left unrecorded: they are admitted once it is switched on.
    pub async fn catch_up(&self) -> Result<Vec<TurnOutcome>, TranscriptError> {
        let now = self.ledger.now_ms();
        let window = store::CatchUpWindow {
            since: now - CATCH_UP_WINDOW_MS,
            extractor_version: self.extractor_version(),
            limit: CATCH_UP_LIMIT,
        };
        let ids = store::turns_to_catch_up(self.store.db(), &window).await?;
        let mut outcomes = Vec::new();
        for id in ids {
            let mut tx = self.store.db().begin().await?;
            let message = self.store.message_in(&mut tx, &id).await?;
            let outcome = self
                .close_turn_in(&mut tx, message, JobOrigin::ClosedTurn, false, None)
                .await?;
            if let Some(inspection) = self.nothing_to_admit(&outcome) {
                store::record_inspection_in(&mut tx, &id, inspection, now).await?;
            }
            tx.commit().await?;
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Why catch-up need never look at this turn again, if so.
    fn nothing_to_admit(&self, outcome: &TurnOutcome) -> Option<Inspection> {
        if outcome.admission.is_some() {
            return None;
        }
        let eligible = outcome.eligibility.as_ref().is_some_and(|e| e.eligible);
        if !eligible {
            return Some(Inspection::NotEligible);
        }
        match &outcome.not_admitted {
            Some(reason) if self.config.learning.post_turn_enabled() => {
                Some(Inspection::NotAdmitted(reason.clone()))
            }
            _ => None,
        }
    }
}
