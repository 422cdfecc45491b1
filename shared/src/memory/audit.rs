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

/// The code-shaped words `text` names, as written.
fn code_words(text: &str) -> BTreeSet<String> {
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
            words.insert(named);
        }
    }
    let outside = BACKTICKED.replace_all(text, " ");
    for captures in CODE_WORD.captures_iter(&outside) {
        let word = captures[1].trim_end_matches(['.', ',', ':', ';', ')']);
        if word.len() >= 2 && word.chars().any(char::is_alphabetic) {
            words.insert(word.to_owned());
        }
    }
    words
}

/// Whether a code-shaped word is a relative file path: it has a `/` or a known file extension
/// and is no URL, flag or command.
fn is_path(word: &str) -> bool {
    !word.starts_with('-')
        && !word.contains("://")
        && !word.contains(' ')
        && (word.contains('/') || has_extension(word))
}

/// The file paths `text` names, as written (a worktree's file system may be case-sensitive).
pub fn named_paths(text: &str) -> Vec<String> {
    code_words(text)
        .into_iter()
        .filter(|w| is_path(w))
        .collect()
}

/// Whether an entry naming `paths` describes code that left the worktree: it names at least one
/// path and none of them exists. "Edit next.config.mjs, not a new next.config.js" names a file
/// that should not exist; it is stale only once next.config.mjs is gone too.
pub fn names_only_missing_files(paths: &[String], exists: &dyn Fn(&str) -> bool) -> bool {
    !paths.is_empty() && paths.iter().all(|path| !exists(path))
}

/// Whether `relative` (a path an entry names) is in the worktree `root`. A path that is absolute
/// or climbs out with `..` counts as present: an entry's text never makes the server look
/// outside the worktree.
pub fn exists_in_worktree(root: &std::path::Path, relative: &str) -> bool {
    let path = std::path::Path::new(relative);
    let stays_inside = path.components().all(|part| {
        matches!(
            part,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    !stays_inside || root.join(path).symlink_metadata().is_ok()
}

impl Subject {
    pub fn of(text: &str) -> Subject {
        Subject(code_words(text).iter().map(|w| w.to_lowercase()).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn has_extension(word: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        "rs", "toml", "json", "yaml", "yml", "md", "py", "ts", "tsx", "js", "jsx", "mjs", "go",
        "java", "rb", "sql", "sh", "css", "html", "lock", "txt", "cfg", "ini", "env",
    ];
    word.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str())
    })
}

/// Entries about one subject, as the maintenance plan request lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubjectGroup<'a> {
    /// The code words the group's entries share (all of them for a group of one); empty for an
    /// entry that names none.
    pub subject: Vec<String>,
    pub entries: Vec<&'a str>,
}

/// Groups `entries` by subject, in document order: two entries are in one group when they
/// share a code word, directly or through another entry of the group. Entries naming no code
/// word stand alone.
pub fn group_by_subject(entries: &[String]) -> Vec<SubjectGroup<'_>> {
    let subjects: Vec<Subject> = entries.iter().map(|e| Subject::of(e)).collect();
    let mut group_of: Vec<usize> = (0..entries.len()).collect();
    for i in 0..entries.len() {
        for j in 0..i {
            if !subjects[i].0.is_disjoint(&subjects[j].0) {
                let (from, to) = (group_of[i], group_of[j]);
                for group in group_of.iter_mut().filter(|g| **g == from) {
                    *group = to;
                }
            }
        }
    }
    let mut groups: Vec<(usize, SubjectGroup<'_>)> = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        match groups.iter_mut().find(|(id, _)| *id == group_of[index]) {
            Some((_, group)) => group.entries.push(entry),
            None => groups.push((
                group_of[index],
                SubjectGroup {
                    subject: Vec::new(),
                    entries: vec![entry],
                },
            )),
        }
    }
    for (id, group) in &mut groups {
        let members: Vec<&Subject> = (0..entries.len())
            .filter(|&i| group_of[i] == *id)
            .map(|i| &subjects[i])
            .collect();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for word in members.iter().flat_map(|s| s.0.iter()) {
            *counts.entry(word).or_default() += 1;
        }
        let shared = |n: usize| members.len() == 1 || n > 1;
        group.subject = counts
            .into_iter()
            .filter(|(_, n)| shared(*n))
            .map(|(word, _)| word.to_owned())
            .collect();
    }
    groups.into_iter().map(|(_, group)| group).collect()
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
    /// Current entries every file of which is gone from the project's worktree: the next
    /// maintenance withholds the derived ones (a person's own entries are only listed).
    pub stale: Vec<StaleEntry>,
    /// Entries maintenance withheld as stale, newest first; `zuno memory restore` brings one
    /// back as the user's own entry.
    pub marked_stale: Vec<MarkedStale>,
    /// Derived entries consolidation pushed out to keep the document within its limit, newest
    /// first (of the last 200 applied changes), that the document does not hold again: their
    /// lessons stay Experience, recallable by `context`.
    pub pushed_out: Vec<PushedOut>,
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

