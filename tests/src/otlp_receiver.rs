//! An in-process OTLP/HTTP receiver: accepts `POST /v1/traces` and `POST /v1/metrics` with
//! protobuf bodies (what `opentelemetry-otlp`'s `http-proto` exporter sends), decodes them with
//! the generated `opentelemetry-proto` messages and keeps what it received for assertions.
//!
//! Point [`zuno_shared::telemetry::init`]'s `otlp_endpoint` at [`OtlpReceiver::endpoint`]. Spans
//! and metric data points are flattened into plain structs (ids as lower-case hex, attribute
//! values as strings) so tests compare them without the protobuf types.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;
use tokio_util::sync::CancellationToken;

/// One received span.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    pub name: String,
    /// The resource's `service.name`.
    pub service: Option<String>,
    pub attributes: BTreeMap<String, String>,
}

/// What kind of OTLP metric a data point belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Gauge,
    Sum,
    Histogram,
    ExponentialHistogram,
    Summary,
}

/// One data point of one received metric.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedPoint {
    pub metric: String,
    pub kind: MetricKind,
    pub unit: String,
    pub attributes: BTreeMap<String, String>,
    /// The number of a gauge or sum; the observation count of a histogram or summary.
    pub value: f64,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    points: Vec<ReceivedPoint>,
    trace_requests: usize,
    metric_requests: usize,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Received>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running receiver; stopped when dropped.
pub struct OtlpReceiver {
    endpoint: String,
    shared: Shared,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind OTLP receiver");
        let address = listener.local_addr().expect("OTLP receiver address");
        let shared = Shared::default();
        let app = axum::Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            // Batches of a busy process can exceed axum's 2 MB default.
            .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
            .with_state(shared.clone());
        let shutdown = CancellationToken::new();
        let task = crate::serve_until_cancelled(listener, app, shutdown.clone(), "OTLP receiver");
        OtlpReceiver {
            endpoint: format!("http://{address}"),
            shared,
            shutdown,
            task,
        }
    }

    /// The OTLP/HTTP base endpoint (`http://127.0.0.1:PORT`); exporters append `/v1/…`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.lock().spans.clone()
    }

    /// Every metric data point received so far, in arrival order (cumulative exports repeat a
    /// series in each export; the latest point of a series is the last one).
    pub fn points(&self) -> Vec<ReceivedPoint> {
        self.shared.lock().points.clone()
    }

    /// The names of every metric that arrived with at least one data point.
    pub fn metric_names(&self) -> BTreeSet<String> {
        self.shared
            .lock()
            .points
            .iter()
            .map(|point| point.metric.clone())
            .collect()
    }

    /// Export requests accepted so far: (traces, metrics).
    pub fn requests(&self) -> (usize, usize) {
        let received = self.shared.lock();
        (received.trace_requests, received.metric_requests)
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
    }
}

/// The exporter sends `application/x-protobuf`; anything else (e.g. the JSON encoding) is a
/// misconfiguration the test should see as a refused export, not as silently missing data.
fn refuse_content_type(headers: &HeaderMap) -> Option<Response> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    (!content_type.starts_with("application/x-protobuf")).then(|| {
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("expected application/x-protobuf, got `{content_type}`"),
        )
            .into_response()
    })
}

fn protobuf(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response()
}

async fn traces(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refuse_content_type(&headers) {
        return refused;
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|resource| attribute(&resource.attributes, "service.name"));
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                spans.push(ReceivedSpan {
                    trace_id: to_hex(&span.trace_id),
                    span_id: to_hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| to_hex(&span.parent_span_id)),
                    name: span.name,
                    service: service.clone(),
                    attributes: attributes(&span.attributes),
                });
            }
        }
    }
    let mut received = shared.lock();
    received.trace_requests += 1;
    received.spans.extend(spans);
    drop(received);
    protobuf(ExportTraceServiceResponse::default().encode_to_vec())
}

async fn metrics(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refuse_content_type(&headers) {
        return refused;
    }
    let request = match ExportMetricsServiceRequest::decode(body) {
        Ok(request) => request,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let mut points = Vec::new();
    for resource_metrics in request.resource_metrics {
        for scope_metrics in resource_metrics.scope_metrics {
            for metric in scope_metrics.metrics {
                let point = |kind, attrs: &[KeyValue], value: f64| ReceivedPoint {
                    metric: metric.name.clone(),
                    kind,
                    unit: metric.unit.clone(),
                    attributes: attributes(attrs),
                    value,
                };
                match &metric.data {
                    Some(metric::Data::Gauge(gauge)) => {
                        for p in &gauge.data_points {
                            points.push(point(MetricKind::Gauge, &p.attributes, number(p.value)));
                        }
                    }
                    Some(metric::Data::Sum(sum)) => {
                        for p in &sum.data_points {
                            points.push(point(MetricKind::Sum, &p.attributes, number(p.value)));
                        }
                    }
                    Some(metric::Data::Histogram(histogram)) => {
                        for p in &histogram.data_points {
                            points.push(point(
                                MetricKind::Histogram,
                                &p.attributes,
                                p.count as f64,
                            ));
                        }
                    }
                    Some(metric::Data::ExponentialHistogram(histogram)) => {
                        for p in &histogram.data_points {
                            points.push(point(
                                MetricKind::ExponentialHistogram,
                                &p.attributes,
                                p.count as f64,
                            ));
                        }
                    }
                    Some(metric::Data::Summary(summary)) => {
                        for p in &summary.data_points {
                            points.push(point(MetricKind::Summary, &p.attributes, p.count as f64));
                        }
                    }
                    None => {}
                }
            }
        }
    }
    let mut received = shared.lock();
    received.metric_requests += 1;
    received.points.extend(points);
    drop(received);
    protobuf(ExportMetricsServiceResponse::default().encode_to_vec())
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn number(value: Option<number_data_point::Value>) -> f64 {
    match value {
        Some(number_data_point::Value::AsDouble(value)) => value,
        Some(number_data_point::Value::AsInt(value)) => value as f64,
        None => f64::NAN,
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(any_value_string)
}

fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(any_value_string).unwrap_or_default(),
            )
        })
        .collect()
}

fn any_value_string(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(any_value::Value::DoubleValue(number)) => number.to_string(),
        Some(any_value::Value::BytesValue(bytes)) => to_hex(bytes),
        // An index into a profiles dictionary; spans and metrics never use it.
        Some(any_value::Value::StringValueStrindex(index)) => format!("strindex:{index}"),
        Some(any_value::Value::ArrayValue(array)) => {
            let items: Vec<String> = array.values.iter().map(any_value_string).collect();
            format!("[{}]", items.join(","))
        }
        Some(any_value::Value::KvlistValue(list)) => {
            let items: Vec<String> = list
                .values
                .iter()
                .map(|kv| {
                    let value = kv.value.as_ref().map(any_value_string).unwrap_or_default();
                    format!("{}={value}", kv.key)
                })
                .collect();
            format!("{{{}}}", items.join(","))
        }
        None => String::new(),
    }
}
