//! The ledger's vocabulary: job kinds, states, identities and leases.

use serde::{Deserialize, Serialize};

crate::text_enum! {
    /// Every kind of durable learning job. Each worker binary registers handlers for its own kinds.
    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        Eq,
        Hash,
        Serialize,
        Deserialize,
        PartialOrd,
        Ord,
        utoipa::ToSchema,
    )]
    #[serde(rename_all = "snake_case")]
    pub enum JobKind {
        /// Closed-turn (or manual) extraction of Experience from one source snapshot.
        Extract = "extract",
        /// No-tools resident Memory maintenance for one canonical memory path.
        Maintain = "maintain",
        /// Pattern mining over one project's evidence in one interval bucket.
        AggregateProject = "aggregate_project",
        /// Cross-project matching of promoted patterns in one interval bucket.
        AggregateGlobal = "aggregate_global",
        /// An offline cassette evaluation of one Skill candidate.
        Evaluate = "evaluate",
        /// The embedding of one experience by one embedding model (the optional semantic layer).
        Embed = "embed",
    }
}

impl JobKind {
    /// One-at-a-time kinds whose runs must not overlap in any order (not only admission
    /// order): a job waits for any other running job of its kind and project
    /// ([`super::another_run_in`]), and a settled run makes every waiting one due.
    pub fn runs_alone_in_any_order(self) -> bool {
        matches!(self, JobKind::Maintain)
    }

    /// Kinds whose jobs of one project run one at a time: aggregation, in admission order (a
    /// follow-up reads what the run before it leaves), and maintenance (one writer per Memory
    /// document: two plans over one revision would make one of them fail its compare-and-set and
    /// spend an attempt). The claim gate defers a job while another of its kind and project
    /// runs ([`super::earlier_run_in`], [`super::another_run_in`]); settling that run makes its
    /// waiting successors due at once.
    pub fn runs_one_at_a_time(self) -> bool {
        matches!(
            self,
            JobKind::AggregateProject | JobKind::AggregateGlobal | JobKind::Maintain
        )
    }
}

crate::text_enum! {
    /// Where a job is in its life. `completed`, `failed` and `skipped` are terminal; `uncertain`
    /// is terminal until an operator decides (used where a side effect's outcome cannot be
    /// proven).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum JobState {
        Queued = "queued",
        Running = "running",
        Completed = "completed",
        Failed = "failed",
        Skipped = "skipped",
        Uncertain = "uncertain",
    }
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Skipped | JobState::Uncertain
        )
    }
}

/// A stored job state no [`JobState`] spells: the row was written by something else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("learning_job.state holds the unknown state `{0}`")]
pub struct UnknownJobState(pub String);

/// Decodes a row's state (`#[sqlx(try_from = "String")]`), so a read of the column is typed.
impl TryFrom<String> for JobState {
    type Error = UnknownJobState;

    fn try_from(value: String) -> Result<JobState, UnknownJobState> {
        JobState::parse(&value).ok_or(UnknownJobState(value))
    }
}

crate::text_enum! {
    /// Why a job exists; decides its claim priority.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum JobOrigin {
        /// A turn that just closed: learning that should reach the next prompt soon.
        ClosedTurn = "closed_turn",
        /// An explicit operator command (`reflect`, `reprocess`, `skill-review`).
        Manual = "manual",
        /// Backlog from history repair or start-up catch-up.
        Legacy = "legacy",
        /// Periodic work admitted for an interval bucket.
        Periodic = "periodic",
        /// Follow-up work admitted by another job or an explicit API call.
        Explicit = "explicit",
    }
}

impl JobOrigin {
    /// Work nobody asked for by hand: its model tokens count toward
    /// `learning.execution.max_tokens_per_day`, and the cap can hold it back. Only a person's
    /// explicit command is exempt, whatever stage runs it.
    pub fn is_automatic(self) -> bool {
        self != JobOrigin::Manual
    }

    /// Higher runs first. Manual work is what a person is waiting for; closed turns come before
    /// legacy backlog (repair history), so old history never delays a fresh turn.
    pub fn priority(self) -> i64 {
        match self {
            JobOrigin::Manual => 300,
            JobOrigin::ClosedTurn => 200,
            JobOrigin::Explicit => 150,
            JobOrigin::Periodic => 100,
            JobOrigin::Legacy => 0,
        }
    }
}

/// The unique identity of a job within its kind. Admitting the same identity twice returns the
/// existing job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobIdentity {
    pub kind: JobKind,
    /// Canonical text of the identity components; unique per kind.
    pub key: String,
    pub project_id: Option<String>,
    pub session_id: Option<String>,
    pub source_message_id: Option<String>,
    pub extractor_version: Option<String>,
    pub input_digest: Option<String>,
    pub bucket_start: Option<i64>,
}

