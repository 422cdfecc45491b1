//! Ledger and worker-runtime metric instruments. They are OpenTelemetry instruments on the global
//! meter provider: whichever process installs one (see `zuno_shared::telemetry::init`) exports them
//! as Prometheus text and over OTLP; without one they are no-ops. Instruments are created on first
//! use.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};

use super::JobKind;

// Bucket boundaries in seconds. The SDK's default boundaries (0, 5, 10, 25, … 10000) suit
// milliseconds: in seconds they would put every claim and most job runs in the first bucket and
// make quantiles meaningless. Each set spans its measurement's expected range.
const CLAIM_LATENCY_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const JOB_DURATION_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

fn meter() -> Meter {
    opentelemetry::global::meter("zuno")
}

/// Ledger and worker-runtime instruments.
pub struct LedgerMetrics {
    admitted: Counter<u64>,
    claimed: Counter<u64>,
    attempts: Histogram<u64>,
    claim_latency: Histogram<f64>,
    settled: Counter<u64>,
    fenced: Counter<u64>,
    lease_expiries: Counter<u64>,
    skipped_at_claim: Counter<u64>,
    skipped: Counter<u64>,
    revoked: Counter<u64>,
    pruned: Counter<u64>,
    quarantined: Counter<u64>,
    released: Counter<u64>,
    attempt_db_retries: Counter<u64>,
    job_duration: Histogram<f64>,
    queue_depth: Gauge<i64>,
}

fn counter(meter: &Meter, name: &'static str, description: &'static str) -> Counter<u64> {
    meter
        .u64_counter(name)
        .with_description(description)
        .build()
}

pub fn ledger() -> &'static LedgerMetrics {
    static METRICS: OnceLock<LedgerMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = meter();
        LedgerMetrics {
            admitted: meter
                .u64_counter("zuno_jobs_admitted")
                .with_description("Job admissions by kind and outcome (queued or existing)")
                .build(),
            claimed: meter
                .u64_counter("zuno_jobs_claimed")
                .with_description("Jobs handed to workers")
                .build(),
            attempts: meter
                .u64_histogram("zuno_job_attempt")
                .with_description("Attempt number of each claimed job")
                .with_boundaries(vec![1.0, 2.0, 3.0])
                .build(),
            claim_latency: meter
                .f64_histogram("zuno_claim_latency")
                .with_unit("s")
                .with_description("Duration of one claim transaction")
                .with_boundaries(CLAIM_LATENCY_BUCKETS.to_vec())
                .build(),
            settled: meter
                .u64_counter("zuno_jobs_settled")
                .with_description("Settlements by kind and resulting state")
                .build(),
            fenced: meter
                .u64_counter("zuno_fenced_writes")
                .with_description("Writes refused because the lease was lost")
                .build(),
            lease_expiries: meter
                .u64_counter("zuno_lease_expiries")
                .with_description("Leases that expired without settlement")
                .build(),
            skipped_at_claim: meter
                .u64_counter("zuno_jobs_skipped_at_claim")
                .with_description("Jobs skipped at claim because their source changed")
                .build(),
            skipped: counter(
                &meter,
                "zuno_jobs_skipped",
                "Queued jobs their owner skipped before they ran",
            ),
            revoked: counter(&meter, "zuno_jobs_revoked", "Jobs revoked by newer input"),
            pruned: counter(
                &meter,
                "zuno_jobs_pruned",
                "Jobs deleted with their session or project",
            ),
            quarantined: meter
                .u64_counter("zuno_jobs_quarantined")
                .with_description(
                    "Jobs failed at claim because their row or their claim gate could not be read",
                )
                .build(),
            released: meter
                .u64_counter("zuno_jobs_released")
                .with_description(
                    "Leases released at shutdown, by the state the job went to (queued or failed)",
                )
                .build(),
            attempt_db_retries: meter
                .u64_counter("zuno_attempt_db_retries")
                .with_description("Jobs run again within their attempt after a database error")
                .build(),
            job_duration: meter
                .f64_histogram("zuno_job_duration")
                .with_unit("s")
                .with_description("Wall time of one job attempt")
                .with_boundaries(JOB_DURATION_BUCKETS.to_vec())
                .build(),
            queue_depth: meter
                .i64_gauge("zuno_queue_depth")
                .with_description("Jobs by kind and state")
                .build(),
        }
    })
}

