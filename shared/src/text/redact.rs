//! Credential redaction, applied to every source record before it is clipped or shown to a
//! model. Each credential is replaced by a visible `[REDACTED:<family>]` marker; everything
//! around it — the header name, the assignment key, the URL's user and host, the quotes — stays
//! byte-identical, so the extractor still sees *that* a credential was used and where.
//!
//! The patterns lean towards redacting: a false positive costs a few words of context, a false
//! negative leaks a secret into stored experiences and model prompts. The negatives that matter
//! (prose mentioning "password", `sk`-words, commit hashes, plain URLs) are pinned by tests.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Redacted text and the credential families that were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    pub text: String,
    pub families: Vec<&'static str>,
}

/// Replaces credentials in `text`.
///
/// Idempotent: redacting the output again changes nothing. A replacement can expose a pattern
/// that the original bytes hid (a marker ends a word, so a word boundary appears), so the scan
/// repeats until nothing new is found; in practice the second scan finds only markers.
pub fn redact(text: &str) -> Redacted {
    let mut found = [false; Family::ALL.len()];
    let mut current = without_invisible(text);
    for _ in 0..MAX_PASSES {
        let findings = find(&current);
        if findings.is_empty() {
            break;
        }
        let mut out = String::with_capacity(current.len());
        let mut last = 0;
        for finding in &findings {
            out.push_str(&current[last..finding.range.start]);
            out.push_str("[REDACTED:");
            out.push_str(finding.family.name());
            out.push(']');
            last = finding.range.end;
            found[finding.family.index()] = true;
        }
        out.push_str(&current[last..]);
        current = Cow::Owned(out);
    }
    Redacted {
        text: current.into_owned(),
        families: Family::ALL
            .iter()
            .filter(|family| found[family.index()])
            .map(|family| family.name())
            .collect(),
    }
}

/// Format and zero-width characters (a zero-width space inside "pass\u{200b}word" or a JWT) hide
/// a credential from every pattern, and show nothing to a reader: they are dropped first.
fn without_invisible(text: &str) -> Cow<'_, str> {
    let invisible = |c: char| {
        matches!(
            c,
            '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FEFF}'
        )
    };
    if text.contains(invisible) {
        Cow::Owned(text.chars().filter(|&c| !invisible(c)).collect())
    } else {
        Cow::Borrowed(text)
    }
}

/// Every pass strictly shrinks the unredacted part of the text, so this bound is only reached
/// by adversarial input, and then the result is merely redacted more than once over.
const MAX_PASSES: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    PrivateKey,
    ApiKey,
    Token,
    Bearer,
    UrlPassword,
    SecretAssignment,
}

