//! Resident Memory on both backends: compare-and-set writers, write validation (locators, caps,
//! refusals), the promotion policy, apply/undo with exact snapshots, start-up reconciliation of
//! historical `applying`/`undoing` candidates, the Markdown projections (absent until the first
//! accepted write, regular paths only, adopted once, external edits preserved, failures that keep
//! committed entries, restoration), forgetting, and consolidation at the cap (through the
//! maintenance worker too).

mod apply_undo;
mod cap;
mod cas;
mod forget;
mod harness;
mod projection;
mod promotion;
mod reconcile;
mod validation;