/// Separates identity components; cannot occur in validated ids or hex digests.
const SEP: char = '\u{1f}';

impl JobIdentity {
    fn new(kind: JobKind, parts: &[&str]) -> JobIdentity {
        JobIdentity {
            kind,
            key: parts.join(&SEP.to_string()),
            project_id: None,
            session_id: None,
            source_message_id: None,
            extractor_version: None,
            input_digest: None,
            bucket_start: None,
        }
    }

    /// `(session_id, source_message_id, extractor_version)`, plus the exact source-input digest
    /// for manual reflection, so reflecting on an edited source is new work and on an unchanged
    /// one returns the same job.
    pub fn extract(
        project_id: &str,
        session_id: &str,
        source_message_id: &str,
        extractor_version: &str,
        manual_input_digest: Option<&str>,
    ) -> JobIdentity {
        let digest = manual_input_digest.unwrap_or("");
        let mut identity = JobIdentity::new(
            JobKind::Extract,
            &[session_id, source_message_id, extractor_version, digest],
        );
        identity.project_id = Some(project_id.to_owned());
        identity.session_id = Some(session_id.to_owned());
        identity.source_message_id = Some(source_message_id.to_owned());
        identity.extractor_version = Some(extractor_version.to_owned());
        identity.input_digest = manual_input_digest.map(str::to_owned);
        identity
    }

    /// One maintenance job per canonical memory path and input watermark.
    pub fn maintain(project_id: &str, memory_path: &str, input_digest: &str) -> JobIdentity {
        let mut identity =
            JobIdentity::new(JobKind::Maintain, &[project_id, memory_path, input_digest]);
        identity.project_id = Some(project_id.to_owned());
        identity.input_digest = Some(input_digest.to_owned());
        identity
    }

    /// Project aggregation: the `run`-th job of a project's interval bucket (0 first, then one
    /// follow-up at a time). `evidence_digest` records the evidence it was admitted for; it is
    /// not part of the identity, so new evidence joins a queued job instead of adding one.
    pub fn aggregate_project(
        project_id: &str,
        bucket_start: i64,
        run: u32,
        evidence_digest: &str,
    ) -> JobIdentity {
        let bucket = bucket_start.to_string();
        let run = run.to_string();
        let mut identity =
            JobIdentity::new(JobKind::AggregateProject, &[project_id, &bucket, &run]);
        identity.project_id = Some(project_id.to_owned());
        identity.bucket_start = Some(bucket_start);
        identity.input_digest = Some(evidence_digest.to_owned());
        identity
    }

    /// Global aggregation: one job per bucket and digest of the promoted evidence.
    pub fn aggregate_global(bucket_start: i64, evidence_digest: &str) -> JobIdentity {
        let bucket = bucket_start.to_string();
        let mut identity = JobIdentity::new(JobKind::AggregateGlobal, &[&bucket, evidence_digest]);
        identity.bucket_start = Some(bucket_start);
        identity.input_digest = Some(evidence_digest.to_owned());
        identity
    }

    /// One evaluation per candidate and suite version.
    pub fn evaluate(project_id: &str, candidate_id: &str, suite_version: &str) -> JobIdentity {
        let mut identity = JobIdentity::new(JobKind::Evaluate, &[candidate_id, suite_version]);
        identity.project_id = Some(project_id.to_owned());
        identity.input_digest = Some(suite_version.to_owned());
        identity
    }
}

impl JobIdentity {
    /// One embedding per experience and embedding model.
    pub fn embed(project_id: &str, experience_id: &str, model: &str) -> JobIdentity {
        let mut identity = JobIdentity::new(JobKind::Embed, &[experience_id, model]);
        identity.project_id = Some(project_id.to_owned());
        identity.extractor_version = Some(model.to_owned());
        identity
    }
}

/// The start of the interval bucket that contains `now`: `floor(now / period) * period`.
pub fn bucket_start(now_ms: i64, period_ms: i64) -> i64 {
    assert!(period_ms > 0, "interval period must be positive");
    now_ms - now_ms.rem_euclid(period_ms)
}

/// A job to admit.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub identity: JobIdentity,
    pub origin: JobOrigin,
    /// When the job becomes due; `None` = immediately.
    pub run_at: Option<i64>,
    /// At most 3 (the schema refuses more).
    pub max_attempts: i64,
    pub payload: serde_json::Value,
    /// Restricts which workers may claim the job (e.g. a canonical memory path).
    pub claim_scope: Option<String>,
    /// W3C `traceparent` of the admitting request, continued by the worker's span.
    pub trace_parent: Option<String>,
}

impl NewJob {
    pub fn new(identity: JobIdentity, origin: JobOrigin) -> NewJob {
        NewJob {
            identity,
            origin,
            run_at: None,
            max_attempts: MAX_ATTEMPTS,
            payload: serde_json::Value::Object(Default::default()),
            claim_scope: None,
            trace_parent: None,
        }
    }

