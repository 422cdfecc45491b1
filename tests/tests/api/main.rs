//! HTTP API suites, on both backends where storage is involved.

mod auth;
mod cli;
mod errors;
mod ingestion;
mod learning;
mod openapi;
mod recall;
mod tracing_context;
