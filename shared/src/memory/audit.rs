//! `zuno memory audit`: what a project's resident Memory holds, read-only. Per document its size
//! against its character limit, the entries that share a subject (the identifiers, commands,
//! paths and tools they name), the pairs that state one rule twice ([`super::dedupe`]), and the
//! entries that name a file no longer in the worktree (stale candidates: the code they describe
//! moved on).
//!
//! A subject is deliberately narrow: the set of code-shaped words an entry names (a backticked
//! span, a path, an identifier with `_ . - / :` or an inner capital). A flag alone is no
//! subject: "… with `--seed 3`" and "… with `--seed 4`" are two rules. Two entries
//! share a subject when those sets are equal and not empty: "Use `pnpm`, not `npm`." and "Never
//! run `npm` here; `pnpm` keeps the lockfile." do; "Use `pnpm`." and "Run `pnpm test` first."
//! do not. An entry naming no such word has no subject and is compared by wording only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use super::dedupe::RuleSignature;
use super::store::{Scope, SupportedEntry};

/// The code-shaped words an entry names, lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Subject(pub BTreeSet<String>);

static BACKTICKED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"`([^`\n]{1,80})`").expect("a valid pattern"));
static CODE_WORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        (?:^|[\s(\[{,;:'\x22])
        (
          [\w.-]*[/\\][\w./\\-]*                          # a path
        | [A-Za-z_][\w-]+\.[A-Za-z][\w.]*                 # file.ext, module.attr (not e.g.)
        | [a-z0-9]+_[\w]+ | [A-Z0-9]+_[A-Z0-9_]+          # snake_case, ALL_CAPS
        | [a-z]+[A-Z][A-Za-z0-9]*                         # camelCase
        | [A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*                 # PascalCase with an inner capital
        )",
    )
    .expect("a valid pattern")
});

impl Subject {
    pub fn of(text: &str) -> Subject {
        let mut words = BTreeSet::new();
        for captures in BACKTICKED.captures_iter(text) {
            // A backticked command is named by its program and subcommand (`pnpm test --watch`
            // → `pnpm test`), so a flag change does not make it another subject.
            let span: Vec<&str> = captures[1]
                .split_whitespace()
                .filter(|part| !part.starts_with('-'))
                .take(2)
                .collect();
            let named = span.join(" ");
            if named.chars().any(char::is_alphabetic) {
                words.insert(named.to_lowercase());
            }
        }
        let outside = BACKTICKED.replace_all(text, " ");
        for captures in CODE_WORD.captures_iter(&outside) {
            let word = captures[1].trim_end_matches(['.', ',', ':', ';', ')']);
            if word.len() >= 2 && word.chars().any(char::is_alphabetic) {
                words.insert(word.to_lowercase());
            }
        }
        Subject(words)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The relative file paths the entry names (words with a `/` or a file extension that do
    /// not look like URLs or flags).
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str).filter(|word| {
            !word.starts_with('-')
                && !word.contains("://")
                && !word.contains(' ')
                && (word.contains('/') || has_extension(word))
        })
    }
}

fn has_extension(word: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        "rs", "toml", "json", "yaml", "yml", "md", "py", "ts", "tsx", "js", "jsx", "mjs", "go",
        "java", "rb", "sql", "sh", "css", "html", "lock", "txt", "cfg", "ini", "env",
    ];
    word.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && EXTENSIONS.contains(&ext))
}

/// The audit of one project's Memory (the global document and the project's).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryAudit {
    pub documents: Vec<DocumentAudit>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentAudit {
    pub target: Scope,
    pub entries: usize,
    /// Characters of the entries, against the document's limit (`memory.*_char_limit`).
    pub chars: usize,
    pub char_limit: u32,
    pub within_limit: bool,
    /// Groups of entries that name the same subject (two or more entries each).
    pub shared_subjects: Vec<SharedSubject>,
    /// Pairs of entries that state one rule in other words.
    pub duplicates: Vec<[AuditedEntry; 2]>,
    /// Entries naming a file that is not in the project's worktree.
    pub stale: Vec<StaleEntry>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditedEntry {
    pub id: String,
    pub content: String,
    /// `user`, `automatic` or `imported`.
    pub owner: String,
    pub experience_ids: Vec<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedSubject {
    pub subject: Vec<String>,
    pub entries: Vec<AuditedEntry>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaleEntry {
    pub entry: AuditedEntry,
    pub missing_paths: Vec<String>,
}

/// The document limits of `config`.
pub fn char_limit(config: &crate::config::Config, scope: Scope) -> u32 {
    match scope {
        Scope::Global => config.memory.global_char_limit,
        Scope::Project => config.memory.project_char_limit,
    }
}

/// Audits `entries` (as [`super::store::supported_entries`] reads them). `exists` says whether a
/// relative path is in the project's worktree; `None` when the project has none (nothing is
/// then reported stale).
pub fn audit(
    entries: &[SupportedEntry],
    limit: impl Fn(Scope) -> u32,
    exists: Option<&dyn Fn(&str) -> bool>,
) -> MemoryAudit {
    let mut documents = Vec::new();
    for scope in [Scope::Global, Scope::Project] {
        let of_scope: Vec<&SupportedEntry> = entries.iter().filter(|e| e.scope == scope).collect();
        if of_scope.is_empty() {
            continue;
        }
        documents.push(audit_document(scope, &of_scope, limit(scope), exists));
    }
    MemoryAudit { documents }
}

fn audit_document(
    scope: Scope,
    entries: &[&SupportedEntry],
    char_limit: u32,
    exists: Option<&dyn Fn(&str) -> bool>,
) -> DocumentAudit {
    let audited = |e: &SupportedEntry| AuditedEntry {
        id: e.entry.id.clone(),
        content: e.entry.content.clone(),
        owner: e.entry.owner.clone(),
        experience_ids: e.experience_ids.clone(),
    };
    let subjects: Vec<Subject> = entries
        .iter()
        .map(|e| Subject::of(&e.entry.content))
        .collect();
    let mut by_subject: BTreeMap<&Subject, Vec<AuditedEntry>> = BTreeMap::new();
    for (entry, subject) in entries.iter().zip(&subjects) {
        if !subject.is_empty() {
            by_subject.entry(subject).or_default().push(audited(entry));
        }
    }
    let shared_subjects = by_subject
        .into_iter()
        .filter(|(_, group)| group.len() > 1)
        .map(|(subject, entries)| SharedSubject {
            subject: subject.0.iter().cloned().collect(),
            entries,
        })
        .collect();
    let signatures: Vec<RuleSignature> = entries
        .iter()
        .map(|e| RuleSignature::of(&e.entry.content))
        .collect();
    let mut duplicates = Vec::new();
    for (i, a) in signatures.iter().enumerate() {
        for (j, b) in signatures.iter().enumerate().skip(i + 1) {
            if a.same_rule_as(b) {
                duplicates.push([audited(entries[i]), audited(entries[j])]);
            }
        }
    }
    let stale = match exists {
        Some(exists) => entries
            .iter()
            .zip(&subjects)
            .filter_map(|(entry, subject)| {
                let missing: Vec<String> = subject
                    .paths()
                    .filter(|path| !exists(path))
                    .map(str::to_owned)
                    .collect();
                (!missing.is_empty()).then(|| StaleEntry {
                    entry: audited(entry),
                    missing_paths: missing,
                })
            })
            .collect(),
        None => Vec::new(),
    };
    let chars: usize = entries
        .iter()
        .map(|e| e.entry.content.chars().count())
        .sum();
    DocumentAudit {
        target: scope,
        entries: entries.len(),
        chars,
        char_limit,
        within_limit: chars <= char_limit as usize,
        shared_subjects,
        duplicates,
        stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::store::Entry;

    fn subject(text: &str) -> Vec<String> {
        Subject::of(text).0.into_iter().collect()
    }

    #[test]
    fn a_subject_is_the_code_shaped_words_an_entry_names() {
        assert_eq!(subject("Use `pnpm`, not `npm`."), ["npm", "pnpm"]);
        assert_eq!(
            subject("Never run `npm` here; `pnpm` keeps the lockfile."),
            ["npm", "pnpm"]
        );
        assert_eq!(subject("Run `pnpm test --watch` first."), ["pnpm test"]);
        assert_eq!(
            subject("The price table is PRICE_TABLE in src/pricing/tables.py"),
            ["price_table", "src/pricing/tables.py"]
        );
        assert_eq!(
            subject("Edit next.config.mjs, not a new next.config.js"),
            ["next.config.js", "next.config.mjs"]
        );
        assert_eq!(
            subject("用 `dayjs` 格式化日期，不要用 moment.js"),
            ["dayjs", "moment.js"]
        );
        assert!(Subject::of("Always answer in English.").is_empty());
        assert!(Subject::of("Use pnpm (e.g. pnpm install), i.e. not npm.").is_empty());
        assert!(Subject::of("Run the generator with --seed 3 before the tests").is_empty());
    }

    #[test]
    fn the_audit_groups_shared_subjects_pairs_duplicates_and_finds_missing_files() {
        let entry = |id: &str, content: &str| SupportedEntry {
            scope: Scope::Project,
            entry: Entry {
                id: id.into(),
                content: content.into(),
                owner: "automatic".into(),
                derived: true,
                position: 0,
                created_revision: 1,
            },
            experience_ids: vec![format!("exp_{id}")],
        };
        let entries = [
            entry("a", "Use `pnpm`, not `npm`."),
            entry(
                "b",
                "Never run `npm` here; `pnpm` keeps the lockfile consistent.",
            ),
            entry("c", "use pnpm instead of npm"),
            entry("d", "Use pnpm, not npm"),
            entry("e", "Prices live in src/pricing/tables.py."),
            entry("f", "Always answer in English."),
        ];
        let exists = |path: &str| path != "src/pricing/tables.py";
        let audit = audit(&entries, |_| 100, Some(&exists));
        let [document] = audit.documents.as_slice() else {
            panic!("{audit:?}");
        };
        assert_eq!(document.entries, 6);
        assert!(!document.within_limit, "{} chars", document.chars);
        let groups: Vec<Vec<&str>> = document
            .shared_subjects
            .iter()
            .map(|group| group.entries.iter().map(|e| e.id.as_str()).collect())
            .collect();
        assert_eq!(groups, [["a", "b"]]);
        let pairs: Vec<[&str; 2]> = document
            .duplicates
            .iter()
            .map(|[x, y]| [x.id.as_str(), y.id.as_str()])
            .collect();
        assert_eq!(pairs, [["a", "c"], ["a", "d"], ["c", "d"]]);
        let stale: Vec<(&str, &[String])> = document
            .stale
            .iter()
            .map(|s| (s.entry.id.as_str(), s.missing_paths.as_slice()))
            .collect();
        assert_eq!(stale, [("e", &["src/pricing/tables.py".to_owned()][..])]);
    }
}
