//! The learning model client against the in-process fake provider: request shapes of the
//! three wire formats, model resolution, output limits, the one repair, typed failures from
//! recorded provider responses, Retry-After, the deadline, and receipts; and the command-line
//! kinds (Claude Code, Codex) against stand-in executables.

mod command_line;
mod harness;
mod model_resolution;
mod output_limit;
mod rate_limits;
mod receipts;
mod recorded_failures;
mod repair;
mod wire_formats;
