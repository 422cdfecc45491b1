//! The skills store: every statement over patterns and their evidence, aggregation scopes,
//! Skill candidates, evaluation suites and runs, and apply/undo operations. The domain modules
//! beside it decide what happens; these functions only read and write rows.

pub mod aggregation;
pub mod candidate;
pub mod evaluation;
pub mod operation;
pub mod pattern;

/// Rules as stored: a JSON array of strings.
pub(crate) fn rules_json(rules: &[String]) -> String {
    serde_json::to_string(rules).unwrap_or_else(|_| String::from("[]"))
}

pub(crate) fn parse_rules(text: &str) -> Result<Vec<String>, crate::db::StoreError> {
    serde_json::from_str(text)
        .map_err(|e| crate::db::StoreError::Corrupt(format!("pattern rules: {e}")))
}
