//! Telemetry end to end.
//!
//! - `otlp`: the whole pipeline in one process exporting to an in-process OTLP receiver; the
//!   admitting request, the job, the provider request and the settlement form one trace, and
//!   every metric the fleet is watched by arrives.
//! - `prometheus`: a real `zuno` API process and a real worker process scraped by a real
//!   Prometheus; every expression of the Grafana dashboard returns data after real traffic.

mod otlp;
mod prometheus;

use serde_json::json;
use zuno_tests::fake_provider::Reply;

/// The provider name and model that `fake_provider::learning_config` configures and the
/// Prometheus test writes into its configuration file (`learning.extractor_model`).
pub const PROVIDER: &str = "fake";
pub const MODEL: &str = "fake-model";

pub use zuno_tests::pnpm::{CORRECTION, assistant_turn, user_turn, valid_answer};

/// A 401 with an OpenAI-style body: a permanent provider failure (error class `auth`).
pub fn unauthorized() -> Reply {
    Reply::json(
        401,
        json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                         "code": "invalid_api_key"}}),
    )
}

/// Whether the environment makes a prerequisite mandatory (`VAR=1`, as `scripts/test` sets
/// after installing it): then its absence fails the test instead of skipping it.
pub fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|value| !matches!(value.trim(), "" | "0" | "false" | "no"))
}