impl Family {
    /// The order `Redacted::families` lists them in.
    const ALL: [Family; 6] = [
        Family::PrivateKey,
        Family::ApiKey,
        Family::Token,
        Family::Bearer,
        Family::UrlPassword,
        Family::SecretAssignment,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Family::PrivateKey => "private_key",
            Family::ApiKey => "api_key",
            Family::Token => "token",
            Family::Bearer => "bearer",
            Family::UrlPassword => "url_password",
            Family::SecretAssignment => "secret_assignment",
        }
    }

    /// Overlapping findings become one marker, named after the lowest rank: the context a
    /// credential sits in (a key block, an `Authorization` header, a URL) says more than the
    /// shape of the value, and a recognised value shape says more than a generic assignment.
    fn rank(self) -> u8 {
        match self {
            Family::PrivateKey => 0,
            Family::Bearer => 1,
            Family::UrlPassword => 2,
            Family::Token => 3,
            Family::ApiKey => 4,
            Family::SecretAssignment => 5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Finding {
    range: Range<usize>,
    family: Family,
}

/// The credentials in `text`: sorted, disjoint, none of them already a marker.
fn find(text: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    private_keys(text, &mut findings);
    bearers(text, &mut findings);
    url_passwords(text, &mut findings);
    jwts(text, &mut findings);
    api_keys(text, &mut findings);
    assignments(text, &mut findings);
    spoken_passwords(text, &mut findings);
    // A span that is nothing but earlier markers is already redacted; dropping it here is what
    // makes a second `redact` a no-op.
    findings.retain(|finding| {
        finding.range.start < finding.range.end && !only_markers(&text[finding.range.clone()])
    });
    findings.sort_by_key(|finding| (finding.range.start, finding.family.rank()));
    let mut merged: Vec<Finding> = Vec::with_capacity(findings.len());
    for finding in findings {
        match merged.last_mut() {
            Some(last) if finding.range.start < last.range.end => {
                last.range.end = last.range.end.max(finding.range.end);
                if finding.family.rank() < last.family.rank() {
                    last.family = finding.family;
                }
            }
            _ => merged.push(finding),
        }
    }
    merged
}

fn regex(pattern: &str) -> Regex {
    // The patterns are constants exercised by every test; failing to compile one is a bug in
    // this file, not an input-dependent condition.
    Regex::new(pattern).expect("redaction patterns are valid")
}

static MARKER: LazyLock<Regex> = LazyLock::new(|| regex(r"\[REDACTED:[a-z_]+\]"));

fn only_markers(span: &str) -> bool {
    MARKER.replace_all(span, "").trim().is_empty()
}

fn push_group(caps: &Captures, group: usize, family: Family, out: &mut Vec<Finding>) {
    if let Some(m) = caps.get(group) {
        out.push(Finding {
            range: m.range(),
            family,
        });
    }
}

/// PEM/OpenSSH/PGP private key blocks, BEGIN through END; an unterminated block (a clipped
/// paste, a truncated tool output) runs to the end of the text.
fn private_keys(text: &str, out: &mut Vec<Finding>) {
    static PEM: LazyLock<Regex> = LazyLock::new(|| {
        regex(concat!(
            r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----",
            r".*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\z)",
        ))
    });
    for m in PEM.find_iter(text) {
        out.push(Finding {
            range: m.range(),
            family: Family::PrivateKey,
        });
    }
}

/// Characters of an HTTP credential (RFC 6750 `b64token`). `[`, `$`, `<` and `{` are excluded,
/// so markers, `$TOKEN` and `<token>` placeholders never match.
const B64TOKEN: &str = r"[A-Za-z0-9._~+/=-]+";

/// `Authorization: Bearer|Basic|token <credential>` (also quoted, as JSON or a curl `-H`
/// argument), and a bare `Bearer <credential>` that looks machine-generated. The header name
/// and scheme stay visible.
fn bearers(text: &str, out: &mut Vec<Finding>) {
    static HEADER: LazyLock<Regex> = LazyLock::new(|| {
        regex(&format!(
            concat!(
                r#"(?i)(?-u:\b)authorization(?:\\?["'])?[\t ]*[:=][\t ]*(?:\\?["'])?[\t ]*"#,
                r"(?:bearer|basic|token)[\t ]+({})",
            ),
            B64TOKEN
        ))
    });
    static BARE: LazyLock<Regex> = LazyLock::new(|| {
        regex(&format!(
            r"(?-u:\b)(?:Bearer|bearer|BEARER)[\t ]+({B64TOKEN})"
        ))
    });
    for caps in HEADER.captures_iter(text) {
        push_group(&caps, 1, Family::Bearer, out);
    }
    for caps in BARE.captures_iter(text) {
        // Without the header, "bearer" is an English word; only a long value mixing letters
        // and digits is taken for a credential.
        if caps
            .get(1)
            .is_some_and(|m| m.as_str().len() >= 16 && mixes_letters_and_digits(m.as_str()))
        {
            push_group(&caps, 1, Family::Bearer, out);
        }
    }
}

/// `scheme://user:PASSWORD@host`. The password may itself contain `@` (the last `@` of the
/// authority ends it), but not `/`, `?`, `#` or whitespace, which end the authority.
fn url_passwords(text: &str, out: &mut Vec<Finding>) {
    static URL: LazyLock<Regex> = LazyLock::new(|| {
        regex(concat!(
            r"(?i)(?-u:\b)[a-z][a-z0-9+.-]*://",
            r#"[^\s:/?#@"'<>\[\]]*:([^\s/?#"'<>]+)@"#,
        ))
    });
    for caps in URL.captures_iter(text) {
        // `${DB_PASSWORD}` is a reference, not the password: keeping it visible keeps context.
        if caps.get(1).is_some_and(|m| !m.as_str().starts_with('$')) {
            push_group(&caps, 1, Family::UrlPassword, out);
        }
    }
}

/// JSON Web Tokens: two base64url JSON segments (`eyJ` is `{"`) and a signature, possibly
/// empty for unsigned tokens.
fn jwts(text: &str, out: &mut Vec<Finding>) {
    static JWT: LazyLock<Regex> = LazyLock::new(|| {
        regex(r"(?-u:\b)eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
    });
    for m in JWT.find_iter(text) {
        out.push(Finding {
            range: m.range(),
            family: Family::Token,
        });
    }
}

/// Provider keys recognisable by their prefix alone.
fn api_keys(text: &str, out: &mut Vec<Finding>) {
    static KEYS: LazyLock<Regex> = LazyLock::new(|| {
        regex(concat!(
            r"(?-u:\b)(?:",
            // OpenAI (legacy, project, service account, admin) and Anthropic (`sk-ant-…`).
            r"(?P<sk>sk-[A-Za-z0-9_-]{20,})",
            // AWS access key ids: long-term and temporary.
            r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?-u:\b)",
            // GitHub: personal, OAuth, user-to-server, server-to-server, refresh; fine-grained.
            r"|gh[pousr]_[A-Za-z0-9]{36,}",
            r"|github_pat_[A-Za-z0-9_]{22,}",
            // Slack bot, user, app-level and refresh tokens.
            r"|xox[abprs]-[A-Za-z0-9-]{10,}",
            // Google API keys.
            r"|AIza[A-Za-z0-9_-]{35,}",
            // Stripe secret and restricted keys; test-mode keys are credentials too.
            r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
            // npm access tokens and Hugging Face tokens.
            r"|npm_[A-Za-z0-9]{36,}",
            r"|hf_[A-Za-z0-9]{30,}",
            // An AWS secret access key: 40 characters of base64 after an AWS key word.
            r"|(?i:aws[a-z_ -]{0,24}(?:secret|key)[a-z_ -]{0,12}[:=]?\s*)(?P<aws>[A-Za-z0-9/+]{40})(?-u:\b)",
            // A long hex string right after the word "token" ("token 3f9a…", "token: 3f9a…").
            r"|(?i:token\s*[:=]?\s*)(?P<hex>[0-9a-f]{32,})(?-u:\b)",
            r")",
        ))
    });
    for caps in KEYS.captures_iter(text) {
        // `sk-` starts ordinary hyphenated words (`sk-learn-compatible-estimators`); real keys
        // are random and mix letters and digits.
        if let Some(sk) = caps.name("sk")
            && !mixes_letters_and_digits(&sk.as_str()[3..])
        {
            continue;
        }
        // Keyed secrets keep their key word: only the value goes.
        let group = if caps.name("aws").is_some() {
            "aws"
        } else if caps.name("hex").is_some() {
            "hex"
        } else {
            push_group(&caps, 0, Family::ApiKey, out);
            continue;
        };
        let index = KEYS
            .capture_names()
            .position(|name| name == Some(group))
            .expect("a named group");
        push_group(&caps, index, Family::ApiKey, out);
    }
}

/// A password or passphrase said in prose: "my gpg passphrase is hunter2!", "the password was
/// Tr0ub4dor&3". Only a value that looks made up (a digit or a symbol beside letters) goes, so
/// "the password is required" and "the passphrase was wrong" stay.
fn spoken_passwords(text: &str, out: &mut Vec<Finding>) {
    static SPOKEN: LazyLock<Regex> = LazyLock::new(|| {
        regex(r#"(?i)\bpass(?:word|phrase|wd)\s+(?:is|was)\s+["'`]?(?P<value>[^\s"'`]{4,})"#)
    });
    for caps in SPOKEN.captures_iter(text) {
        let Some(value) = caps.name("value") else {
            continue;
        };
        let value_text = value
            .as_str()
            .trim_end_matches(['.', ',', ';', ')', '!', '?']);
        let made_up = value_text.chars().any(|c| c.is_ascii_alphabetic())
            && value_text
                .chars()
                .any(|c| c.is_ascii_digit() || c.is_ascii_punctuation());
        if made_up {
            out.push(Finding {
                range: value.start()..value.start() + value_text.len(),
                family: Family::SecretAssignment,
            });
        }
    }
}

/// Sensitive key names, matched case-insensitively as the *end* of a key (`DB_PASSWORD`,
/// `clientSecret`, `x-api-key`), so `max_tokens` or `token_count` never match.
const SENSITIVE_KEY: &str = concat!(
    "(?:password|passwd|passphrase|secret|token",
    "|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|auth[_-]?key)",
);

/// Words whose values are passwords rather than keys: never reported as `api_key`.
const PASSWORD_WORDS: [&str; 3] = ["password", "passwd", "passphrase"];

/// `key = value` in env/shell, YAML, TOML, JSON (also JSON nested in a JSON string), code and
/// CLI (`--password x`) styles, and the Chinese `密码：x`. The key stays, the value goes.
fn assignments(text: &str, out: &mut Vec<Finding>) {
    static ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
        regex(&format!(
            concat!(
                r"(?i)(?P<key>[a-z0-9_.-]*?{key})(?:\\?[\x22'])?[\t ]*(?P<sep>:=|=>|=|:)[\t ]*",
                r"(?:\\\x22(?P<esc>(?:[^\x22\\\n]|\\[^\x22\n])*)\\\x22",
                r"|\x22(?P<dq>(?:[^\x22\\\n]|\\.)*)\x22",
                r"|'(?P<sq>[^'\n]*)'",
                r"|(?P<bare>[^\s\x22'`,;&=\\][^\s\x22'`,;&\\]*))",
            ),
            key = SENSITIVE_KEY
        ))
    });
    static FLAG: LazyLock<Regex> = LazyLock::new(|| {
        regex(&format!(
            concat!(
                r"(?im)(?:^|[^A-Za-z0-9_-])(?P<key>--?[a-z0-9_-]*?{key})[\t ]+",
                r"(?:\x22(?P<dq>(?:[^\x22\\\n]|\\.)*)\x22",
                r"|'(?P<sq>[^'\n]*)'",
                r"|(?P<bare>[^\s\x22'`;|&<>-][^\s\x22'`;|&<>]*))",
            ),
            key = SENSITIVE_KEY
        ))
    });
    static CHINESE: LazyLock<Regex> = LazyLock::new(|| {
        regex(r"(?:密码|口令|密钥|秘钥|令牌)[\t ]*[:：=][\t ]*([[!-~]&&[^,;\x22'`]]+)")
    });

    for caps in ASSIGNMENT.captures_iter(text) {
        let (Some(key), Some(sep)) = (caps.name("key"), caps.name("sep")) else {
            continue;
        };
        let Some(word) = sensitive_suffix(key.as_str()) else {
            continue;
        };
        let Some((value, bare)) = assigned_value(&caps) else {
            continue;
        };
        // `password: click the link below` is prose; a YAML value is the whole rest of its
        // line. With `=` there is no such ambiguity (`PASSWORD=x ./run.sh`).
        if bare && sep.as_str() == ":" && !ends_value(&text[value.end..]) {
            continue;
        }
        push_value(text, key.as_str(), word, value, bare, out);
    }
    for caps in FLAG.captures_iter(text) {
        let Some(key) = caps.name("key") else {
            continue;
        };
        let Some(word) = sensitive_suffix(key.as_str().trim_start_matches('-')) else {
            continue;
        };
        let Some((value, bare)) = assigned_value(&caps) else {
            continue;
        };
        // "pass --token to enable it" is prose; a lower-case dictionary word is not taken for
        // a credential after a space-separated flag.
        if bare && text[value.clone()].bytes().all(|b| b.is_ascii_lowercase()) {
            continue;
        }
        push_value(text, key.as_str(), word, value, bare, out);
    }
    for caps in CHINESE.captures_iter(text) {
        if let Some(value) = caps.get(1)
            && !is_placeholder(value.as_str())
        {
            out.push(Finding {
                range: value.range(),
                family: Family::SecretAssignment,
            });
        }
    }
}

/// The value's range and whether it was unquoted.
fn assigned_value(caps: &Captures) -> Option<(Range<usize>, bool)> {
    if let Some(bare) = caps.name("bare") {
        return Some((trim_unbalanced(bare.as_str(), bare.start()), true));
    }
    ["esc", "dq", "sq"]
        .iter()
        .find_map(|name| caps.name(name))
        .map(|quoted| (quoted.range(), false))
}

fn push_value(
    text: &str,
    key: &str,
    word: &str,
    value: Range<usize>,
    bare: bool,
    out: &mut Vec<Finding>,
) {
    let literal = &text[value.clone()];
    if literal.trim().is_empty() || is_placeholder(literal) || (bare && is_code(literal)) {
        return;
    }
    let password_like = PASSWORD_WORDS.contains(&word);
    // `max_token: 100`, `token_ttl = 3600`-style numbers are settings; a numeric password is
    // still a password.
    if !password_like && literal.len() < 8 && literal.bytes().all(|b| b.is_ascii_digit()) {
        return;
    }
    let key_lower = key.to_ascii_lowercase();
    let family = if key_lower.contains("secret_access_key")
        || key_lower.contains("secretaccesskey")
        || (!password_like && looks_like_key_material(literal))
    {
        Family::ApiKey
    } else {
        Family::SecretAssignment
    };
    out.push(Finding {
        range: value,
        family,
    });
}

/// The sensitive word `key` ends with, if it ends with one at a word boundary: after a
/// separator (`db_password`, `x-api-key`, `self.token`), at a camelCase hump (`clientSecret`)
/// or as the whole key.
fn sensitive_suffix(key: &str) -> Option<&'static str> {
    const WORDS: [&str; 20] = [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "api_key",
        "api-key",
        "apikey",
        "access_key",
        "access-key",
        "accesskey",
        "secret_key",
        "secret-key",
        "secretkey",
        "private_key",
        "private-key",
        "privatekey",
        "auth_key",
        "auth-key",
        "authkey",
    ];
    let lower = key.to_ascii_lowercase();
    let word = WORDS
        .iter()
        .filter(|word| lower.ends_with(*word))
        .max_by_key(|word| word.len())?;
    let start = key.len() - word.len();
    let bytes = key.as_bytes();
    let at_boundary = start == 0
        || matches!(bytes[start - 1], b'_' | b'-' | b'.')
        || (bytes[start].is_ascii_uppercase()
            && (bytes[start - 1].is_ascii_lowercase() || bytes[start - 1].is_ascii_digit()));
    at_boundary.then_some(*word)
}

