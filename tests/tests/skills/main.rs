//! The slow path on both backends: pattern mining with its count gates and semantic grouping
//! (through the fake provider), rejection and promotion, offline cassette evaluation, and
//! at-most-once Skill apply/undo with reconciliation — and the whole path over the API.

mod apply;
mod end_to_end;
mod evaluation;
mod every_stage;
mod global;
mod harness;
mod mining;
mod revocation;
mod usage;