/// Every `operation` label of `zuno_fenced_writes`.
const FENCED_OPERATIONS: [&str; 3] = ["heartbeat", "settlement", "write"];

impl LedgerMetrics {
    /// Exports every ledger counter of `kinds` at zero, so a scraper sees a series from the
    /// process's start rather than from its first event (a rate over a series that appears at 1
    /// loses that first event).
    pub fn export_from_zero(&self, kinds: &[JobKind]) {
        self.lease_expiries.add(0, &[]);
        for kind in kinds {
            let kind_label = KeyValue::new("kind", kind.as_str());
            for outcome in ["queued", "existing"] {
                self.admitted
                    .add(0, &[kind_label.clone(), KeyValue::new("outcome", outcome)]);
            }
            self.claimed.add(0, std::slice::from_ref(&kind_label));
            for state in super::JobState::ALL {
                if state.is_terminal() || state == super::JobState::Queued {
                    self.settled.add(
                        0,
                        &[kind_label.clone(), KeyValue::new("state", state.as_str())],
                    );
                }
            }
            for operation in FENCED_OPERATIONS {
                self.fenced.add(
                    0,
                    &[kind_label.clone(), KeyValue::new("operation", operation)],
                );
            }
            self.skipped_at_claim
                .add(0, std::slice::from_ref(&kind_label));
            for owner_operation in [&self.skipped, &self.revoked, &self.pruned] {
                owner_operation.add(0, std::slice::from_ref(&kind_label));
            }
            self.quarantined.add(0, std::slice::from_ref(&kind_label));
            self.attempt_db_retries
                .add(0, std::slice::from_ref(&kind_label));
            for state in ["queued", "failed"] {
                self.released
                    .add(0, &[kind_label.clone(), KeyValue::new("state", state)]);
            }
        }
    }

    pub fn attempt_db_retry(&self, kind: JobKind) {
        self.attempt_db_retries
            .add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn quarantined(&self, kind: JobKind) {
        self.quarantined
            .add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn released(&self, kind: JobKind, state: &str) {
        self.released.add(
            1,
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("state", state.to_owned()),
            ],
        );
    }

    pub fn admitted(&self, kind: JobKind, outcome: &'static str) {
        self.admitted.add(
            1,
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    pub fn claimed(&self, kind: JobKind, attempt: i64) {
        self.claimed.add(1, &[KeyValue::new("kind", kind.as_str())]);
        self.attempts.record(
            u64::try_from(attempt).unwrap_or(0),
            &[KeyValue::new("kind", kind.as_str())],
        );
    }

    pub fn claim_latency(&self, elapsed: Duration) {
        self.claim_latency.record(elapsed.as_secs_f64(), &[]);
    }

    pub fn settled(&self, kind: JobKind, state: &str) {
        self.settled.add(
            1,
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("state", state.to_owned()),
            ],
        );
    }

    pub fn fenced(&self, kind: JobKind, operation: &str) {
        self.fenced.add(
            1,
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("operation", operation.to_owned()),
            ],
        );
    }

    pub fn lease_expired(&self) {
        self.lease_expiries.add(1, &[]);
    }

    pub fn skipped_at_claim(&self, kind: JobKind) {
        self.skipped_at_claim
            .add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn skipped(&self, kind: JobKind) {
        self.skipped.add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn revoked(&self, kind: JobKind) {
        self.revoked.add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn pruned(&self, kind: JobKind) {
        self.pruned.add(1, &[KeyValue::new("kind", kind.as_str())]);
    }

    pub fn job_duration(&self, kind: JobKind, outcome: &'static str, elapsed: Duration) {
        self.job_duration.record(
            elapsed.as_secs_f64(),
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    pub fn queue_depth(&self, kind: JobKind, state: &str, count: i64) {
        self.queue_depth.record(
            count,
            &[
                KeyValue::new("kind", kind.as_str()),
                KeyValue::new("state", state.to_owned()),
            ],
        );
    }
}