/// Whether what follows an unquoted `key: value` ends it: end of line, a comment, or the next
/// item of a flow mapping.
fn ends_value(rest: &str) -> bool {
    let rest = rest.trim_start_matches([' ', '\t', '\r']);
    rest.is_empty() || rest.starts_with(['\n', '#', ',', '}', ';'])
}

/// Trailing `)`/`}` that close something opened before the value (`f(token=abc)`,
/// `{password=x}`) are syntax, not part of the secret.
fn trim_unbalanced(value: &str, offset: usize) -> Range<usize> {
    let mut end = value.len();
    loop {
        let current = &value[..end];
        let unbalanced = |open: char, close: char| {
            current.ends_with(close)
                && current.matches(close).count() > current.matches(open).count()
        };
        if unbalanced('(', ')') || unbalanced('{', '}') {
            end -= 1;
        } else {
            return offset..offset + end;
        }
    }
}

/// References and stand-ins that carry no secret: keeping them visible keeps the context.
fn is_placeholder(value: &str) -> bool {
    let value = value.trim();
    let lower = value.to_ascii_lowercase();
    value.starts_with(['$', '<', '%'])
        || value.starts_with("{{")
        || matches!(
            lower.as_str(),
            "true" | "false" | "null" | "none" | "nil" | "undefined" | "yes" | "no"
        )
        || value.chars().all(|c| matches!(c, '*' | '•' | '.' | '…'))
}

