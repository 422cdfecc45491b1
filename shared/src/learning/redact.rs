//! Credential redaction, applied to every source record before it is clipped or shown to a
//! model. Each family is replaced by a visible `[REDACTED:<family>]` marker.

/// Redacted text and the credential families that were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    pub text: String,
    pub families: Vec<&'static str>,
}

/// Replaces credentials in `text`.
pub fn redact(text: &str) -> Redacted {
    let mut families = Vec::new();
    let mut out = text.to_owned();
    if let Some(replaced) = redact_private_keys(&out) {
        out = replaced;
        families.push("private_key");
    }
    Redacted {
        text: out,
        families,
    }
}

fn redact_private_keys(text: &str) -> Option<String> {
    let begin = text.find("-----BEGIN ")?;
    let header_end = text[begin..].find("PRIVATE KEY-----")? + begin;
    let end_marker = text[header_end..].find("-----END ")? + header_end;
    let end = text[end_marker..].find("PRIVATE KEY-----")? + end_marker + "PRIVATE KEY-----".len();
    Some(format!(
        "{}[REDACTED:private_key]{}",
        &text[..begin],
        &text[end..]
    ))
}
