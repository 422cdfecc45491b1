//! Logs, traces and metrics.
//!
//! `tracing` is used everywhere. [`init`] installs: a fmt layer on stderr (JSON when asked), an
//! OpenTelemetry layer exporting spans over OTLP/HTTP when an endpoint is configured, a meter
//! provider that feeds the Prometheus registry served at `/metrics` (and OTLP when configured),
//! and the W3C trace-context propagator used to carry a trace from an admitting request to the
//! worker that runs the job. Processes without an HTTP API serve `/metrics` through
//! [`MetricsServer`]; every process exporting metrics publishes queue depth with
//! [`report_queue_depth`].

pub mod metrics;
mod queue_depth;
mod server;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use queue_depth::{QUEUE_DEPTH_INTERVAL, publish_queue_depth, report_queue_depth};
pub use server::MetricsServer;
pub use zuno_queue::trace_context::{continue_trace, current_traceparent};

/// How to set up telemetry for one process.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// `service.name` reported with every span and metric.
    pub service_name: String,
    /// Emit logs as JSON lines instead of human text.
    pub json_logs: bool,
    /// OTLP/HTTP base endpoint (e.g. `http://collector:4318`); `None` disables export.
    pub otlp_endpoint: Option<String>,
    /// Metric export interval for OTLP.
    pub metric_interval_ms: Option<u64>,
}

/// Keeps exporters alive; flushes spans and metrics when dropped.
pub struct TelemetryGuard {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: SdkMeterProvider,
    registry: prometheus::Registry,
}

impl TelemetryGuard {
    /// The registry rendered at `/metrics`.
    pub fn registry(&self) -> &prometheus::Registry {
        &self.registry
    }

    /// Flushes pending spans and metrics now (tests, shutdown).
    pub fn flush(&self) {
        if let Some(provider) = &self.tracer_provider
            && let Err(error) = provider.force_flush()
        {
            eprintln!("zuno: span flush failed: {error}");
        }
        if let Err(error) = self.meter_provider.force_flush() {
            eprintln!("zuno: metric flush failed: {error}");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.flush();
        if let Some(provider) = self.tracer_provider.take() {
            let _ = provider.shutdown();
        }
        let _ = self.meter_provider.shutdown();
    }
}

/// Errors while installing telemetry.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Installs logging, tracing export and metrics for this process.
pub fn init(config: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();

    let registry = prometheus::Registry::new();
    let prometheus_reader = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .without_target_info()
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut meter_builder = SdkMeterProvider::builder()
        .with_resource(resource.clone())
        .with_reader(prometheus_reader);
    let mut tracer_provider = None;
    if let Some(endpoint) = &config.otlp_endpoint {
        let base = endpoint.trim_end_matches('/');
        let span_exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/traces"))
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        tracer_provider = Some(
            SdkTracerProvider::builder()
                .with_resource(resource.clone())
                .with_batch_exporter(span_exporter)
                .build(),
        );
        let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/metrics"))
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(metric_exporter)
            .with_interval(std::time::Duration::from_millis(
                config.metric_interval_ms.unwrap_or(10_000),
            ))
            .build();
        meter_builder = meter_builder.with_reader(reader);
    }
    let meter_provider = meter_builder.build();
    opentelemetry::global::set_meter_provider(meter_provider.clone());

    let filter = EnvFilter::try_from_env("ZUNO_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let fmt_json = config.json_logs.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
    });
    let fmt_text = (!config.json_logs).then(|| {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_writer(std::io::stderr)
    });
    let otel = tracer_provider.as_ref().map(|provider| {
        opentelemetry::global::set_tracer_provider(provider.clone());
        tracing_opentelemetry::layer().with_tracer(provider.tracer("zuno"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt_json)
        .with(fmt_text)
        .with(otel)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;

    Ok(TelemetryGuard {
        tracer_provider,
        meter_provider,
        registry,
    })
}

/// Renders a Prometheus registry in the text exposition format.
pub fn render_prometheus(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buffer = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut buffer) {
        tracing::error!(%error, "cannot encode metrics");
    }
    String::from_utf8(buffer).unwrap_or_default()
}