/// Unquoted values that are code, not literals: calls, indexing and type annotations
/// (`password=getpass()`, `token = os.environ["X"]`, `password: str`).
fn is_code(value: &str) -> bool {
    static CALL: LazyLock<Regex> = LazyLock::new(|| regex(r"^[A-Za-z_][A-Za-z0-9_.:]*[(\[]"));
    CALL.is_match(value)
        || matches!(
            value,
            "str" | "&str" | "String" | "string" | "bytes" | "int" | "Option<String>"
        )
}

/// A generic key: 32+ characters of hex or (url-safe) base64.
fn looks_like_key_material(value: &str) -> bool {
    value.len() >= 32
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'_' | b'-'))
}

fn mixes_letters_and_digits(value: &str) -> bool {
    value.bytes().any(|b| b.is_ascii_digit()) && value.bytes().any(|b| b.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(text: &str) -> String {
        redact(text).text
    }

    fn families(text: &str) -> Vec<&'static str> {
        redact(text).families
    }

    /// Texts that must come back byte-identical with no family reported.
    fn assert_untouched(texts: &[&str]) {
        for text in texts {
            let result = redact(text);
            assert_eq!(result.text, *text, "changed: {text}");
            assert!(result.families.is_empty(), "{text}: {:?}", result.families);
        }
    }

    const RSA: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq9\nx3Kx+secret==\n-----END RSA PRIVATE KEY-----";

    #[test]
    fn private_key_blocks_are_redacted_whole() {
        assert_eq!(
            redacted(&format!("key:\n{RSA}\ndone")),
            "key:\n[REDACTED:private_key]\ndone"
        );
        for kind in ["EC ", "OPENSSH ", "ENCRYPTED ", "DSA ", ""] {
            let block = format!(
                "-----BEGIN {kind}PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END {kind}PRIVATE KEY-----"
            );
            assert_eq!(
                redacted(&format!("a {block} b")),
                "a [REDACTED:private_key] b",
                "{kind}"
            );
        }
        let pgp =
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----";
        assert_eq!(redacted(pgp), "[REDACTED:private_key]");
        assert_eq!(families(RSA), ["private_key"]);
    }

    #[test]
    fn private_keys_in_json_strings_and_two_blocks() {
        let json = r#"{"key":"-----BEGIN PRIVATE KEY-----\nMIIEvQ\n-----END PRIVATE KEY-----\n","next":1}"#;
        assert_eq!(
            redacted(json),
            r#"{"key":"[REDACTED:private_key]\n","next":1}"#
        );
        let two = format!("{RSA}\nbetween\n{RSA}");
        assert_eq!(
            redacted(&two),
            "[REDACTED:private_key]\nbetween\n[REDACTED:private_key]"
        );
    }

    #[test]
    fn unterminated_private_key_is_redacted_to_the_end() {
        let text = "cat id_ed25519\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5v […clipped…] ";
        assert_eq!(redacted(text), "cat id_ed25519\n[REDACTED:private_key]");
    }

    #[test]
    fn public_keys_and_certificates_are_not_private_keys() {
        assert_untouched(&[
            "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqh\n-----END PUBLIC KEY-----",
            "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+g\n-----END CERTIFICATE-----",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@host",
            "Generate a private key with `openssl genrsa`.",
        ]);
    }

    #[test]
    fn issue_31_gaps_are_closed() {
        // Zero-width characters inside the key word or the value.
        assert_eq!(
            redacted("pass\u{200b}word=hunter2secret"),
            "password=[REDACTED:secret_assignment]"
        );
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        let hidden = format!("{}\u{2060}{}", &jwt[..10], &jwt[10..]);
        assert!(!redacted(&format!("token {hidden}")).contains("eyJzdWIi"));
        // npm, Hugging Face, AWS secret access keys, hex after "token".
        for (text, expected) in [
            (
                "//registry.npmjs.org/:_authToken npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
                "//registry.npmjs.org/:_authToken [REDACTED:api_key]",
            ),
            (
                "HF token hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
                "HF token [REDACTED:api_key]",
            ),
            (
                "aws secret key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws secret key [REDACTED:api_key]",
            ),
            (
                "the token 3f9a1c2b4d5e6f708192a3b4c5d6e7f8 expired",
                "the token [REDACTED:api_key] expired",
            ),
            (
                "my gpg passphrase is hunter2! please",
                "my gpg passphrase is [REDACTED:secret_assignment]! please",
            ),
        ] {
            assert_eq!(redacted(text), expected, "{text}");
        }
        assert_untouched(&[
            "the password is required",
            "the passphrase was wrong, try again",
            "tokens: 4096",
            "commit 3f9a1c2b4d5e6f708192a3b4c5d6e7f8 fixed it",
        ]);
    }

    #[test]
    fn openai_and_anthropic_keys() {
        let cases = [
            "sk-4fJd8Kq2LmN9pQr7StUvWxYz0123456789abcdEF",
            "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z-AB",
            "sk-svcacct-Zq81mX0bQ4wE7rT2yU5iO9pA3sD6fG1hJ4kL",
            "sk-ant-api03-7uXw2Hq9ZpLk3Rt5Vn8Bm1Cx4Jd6Fg0Sa2Qe7Wy9Ui3Oo5Pp8Ll1Kk4Jj6Hh0Gg-AbCdEfAA",
        ];
        for key in cases {
            assert_eq!(
                redacted(&format!("export OPENAI_API_KEY={key}\ncurl …")),
                "export OPENAI_API_KEY=[REDACTED:api_key]\ncurl …",
                "{key}"
            );
            assert_eq!(
                redacted(&format!("使用密钥 {key} 调用")),
                "使用密钥 [REDACTED:api_key] 调用"
            );
        }
    }

    #[test]
    fn aws_keys() {
        assert_eq!(
            redacted("aws_access_key_id = AKIAIOSFODNN7EXAMPLE"),
            "aws_access_key_id = [REDACTED:api_key]"
        );
        assert_eq!(
            redacted("creds ASIAY34FZKBOKMUTVV7A expire"),
            "creds [REDACTED:api_key] expire"
        );
        let config = "[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nregion = eu-west-1";
        assert_eq!(
            redacted(config),
            "[default]\naws_secret_access_key = [REDACTED:api_key]\nregion = eu-west-1"
        );
        assert_eq!(families(config), ["api_key"]);
        assert_eq!(
            redacted("AWS_SECRET_ACCESS_KEY=short"),
            "AWS_SECRET_ACCESS_KEY=[REDACTED:api_key]"
        );
    }

    #[test]
    fn github_slack_google_stripe_keys() {
        let cases = [
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "gho_16C7e42F292c6912E7710c838347Ae178B4a",
            "ghu_16C7e42F292c6912E7710c838347Ae178B4a",
            "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
            "ghr_1B4a2e77838347a7E420ce178F2E7c6912E169246c34E1ccbF66C46812d16D5B1A9Dc86A1498",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRS",
            "xoxb-2345678901-2345678901234-AbCdEfGhIjKlMnOpQrStUvWx",
            "xoxp-123456789012-123456789012-123456789012-0123456789abcdef0123456789abcdef",
            "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
            "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "rk_live_51H8xYzAbCdEfGhIjKlMnOpQr",
        ];
        for key in cases {
            assert_eq!(
                redacted(&format!("git remote set-url origin x; echo {key}; done")),
                "git remote set-url origin x; echo [REDACTED:api_key]; done",
                "{key}"
            );
        }
        assert_eq!(
            redacted("Authorization: token ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
            "Authorization: token [REDACTED:bearer]"
        );
    }

    #[test]
    fn generic_long_values_under_key_names_are_api_keys() {
        assert_eq!(
            redacted(
                "STRIPE_WEBHOOK_SECRET=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
            ),
            "STRIPE_WEBHOOK_SECRET=[REDACTED:api_key]"
        );
        assert_eq!(
            redacted(r#"{"apiKey": "dGhpcyBpcyBhIHZlcnkgc2VjcmV0IGtleSE0Mg=="}"#),
            r#"{"apiKey": "[REDACTED:api_key]"}"#
        );
        assert_eq!(
            redacted("access_key: 0123456789abcdef0123456789abcdef"),
            "access_key: [REDACTED:api_key]"
        );
        // A long password is still a password.
        assert_eq!(
            families("DB_PASSWORD=0123456789abcdef0123456789abcdef"),
            ["secret_assignment"]
        );
    }

    #[test]
    fn api_key_lookalikes_are_left_alone() {
        assert_untouched(&[
            "Install sk-learn-compatible-estimators-package first",
            "sk-learn is not the package name; scikit-learn is",
            "This is a risk-free change to the task-sk-runner",
            "sketch the sk- prefix and the sk_ prefix",
            "commit 3f9c2b7e8a1d4c6f0b5e9a2d7c4f1e8b6a3d0c9f\nAuthor: Dev <dev@example.com>",
            "fixed in a1b2c3d, see 9fceb02d0ae598e95dc970b74767f19372d61af8",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "AKIA is the prefix of AWS access key ids",
            "ghp tokens and github_pat tokens are GitHub's formats",
            "use stripe's sk_test_ keys in CI",
            "the value is base64: aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSBzZWNyZXQ=",
        ]);
    }

    #[test]
    fn jwts_are_tokens() {
        let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";
        assert_eq!(
            redacted(&format!("session cookie {jwt} expired")),
            "session cookie [REDACTED:token] expired"
        );
        assert_eq!(
            redacted(&format!(r#"{{"id_token":"{jwt}"}}"#)),
            r#"{"id_token":"[REDACTED:token]"}"#
        );
        // Unsigned tokens (alg "none") have an empty signature.
        assert_eq!(
            redacted("t=eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0. ok"),
            "t=[REDACTED:token] ok"
        );
        assert_eq!(families(jwt), ["token"]);
        assert_untouched(&["eyJ is base64 for {\" and eyJhbGciOi alone is not a token"]);
    }

    #[test]
    fn authorization_headers_keep_their_name() {
        assert_eq!(
            redacted("Authorization: Bearer abc123.def-456_ghi"),
            "Authorization: Bearer [REDACTED:bearer]"
        );
        assert_eq!(
            redacted(
                r#"curl -H "authorization: bearer sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2" https://api.example.com"#
            ),
            r#"curl -H "authorization: bearer [REDACTED:bearer]" https://api.example.com"#
        );
        assert_eq!(
            redacted(r#"{"headers":{"Authorization":"Bearer tok_9f8e7d6c"}}"#),
            r#"{"headers":{"Authorization":"Bearer [REDACTED:bearer]"}}"#
        );
        assert_eq!(
            redacted(r#"{"cmd":"curl -H \"Authorization: Basic dXNlcjpwYXNzd29yZA==\" x"}"#),
            r#"{"cmd":"curl -H \"Authorization: Basic [REDACTED:bearer]\" x"}"#
        );
        assert_eq!(
            redacted("Proxy-Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l"),
            "Proxy-Authorization: Basic [REDACTED:bearer]"
        );
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ6dW5vIn0.c2lnbmF0dXJl";
        assert_eq!(
            redacted(&format!("Authorization: Bearer {jwt}")),
            "Authorization: Bearer [REDACTED:bearer]"
        );
        assert_eq!(
            families(&format!("Authorization: Bearer {jwt}")),
            ["bearer"]
        );
    }

    #[test]
    fn bare_bearer_values_need_to_look_generated() {
        assert_eq!(
            redacted("send Bearer 8c1f0e2a9b7d4c3e5f6a then retry"),
            "send Bearer [REDACTED:bearer] then retry"
        );
        assert_untouched(&[
            "Bearer authentication is described in RFC 6750",
            "the bearer of bad news",
            "Authorization: Bearer $GITHUB_TOKEN",
            "Authorization: Bearer <token>",
            "Authorization: Bearer ${{ secrets.TOKEN }}",
            "the Authorization header carries the credentials",
        ]);
    }

    #[test]
    fn url_passwords_keep_user_and_host() {
        assert_eq!(
            redacted("DATABASE_URL=postgres://zuno:s3cr3t@db:5432/zuno"),
            "DATABASE_URL=postgres://zuno:[REDACTED:url_password]@db:5432/zuno"
        );
        assert_eq!(
            redacted("redis://:hunter2@cache.internal:6379/0"),
            "redis://:[REDACTED:url_password]@cache.internal:6379/0"
        );
        assert_eq!(
            redacted("git clone https://bot:p@ss:w0rd@git.example.com/org/repo.git"),
            "git clone https://bot:[REDACTED:url_password]@git.example.com/org/repo.git"
        );
        assert_eq!(
            redacted("连接 mysql://root:RootPass1@127.0.0.1/app 失败"),
            "连接 mysql://root:[REDACTED:url_password]@127.0.0.1/app 失败"
        );
        assert_eq!(
            families("amqp://guest:guest@localhost:5672/"),
            ["url_password"]
        );
    }

    #[test]
    fn urls_without_passwords_are_left_alone() {
        assert_untouched(&[
            "see https://example.com/path for details",
            "https://example.com:8443/a/b?c=d@e#f",
            "git@github.com:org/repo.git",
            "ssh://git@github.com/org/repo.git",
            "postgres://zuno@db:5432/zuno",
            "mailto:someone@example.com",
            "postgres://user:${DB_PASSWORD}@db/app",
            "http://localhost:3000/api/users",
        ]);
    }

    #[test]
    fn env_and_shell_assignments() {
        assert_eq!(
            redacted("DB_PASSWORD=hunter2\nDB_HOST=localhost"),
            "DB_PASSWORD=[REDACTED:secret_assignment]\nDB_HOST=localhost"
        );
        assert_eq!(
            redacted("export API_KEY=abc123 && ./run.sh"),
            "export API_KEY=[REDACTED:secret_assignment] && ./run.sh"
        );
        assert_eq!(
            redacted(r#"PASSWORD="correct horse battery staple" make deploy"#),
            r#"PASSWORD="[REDACTED:secret_assignment]" make deploy"#
        );
        assert_eq!(
            redacted("GITHUB_TOKEN='gh-local-dev' ./sync"),
            "GITHUB_TOKEN='[REDACTED:secret_assignment]' ./sync"
        );
        assert_eq!(
            redacted("https://api.example.com/v1/items?api_key=q1w2e3r4&page=2"),
            "https://api.example.com/v1/items?api_key=[REDACTED:secret_assignment]&page=2"
        );
    }

    #[test]
    fn yaml_toml_and_json_assignments() {
        assert_eq!(
            redacted("db:\n  user: app\n  password: hunter2\n  passwd: s3cret # old\n"),
            "db:\n  user: app\n  password: [REDACTED:secret_assignment]\n  passwd: [REDACTED:secret_assignment] # old\n"
        );
        assert_eq!(
            redacted("[auth]\nsecret = \"abc\"\nclient_secret: 'xyz'"),
            "[auth]\nsecret = \"[REDACTED:secret_assignment]\"\nclient_secret: '[REDACTED:secret_assignment]'"
        );
        assert_eq!(
            redacted(r#"{"user":"bob","password":"p\"w","token": "t0k"}"#),
            r#"{"user":"bob","password":"[REDACTED:secret_assignment]","token": "[REDACTED:secret_assignment]"}"#
        );
        // JSON nested in a JSON string, as tool arguments carry it.
        assert_eq!(
            redacted(r#"bash {"cmd":"echo {\"password\": \"hunter2\"} > cfg.json"}"#),
            r#"bash {"cmd":"echo {\"password\": \"[REDACTED:secret_assignment]\"} > cfg.json"}"#
        );
        assert_eq!(
            redacted("X-Api-Key: 5f2b1c\r\nAccept: */*"),
            "X-Api-Key: [REDACTED:secret_assignment]\r\nAccept: */*"
        );
        assert_eq!(
            redacted("{password: hunter2, user: bob}"),
            "{password: [REDACTED:secret_assignment], user: bob}"
        );
        assert_eq!(
            redacted("connect(host=h, password=pw1)"),
            "connect(host=h, password=[REDACTED:secret_assignment])"
        );
    }

    #[test]
    fn cli_flags_and_chinese_assignments() {
        assert_eq!(
            redacted("mysql -u root --password Tr0ub4dor -h db"),
            "mysql -u root --password [REDACTED:secret_assignment] -h db"
        );
        assert_eq!(
            redacted("zuno login --token=abcd1234"),
            "zuno login --token=[REDACTED:secret_assignment]"
        );
        assert_eq!(
            redacted(r#"psql --password "pa ss" app"#),
            r#"psql --password "[REDACTED:secret_assignment]" app"#
        );
        assert_eq!(
            redacted("数据库密码：Hunter2024，用户名 admin"),
            "数据库密码：[REDACTED:secret_assignment]，用户名 admin"
        );
        assert_eq!(redacted("令牌=abc123"), "令牌=[REDACTED:secret_assignment]");
    }

    #[test]
    fn prose_and_code_that_mention_secrets_are_left_alone() {
        assert_untouched(&[
            "Reset your password: click the link below.",
            "The password is stored in the vault, never in the repo.",
            "Forgot password? Use the token from your email.",
            "max_tokens: 4096\ninput_tokens=1200\ntoken_count = 12",
            "secret: true\ntoken: null\npassword: str",
            "password = getpass.getpass()\ntoken = os.environ[\"TOKEN\"]",
            "PASSWORD=$DB_PASSWORD ./run\ntoken: ${{ secrets.GITHUB_TOKEN }}",
            "if token == expected { return }",
            "kind: Secret\nsecretName: tls-cert",
            "pass --token to enable it, or the --password option",
            "password: ********",
            "密码：请联系管理员获取",
            "不要把 token 写进代码里，密码也不要。",
        ]);
    }

    #[test]
    fn families_are_listed_once_in_a_stable_order() {
        let text = format!(
            "password=x1 Authorization: Bearer tok123456 {RSA} sk-ant-api03-0123456789abcdefGHIJ eyJhbGciOi.eyJzdWIiOi.sig https://u:p@h password=x2"
        );
        assert_eq!(
            families(&text),
            [
                "private_key",
                "api_key",
                "token",
                "bearer",
                "url_password",
                "secret_assignment"
            ]
        );
        assert!(families("nothing to see").is_empty());
    }

    #[test]
    fn redaction_is_idempotent_on_examples() {
        for text in [
            format!("{RSA} and password=hunter2"),
            "password=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t.more".to_owned(),
            "https://u:sk-ant-api03-0123456789abcdefGHIJ@host".to_owned(),
            "password=[REDACTED:api_key]tail".to_owned(),
            "Authorization: Bearer [REDACTED:bearer]".to_owned(),
            "-----BEGIN PRIVATE KEY-----\nunterminated".to_owned(),
        ] {
            let once = redacted(&text);
            assert_eq!(redacted(&once), once, "{text}");
        }
        assert_eq!(
            redacted("password=[REDACTED:api_key]tail"),
            "password=[REDACTED:secret_assignment]"
        );
    }

    /// A small deterministic generator, so the property test needs no extra crates and
    /// failures reproduce.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    const SECRETS: [&str; 14] = [
        "sk-proj-Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9",
        "sk-ant-api03-Zx1Cv3Bn5Mm7Ll9Kk2Jj4Hh6",
        "AKIAQWERTYUIOP123456",
        "ghp_aB1cD2eF3gH4iJ5kL6mN7oP8qR9sT0uV1wX2",
        "xoxb-1111111111-AbCdEfGhIjKl",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "sk_live_Zz9Yy8Xx7Ww6Vv5Uu4",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJxIn0.Qk3mZp9Lr2",
        "Authorization: Bearer Tk8Lm2Np4Qr6",
        "postgres://app:Pw9Secret@db/app",
        "DB_PASSWORD=Pw7Hidden",
        "\"api_key\": \"Ak5Hidden\"",
        "--password Pw3Flagged",
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIKeySecret\n-----END EC PRIVATE KEY-----",
    ];

    /// The part of each secret that must never survive redaction.
    const PAYLOADS: [&str; 14] = [
        "Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9",
        "Zx1Cv3Bn5Mm7Ll9Kk2Jj4Hh6",
        "QWERTYUIOP123456",
        "aB1cD2eF3gH4iJ5kL6mN7oP8qR9sT0uV1wX2",
        "AbCdEfGhIjKl",
        "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "Zz9Yy8Xx7Ww6Vv5Uu4",
        "Qk3mZp9Lr2",
        "Tk8Lm2Np4Qr6",
        "Pw9Secret",
        "Pw7Hidden",
        "Ak5Hidden",
        "Pw3Flagged",
        "MHcCAQEEIKeySecret",
    ];

    const FILLER: [&str; 32] = [
        "hello",
        "不对，应该用 pnpm",
        "以后都用中文回答。",
        "🦀",
        "é",
        "ß",
        "İ",
        "\u{200b}",
        " ",
        "\n",
        "\r\n",
        "\t",
        "=",
        ":",
        "：",
        "\"",
        "'",
        "\\\"",
        "@",
        "://",
        "[REDACTED:api_key]",
        "[REDACTED:",
        "-----BEGIN ",
        "PRIVATE KEY-----",
        "-----END RSA PRIVATE KEY-----",
        "password",
        "token",
        "Bearer",
        "sk-",
        "eyJ",
        "(",
        "}",
    ];

    fn random_text(rng: &mut XorShift) -> String {
        let mut text = String::new();
        for _ in 0..(rng.next() % 24) {
            match rng.next() % 4 {
                0 => text.push_str(rng.pick(&SECRETS)),
                1 => {
                    // Printable ASCII (the alphabet of every pattern), CJK, or any scalar
                    // value including astral and combining ones.
                    let code = match rng.next() % 3 {
                        0 => 0x20 + rng.next() % 0x5f,
                        1 => 0x4e00 + rng.next() % 0x5200,
                        _ => rng.next() % 0x11_0000,
                    };
                    text.push(char::from_u32(code as u32).unwrap_or('\u{fffd}'));
                }
                _ => text.push_str(rng.pick(&FILLER)),
            }
        }
        text
    }

    #[test]
    fn never_panics_and_is_idempotent_on_generated_text() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..10_000 {
            let text = random_text(&mut rng);
            let once = redact(&text);
            let twice = redact(&once.text);
            assert_eq!(twice.text, once.text, "not idempotent on {text:?}");
        }
    }

    #[test]
    fn separated_secrets_never_survive_in_generated_text() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for _ in 0..2_000 {
            let mut text = String::new();
            for _ in 0..(1 + rng.next() % 8) {
                if rng.next().is_multiple_of(2) {
                    text.push_str(rng.pick(&SECRETS));
                } else {
                    text.push_str(rng.pick(&["不对，应该用 pnpm", "run the tests", "🦀 ok", "é"]));
                }
                text.push_str(rng.pick(&[" ", "\n", " 。", ", ", "\r\n"]));
            }
            let out = redacted(&text);
            for payload in PAYLOADS {
                assert!(!out.contains(payload), "{payload} survived in {out:?}");
            }
        }
    }

    #[test]
    fn text_without_credentials_is_byte_identical() {
        assert_untouched(&[
            "",
            "   ",
            "不对，应该用 pnpm 安装。以后都用中文回答！",
            "fn main() { println!(\"{}\", 1 + 2); } // 🦀",
            "error[E0308]: mismatched types\n --> src/main.rs:4:5",
            "Ünïcödé ТЕКСТ 日本語 한국어 العربية",
        ]);
    }
}
