//! Durable identifiers: a short type prefix plus a time-ordered UUIDv7, so ids sort by creation
//! and a pasted id says what it names.

/// A new id such as `job_01939f…`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// A fresh random lease token (128 bits from the OS generator).
pub fn new_lease_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// True when `value` is a plausible externally supplied identifier: 1–128 characters of
/// `[A-Za-z0-9._:@-]`, starting with a letter or digit. Callers use it to reject ids before they
/// reach paths or logs.
pub fn is_valid_external_id(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 128
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_prefix_and_sort_by_creation() {
        let a = new_id("job");
        let b = new_id("job");
        assert!(a.starts_with("job_"));
        assert!(a < b, "{a} should sort before {b}");
    }

    #[test]
    fn external_ids_reject_path_and_control_characters() {
        assert!(is_valid_external_id("proj-1.main"));
        assert!(!is_valid_external_id("../etc"));
        assert!(!is_valid_external_id(".."));
        assert!(!is_valid_external_id("a/b"));
        assert!(!is_valid_external_id(""));
        assert!(!is_valid_external_id("a\nb"));
        assert!(!is_valid_external_id(&"x".repeat(129)));
    }
}
