//! HTTP API suites, on both backends where storage is involved.

mod auth;
mod cli;
mod errors;
mod events;
mod files;
mod guards;
mod ingestion;
mod learning;
mod openapi;
mod outage;
mod page;
mod recall;
mod security;
mod tracing_context;
mod wire;
