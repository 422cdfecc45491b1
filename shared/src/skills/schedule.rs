//! Admission of aggregation checks (spec 002 "Slow path"): per project and interval bucket
//! (`learning.aggregation.interval_ms`, 24 h) at most one job is queued at a time, and evidence
//! arriving while one runs schedules exactly one follow-up; one global job per bucket
//! (`learning.global_promotion.interval_ms`, 7 days) and digest of the promoted project
//! evidence. Several hosts checking together admit the same identity, so they share one job.

use super::pattern::{evidence_digest, lock_scope_in, project_key, watermark_in};
use super::{SkillError, SkillService};
use crate::db::{StoreError, Tx};
use crate::ledger::{
    Admission, JobIdentity, JobKind, JobOrigin, JobState, Ledger, LedgerError, NewJob, bucket_start,
};

/// The evidence identity of a project check: the digest of the eligible experiences past the
/// aggregation watermark and of the applied Skills whose evidence disappeared (so a check after
/// an experience was forgotten is new work within the bucket: it proposes the revocation).
pub async fn project_evidence_digest_in(
    tx: &mut Tx,
    project_id: &str,
) -> Result<String, StoreError> {
    let watermark = watermark_in(tx, &project_key(project_id)).await?;
    let mut ids =
        crate::learning::experience::store::evidence_ids_after_in(tx, project_id, watermark)
            .await?;
    for orphaned in super::candidate::orphaned_applied_in(tx, project_id).await? {
        ids.push(format!("revoke:{orphaned}"));
    }
    Ok(evidence_digest(&ids))
}

/// The digest of every promoted project pattern's evidence (the global job identity).
pub async fn promoted_evidence_digest_in(tx: &mut Tx) -> Result<String, StoreError> {
    let rows = super::store::pattern::promoted_evidence_in(tx).await?;
    let keys: Vec<String> = rows.into_iter().map(|(p, e)| format!("{p}:{e}")).collect();
    Ok(evidence_digest(&keys))
}

/// Admits the project check for the current bucket in the caller's transaction (after a
/// successful extraction, periodically, and at restart).
///
/// A queued job of the bucket is returned as it is: it has not read its inputs yet, and it will
/// read this transaction's evidence (the aggregation reads under the same scope lock this takes
/// first). A job of the bucket already admitted for exactly this evidence is returned too.
/// Otherwise the bucket's next run is admitted: the first job, or the one follow-up of a job
/// that is running (or done) without this evidence. The lock also serialises concurrent
/// checks, and the run number in the identity makes a duplicate impossible even without it.
pub async fn admit_project_check_in(
    ledger: &Ledger,
    tx: &mut Tx,
    interval_ms: u64,
    project_id: &str,
    origin: JobOrigin,
) -> Result<Admission, LedgerError> {
    lock_scope_in(tx, &project_key(project_id), ledger.now_ms()).await?;
    let digest = project_evidence_digest_in(tx, project_id).await?;
    let bucket = bucket_start(
        ledger.now_ms(),
        i64::try_from(interval_ms.max(1)).unwrap_or(i64::MAX),
    );
    let runs = ledger
        .bucket_runs_in(tx, JobKind::AggregateProject, project_id, bucket)
        .await?;
    let queued = runs.iter().find(|run| run.state == JobState::Queued);
    let same_evidence = runs
        .iter()
        .find(|run| run.input_digest.as_deref() == Some(digest.as_str()));
    if let Some(run) = queued.or(same_evidence) {
        return Ok(ledger.admitted_existing(run.clone()));
    }
    // Runs are numbered from 0; a gap (jobs removed with their session) is skipped over.
    let mut run = u32::try_from(runs.len()).unwrap_or(u32::MAX);
    loop {
        let identity = JobIdentity::aggregate_project(project_id, bucket, run, &digest);
        if ledger.find_in(tx, &identity).await?.is_none() {
            let job = NewJob::new(identity, origin)
                .with_trace_parent(crate::telemetry::current_traceparent());
            return ledger.admit_in(tx, job).await;
        }
        run = run.saturating_add(1);
    }
}

/// Admits the global check for the current bucket over the current promoted evidence.
pub async fn admit_global_check_in(
    service: &SkillService,
    tx: &mut Tx,
) -> Result<Admission, LedgerError> {
    let digest = promoted_evidence_digest_in(tx).await?;
    let interval = service.config().learning.global_promotion.interval_ms;
    let bucket = bucket_start(
        service.ledger().now_ms(),
        i64::try_from(interval.max(1)).unwrap_or(i64::MAX),
    );
    let job = NewJob::new(
        JobIdentity::aggregate_global(bucket, &digest),
        JobOrigin::Periodic,
    );
    service.ledger().admit_in(tx, job).await
}

impl SkillService {
    /// The periodic (and restart) check: admits a project check for every project and the global
    /// check, for the current buckets. Idempotent per bucket and evidence identity.
    pub async fn admit_checks(&self) -> Result<Vec<Admission>, SkillError> {
        let projects = super::store::aggregation::project_ids(&self.db).await?;
        let mut tx = self.db.begin().await?;
        let mut admissions = Vec::new();
        for project in projects {
            admissions.push(
                admit_project_check_in(
                    &self.ledger,
                    &mut tx,
                    self.config.learning.aggregation.interval_ms,
                    &project,
                    JobOrigin::Periodic,
                )
                .await?,
            );
        }
        admissions.push(admit_global_check_in(self, &mut tx).await?);
        tx.commit().await?;
        Ok(admissions)
    }

    /// An explicit check of one project now (same identity as the periodic one).
    pub async fn admit_project_check(&self, project_id: &str) -> Result<Admission, SkillError> {
        let mut tx = self.db.begin().await?;
        let admission = admit_project_check_in(
            &self.ledger,
            &mut tx,
            self.config.learning.aggregation.interval_ms,
            project_id,
            JobOrigin::Explicit,
        )
        .await?;
        tx.commit().await?;
        Ok(admission)
    }
}
