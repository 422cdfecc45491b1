//! Metric instruments of the learning domain (provider calls, retrieval, learning). They are
//! OpenTelemetry instruments, exported both as Prometheus text at `/metrics` and over OTLP when an
//! endpoint is configured. Instruments are created on first use, after [`super::init`] installed
//! the meter provider. The ledger's instruments live in the queue crate and are re-exported here.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

pub use zuno_queue::ledger::metrics::{LedgerMetrics, ledger};

// Bucket boundaries in seconds (the SDK's defaults suit milliseconds).
const PROVIDER_LATENCY_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];
const RETRIEVAL_LATENCY_BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

fn meter() -> Meter {
    opentelemetry::global::meter("zuno")
}

/// Model-provider instruments.
pub struct ProviderMetrics {
    requests: Counter<u64>,
    latency: Histogram<f64>,
    errors: Counter<u64>,
    tokens: Counter<u64>,
}

pub fn provider() -> &'static ProviderMetrics {
    static METRICS: OnceLock<ProviderMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = meter();
        ProviderMetrics {
            requests: meter
                .u64_counter("zuno_provider_requests")
                .with_description("Provider calls by provider, model and outcome")
                .build(),
            latency: meter
                .f64_histogram("zuno_provider_latency")
                .with_unit("s")
                .with_description("Provider call latency, including repair and retries")
                .with_boundaries(PROVIDER_LATENCY_BUCKETS.to_vec())
                .build(),
            errors: meter
                .u64_counter("zuno_provider_errors")
                .with_description("Failed provider calls by provider and error class")
                .build(),
            tokens: meter
                .u64_counter("zuno_provider_tokens")
                .with_description("Provider tokens by direction (input/output)")
                .build(),
        }
    })
}

impl ProviderMetrics {
    pub fn request(&self, provider: &str, model: &str, outcome: &'static str, elapsed: Duration) {
        let attributes = [
            KeyValue::new("provider", provider.to_owned()),
            KeyValue::new("model", model.to_owned()),
            KeyValue::new("outcome", outcome),
        ];
        self.requests.add(1, &attributes);
        self.latency.record(elapsed.as_secs_f64(), &attributes[..2]);
    }

    pub fn error(&self, provider: &str, class: &'static str) {
        self.errors.add(
            1,
            &[
                KeyValue::new("provider", provider.to_owned()),
                KeyValue::new("class", class),
            ],
        );
    }

    pub fn tokens(&self, provider: &str, model: &str, input: u64, output: u64) {
        let base = [
            KeyValue::new("provider", provider.to_owned()),
            KeyValue::new("model", model.to_owned()),
        ];
        self.tokens.add(
            input,
            &[
                base[0].clone(),
                base[1].clone(),
                KeyValue::new("direction", "input"),
            ],
        );
        self.tokens.add(
            output,
            &[
                base[0].clone(),
                base[1].clone(),
                KeyValue::new("direction", "output"),
            ],
        );
    }
}

/// Retrieval instruments.
pub struct RetrievalMetrics {
    latency: Histogram<f64>,
    skipped: Counter<u64>,
    selected: Counter<u64>,
}

pub fn retrieval() -> &'static RetrievalMetrics {
    static METRICS: OnceLock<RetrievalMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = meter();
        RetrievalMetrics {
            latency: meter
                .f64_histogram("zuno_retrieval_latency")
                .with_unit("s")
                .with_description("Prompt-context assembly latency")
                .with_boundaries(RETRIEVAL_LATENCY_BUCKETS.to_vec())
                .build(),
            skipped: meter
                .u64_counter("zuno_retrieval_skipped")
                .with_description(
                    "Retrievals that inserted nothing because the budget was too small",
                )
                .build(),
            selected: meter
                .u64_counter("zuno_retrieval_selected_items")
                .with_description("Experiences inserted into prompts")
                .build(),
        }
    })
}

impl RetrievalMetrics {
    pub fn latency(&self, elapsed: Duration) {
        self.latency.record(elapsed.as_secs_f64(), &[]);
    }

    pub fn skipped(&self) {
        self.skipped.add(1, &[]);
    }

    pub fn selected(&self, items: u64) {
        self.selected.add(items, &[]);
    }
}

/// Learning-output instruments.
pub struct LearningMetrics {
    experiences: Counter<u64>,
    refused: Counter<u64>,
}

pub fn learning() -> &'static LearningMetrics {
    static METRICS: OnceLock<LearningMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = meter();
        LearningMetrics {
            experiences: meter
                .u64_counter("zuno_experiences_recorded")
                .with_description("Experiences stored, by verification state")
                .build(),
            refused: meter
                .u64_counter("zuno_items_refused")
                .with_description("Extracted items refused for unresolvable encodings")
                .build(),
        }
    })
}

/// Every `verification` label of `zuno_experiences_recorded`.
const VERIFICATIONS: [&str; 2] = ["verified", "unverified"];

/// Exports the domain counters whose label values are known at start (retrieval and learning;
/// provider counters are labelled by the configured provider and model) at zero, so a scraper
/// sees each series from the process's start, as the ledger's (`LedgerMetrics::export_from_zero`).
pub fn export_from_zero() {
    let retrieval = retrieval();
    retrieval.skipped.add(0, &[]);
    retrieval.selected.add(0, &[]);
    let learning = learning();
    for verification in VERIFICATIONS {
        learning
            .experiences
            .add(0, &[KeyValue::new("verification", verification)]);
    }
    learning.refused.add(0, &[]);
}

impl LearningMetrics {
    /// `verification` is one of [`VERIFICATIONS`].
    pub fn experience(&self, verification: &'static str) {
        self.experiences
            .add(1, &[KeyValue::new("verification", verification)]);
    }

    pub fn refused(&self, count: u64) {
        self.refused.add(count, &[]);
    }
}
