//! The `zuno` binary: the HTTP API (`zuno serve`), the all-in-one embedded mode and the
//! operator CLI.

pub mod cli;
pub mod eval;
pub mod http;
pub mod serve;
