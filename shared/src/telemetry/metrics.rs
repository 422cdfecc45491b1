//! Metric instruments. They are OpenTelemetry instruments, exported both as Prometheus text at
//! `/metrics` and over OTLP when an endpoint is configured. Instruments are created on first use,
//! after [`super::init`] installed the meter provider.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};

use crate::ledger::JobKind;

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
    job_duration: Histogram<f64>,
    queue_depth: Gauge<i64>,
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
            job_duration: meter
                .f64_histogram("zuno_job_duration")
                .with_unit("s")
                .with_description("Wall time of one job attempt")
                .build(),
            queue_depth: meter
                .i64_gauge("zuno_queue_depth")
                .with_description("Jobs by kind and state")
                .build(),
        }
    })
}

impl LedgerMetrics {
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