    pub fn with_payload(mut self, payload: serde_json::Value) -> NewJob {
        self.payload = payload;
        self
    }

    pub fn with_trace_parent(mut self, trace_parent: Option<String>) -> NewJob {
        self.trace_parent = trace_parent;
        self
    }

    pub fn due_at(mut self, run_at: i64) -> NewJob {
        self.run_at = Some(run_at);
        self
    }

    pub fn with_claim_scope(mut self, scope: impl Into<String>) -> NewJob {
        self.claim_scope = Some(scope.into());
        self
    }
}

/// The attempt ceiling: a durable job is attempted at most three times
/// (docs/adr/0002-job-ledger-design.md).
pub const MAX_ATTEMPTS: i64 = 3;

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: String,
    pub kind: JobKind,
    pub identity_key: String,
    pub project_id: Option<String>,
    pub session_id: Option<String>,
    pub source_message_id: Option<String>,
    pub extractor_version: Option<String>,
    pub input_digest: Option<String>,
    pub bucket_start: Option<i64>,
    pub claim_scope: Option<String>,
    pub origin: JobOrigin,
    pub priority: i64,
    pub state: JobState,
    pub run_at: i64,
    pub attempts: i64,
    pub max_attempts: i64,
    #[serde(skip)]
    pub lease_token: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub heartbeat_at: Option<i64>,
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
    pub last_error: Option<String>,
    #[serde(skip)]
    pub trace_parent: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

/// The authority to act for one claimed attempt of a job. Every write made for the job presents
/// the token; once another worker holds the job the token no longer matches and writes are
/// refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub job_id: String,
    pub kind: JobKind,
    pub token: String,
    pub worker_id: String,
    pub attempt: i64,
    pub expires_at: i64,
}

/// A job handed to a worker together with its lease.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job: Job,
    pub lease: Lease,
    /// What the claim gate read about the job in the claim transaction, when it passed that on
    /// ([`GateDecision::ProceedWith`](super::GateDecision::ProceedWith)).
    pub findings: Option<GateFindings>,
}

/// What a claim gate read while it checked a job, handed to the job's handler so the attempt
/// does not read and rebuild the same rows a second time. Opaque to the ledger: the gate and
/// the handler of a kind agree on the type, and [`GateFindings::get`] recovers it.
#[derive(Clone)]
pub struct GateFindings(std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl GateFindings {
    pub fn new<T: std::any::Any + Send + Sync>(findings: T) -> GateFindings {
        GateFindings(std::sync::Arc::new(findings))
    }

    /// The findings, when they are a `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for GateFindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GateFindings(..)")
    }
}

/// Two findings are equal when they are the same value (the gate's decisions compare by them).
impl PartialEq for GateFindings {
    fn eq(&self, other: &GateFindings) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for GateFindings {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_start_floors_to_period() {
        assert_eq!(bucket_start(86_400_000 * 3 + 5, 86_400_000), 86_400_000 * 3);
        assert_eq!(bucket_start(86_400_000 * 3, 86_400_000), 86_400_000 * 3);
        assert_eq!(bucket_start(-1, 1000), -1000);
    }

    #[test]
    fn kinds_and_states_round_trip_through_text() {
        for kind in JobKind::ALL {
            assert_eq!(JobKind::parse(kind.as_str()), Some(kind));
        }
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
        }
        assert_eq!(JobKind::parse("cron"), None);
    }

    #[test]
    fn manual_reflection_identity_differs_by_input_digest() {
        let automatic = JobIdentity::extract("p", "s", "m", "v1", None);
        let manual_a = JobIdentity::extract("p", "s", "m", "v1", Some("aaaa"));
        let manual_b = JobIdentity::extract("p", "s", "m", "v1", Some("bbbb"));
        assert_ne!(automatic.key, manual_a.key);
        assert_ne!(manual_a.key, manual_b.key);
        assert_eq!(
            manual_a.key,
            JobIdentity::extract("p", "s", "m", "v1", Some("aaaa")).key
        );
    }

    #[test]
    fn embed_identity_is_per_experience_and_model() {
        let a = JobIdentity::embed("p", "exp1", "m1");
        assert_eq!(a.key, JobIdentity::embed("p", "exp1", "m1").key);
        assert_ne!(a.key, JobIdentity::embed("p", "exp1", "m2").key);
        assert_ne!(a.key, JobIdentity::embed("p", "exp2", "m1").key);
    }

    #[test]
    fn closed_turns_outrank_legacy_backlog() {
        assert!(JobOrigin::ClosedTurn.priority() > JobOrigin::Legacy.priority());
    }
}
