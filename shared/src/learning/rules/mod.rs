//! The built-in rules extractors: used when no model provider is configured, and by users who
//! do not want transcripts to leave the machine. Rules decide only what is certain — an explicit
//! instruction in the user's own words, a failed command that a different command recovered
//! from — and cite the exact text they read, so every citation verifies.
//!
//! `rules-2` ([`v2`]) is the default; `rules-1` ([`v1`]) stays selectable with
//! `learning.rules_extractor` for reprocessing comparisons.

mod common;
pub mod v1;
pub mod v2;

use super::extraction::ExtractionOutput;
use super::manifest::SourceManifest;

/// The first rules extractor's version.
pub const RULES_1: &str = "rules-1";
/// The default rules extractor's version.
pub const RULES_2: &str = "rules-2";

/// Whether `version` names one of the rules extractors.
pub fn is_rules_version(version: &str) -> bool {
    matches!(version, RULES_1 | RULES_2)
}

/// Runs the rules extractor `version` (`rules-1` or `rules-2`) over `manifest`.
pub fn extract(version: &str, manifest: &SourceManifest) -> ExtractionOutput {
    if version == RULES_1 {
        v1::extract(manifest)
    } else {
        v2::extract(manifest)
    }
}