/// An entry pushed out at the cap, by the change that pushed it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushedOut {
    pub candidate_id: String,
    #[serde(skip)]
    pub scope: Scope,
    pub content: String,
    /// Why it ranked lowest: `unsupported`, `unused`, `violated` or `weakest`.
    pub reason: super::consolidate::DropReason,
    /// The experiences it rested on: still Experience.
    pub experience_ids: Vec<String>,
}

/// The entries pushed out at the cap by `applied` candidates (newest first) that `current`
/// does not hold again.
pub fn pushed_out(
    applied: &[super::store::Candidate],
    current: &[SupportedEntry],
) -> Vec<PushedOut> {
    let mut found: Vec<PushedOut> = Vec::new();
    for candidate in applied {
        let Some(consolidation) = candidate.consolidation() else {
            continue;
        };
        let Some(scope) = Scope::parse(&candidate.target) else {
            continue;
        };
        for dropped in consolidation.dropped {
            let back = current
                .iter()
                .any(|e| e.scope == scope && e.entry.content == dropped.content);
            if !back
                && !found
                    .iter()
                    .any(|p| p.scope == scope && p.content == dropped.content)
            {
                found.push(PushedOut {
                    candidate_id: candidate.id.clone(),
                    scope,
                    content: dropped.content,
                    reason: dropped.reason,
                    experience_ids: dropped.evidence,
                });
            }
        }
    }
    found
}

/// An entry maintenance withheld as stale (`memory_stale_entry`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MarkedStale {
    /// The `remove` candidate that withheld it: `zuno memory restore <candidateId>`.
    pub candidate_id: String,
    #[serde(skip)]
    pub scope: Scope,
    pub content: String,
    /// `missing_files` or `unused`.
    pub reason: String,
    pub missing_paths: Vec<String>,
    pub marked_at: i64,
    /// The `add` candidate that restored it, when a person did.
    pub restored_candidate_id: Option<String>,
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
    marked: &[MarkedStale],
    pushed: &[PushedOut],
    limit: impl Fn(Scope) -> u32,
    exists: Option<&dyn Fn(&str) -> bool>,
) -> MemoryAudit {
    let mut documents = Vec::new();
    for scope in [Scope::Global, Scope::Project] {
        let of_scope: Vec<&SupportedEntry> = entries.iter().filter(|e| e.scope == scope).collect();
        let marked: Vec<MarkedStale> = marked
            .iter()
            .filter(|m| m.scope == scope)
            .cloned()
            .collect();
        let pushed: Vec<PushedOut> = pushed
            .iter()
            .filter(|p| p.scope == scope)
            .cloned()
            .collect();
        if of_scope.is_empty() && marked.is_empty() && pushed.is_empty() {
            continue;
        }
        let mut document = audit_document(scope, &of_scope, limit(scope), exists);
        document.marked_stale = marked;
        document.pushed_out = pushed;
        documents.push(document);
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
            .filter_map(|entry| {
                let paths = named_paths(&entry.entry.content);
                names_only_missing_files(&paths, exists).then(|| StaleEntry {
                    entry: audited(entry),
                    missing_paths: paths,
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
        marked_stale: Vec::new(),
        pushed_out: Vec::new(),
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
    fn the_plan_request_groups_entries_that_share_a_code_word() {
        let entries: Vec<String> = [
            "The price table is the PRICE_TABLE constant in `PricingA`.",
            "Always answer in English.",
            "PRICE_TABLE now lives in `PricingB`, not `PricingA`.",
            "Use `pnpm`, not `npm`.",
            "Keep answers short.",
            "`priceTable` in `PricingB` replaced PRICE_TABLE.",
        ]
        .map(String::from)
        .to_vec();
        let groups = group_by_subject(&entries);
        let shape: Vec<(Vec<&str>, usize)> = groups
            .iter()
            .map(|g| {
                (
                    g.subject.iter().map(String::as_str).collect(),
                    g.entries.len(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                (vec!["price_table", "pricinga", "pricingb"], 3),
                (vec![], 1),
                (vec!["npm", "pnpm"], 1),
                (vec![], 1),
            ]
        );
        assert_eq!(groups[0].entries[2], entries[5]);
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
        let audit = audit(&entries, &[], &[], |_| 100, Some(&exists));
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
