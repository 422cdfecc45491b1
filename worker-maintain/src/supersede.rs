//! Newer replaces older: a planned addition about the subject of an existing entry replaces that
//! entry instead of standing beside it, so a fact that changed as the code changed ("PRICE_TABLE
//! lives in `PricingA`" → "now in `PricingB`, not `PricingA`" → "no longer a constant: the
//! runtime variable `priceTable`") leaves one entry holding the newest, the older texts in the
//! document's revision history with the lesson that replaced them.
//!
//! A subject is the set of code-shaped words an entry names ([`Subject`]). An addition
//! supersedes an entry when both name the same subject, or when they share at least half of
//! their words and the addition says that something changed ("now", "no longer",
//! "instead", "moved", "renamed"; 现在, 不再, 改为, 而不是 …; a plain "not" is a rule's own
//! negation, not a change). Two different rules about one file
//! ("Don't edit `vendor/`" and "Run `go mod vendor` after changing `vendor/`") share a word but
//! neither the subject nor a word of change, so both stay. A restatement of the same rule is
//! not a supersession: the plan turns it into support for the entry it restates.
//!
//! A new rule also supersedes an entry that tells the agent to run what the rule forbids
//! ("Use pnpm as this project's package manager" over "Use yarn as …"; "never --no-verify"
//! over "commit with --no-verify when the hook hangs"), read by the guard compiler.
//!
//! Entries the user owns (written or imported by them) are never replaced automatically: the
//! addition becomes a replacement staged for review, with its evidence, beside the user's entry.

use std::collections::BTreeSet;

use zuno_shared::guards::compile::compile;
use zuno_shared::guards::endorse::endorses;
use zuno_shared::learning::extraction::MemoryTarget;
use zuno_shared::memory::MemoryAction;
use zuno_shared::memory::audit::Subject;
use zuno_shared::memory::dedupe::same_rule;
use zuno_shared::memory::store::Entry;

use crate::maintain::Change;

/// Words by which an addition says that what an entry states has changed.
const UPDATE_MARKERS: &[&str] = &[
    " now ",
    "no longer",
    "instead",
    "moved",
    "renamed",
    "anymore",
    "rather than",
    "replaced",
    "现在",
    "不再",
    "改为",
    "改成",
    "换成",
    "而不是",
    "已经",
];

/// How a change of the plan was turned into a supersession.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Superseded {
    /// It replaces a derived entry.
    Replaces,
    /// It would replace an entry the user owns: staged for the user's review.
    ForReview,
}

/// Turns each addition of `changes` that supersedes an entry of its document into a
/// replacement of that entry; returns, per change, whether and how it was turned. The documents
/// are followed as the plan changes them, so a second addition on the subject replaces the
/// first one's text.
pub fn supersede(
    changes: &mut [Change],
    project: &[Entry],
    global: &[Entry],
) -> Vec<Option<Superseded>> {
    let mut documents = [
        (MemoryTarget::Project, current(project)),
        (MemoryTarget::Global, current(global)),
    ];
    changes
        .iter_mut()
        .map(|change| {
            let (MemoryAction::Add, Some(content)) = (change.action, change.content.clone()) else {
                return None;
            };
            let (_, entries) = documents
                .iter_mut()
                .find(|(target, _)| *target == change.target)?;
            let position = entries
                .iter()
                .position(|(old, _)| supersedes(&content, old))?;
            let (old, owner) = entries[position].clone();
            change.action = MemoryAction::Replace;
            change.old_text = Some(old);
            let how = if owner == "automatic" {
                change.reason = format!("{} (newer fact on the same subject)", change.reason);
                entries[position].0 = content;
                Superseded::Replaces
            } else {
                change.reason = format!(
                    "{} (contradicts an entry the user owns: for review)",
                    change.reason
                );
                Superseded::ForReview
            };
            Some(how)
        })
        .collect()
}

/// Drops each addition of `changes` that a later addition of the same plan and target
/// supersedes: of two lessons in one batch, the newer holds ("use yarn" then "use pnpm" as the
/// package manager). The older lesson's experience stays Experience. Returns the dropped ones.
pub fn drop_superseded_within(changes: &mut Vec<Change>) -> Vec<Change> {
    let superseded: Vec<bool> = changes
        .iter()
        .enumerate()
        .map(|(index, older)| {
            let (MemoryAction::Add, Some(old)) = (older.action, older.content.as_deref()) else {
                return false;
            };
            changes[index + 1..].iter().any(|newer| {
                newer.action == MemoryAction::Add
                    && newer.target == older.target
                    && newer
                        .content
                        .as_deref()
                        .is_some_and(|new| supersedes(new, old))
            })
        })
        .collect();
    let mut flags = superseded.into_iter();
    let (dropped, kept): (Vec<Change>, Vec<Change>) = std::mem::take(changes)
        .into_iter()
        .partition(|_| flags.next().unwrap_or(false));
    *changes = kept;
    dropped
}

fn current(entries: &[Entry]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|entry| (entry.content.clone(), entry.owner.clone()))
        .collect()
}

/// Whether the addition `new` supersedes the entry `old` (see the module documentation).
pub fn supersedes(new: &str, old: &str) -> bool {
    if same_rule(new, old) {
        return false;
    }
    // The new rule forbids the command the old entry tells the agent to run.
    if compile(new)
        .iter()
        .any(|guard| endorses(old, &guard.matcher))
    {
        return true;
    }
    let (new_subject, old_subject) = (Subject::of(new), Subject::of(old));
    if new_subject.is_empty() || old_subject.is_empty() {
        return false;
    }
    if new_subject == old_subject {
        return true;
    }
    let shared = new_subject.0.intersection(&old_subject.0).count();
    let all: BTreeSet<&String> = new_subject.0.iter().chain(&old_subject.0).collect();
    let marked = format!(" {} ", new.to_lowercase());
    shared * 2 >= all.len() && UPDATE_MARKERS.iter().any(|marker| marked.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_fact_supersedes_the_entry_on_its_subject() {
        let first = "The price table is the PRICE_TABLE constant in `PricingA`.";
        let second = "PRICE_TABLE now lives in `PricingB`, not `PricingA`.";
        let third = "PRICE_TABLE is no longer a constant: it is the runtime variable `priceTable` in `PricingB`.";
        assert!(supersedes(second, first));
        assert!(supersedes(third, second));
        let first_zh = "价格表是 `PricingA` 里的常量 PRICE_TABLE。";
        let second_zh = "PRICE_TABLE 现在在 `PricingB` 里，而不是 `PricingA`。";
        let third_zh = "PRICE_TABLE 不再是常量，改为 `PricingB` 里的运行时变量 `priceTable`。";
        assert!(supersedes(second_zh, first_zh));
        assert!(supersedes(third_zh, second_zh));
    }

    #[test]
    fn different_rules_about_one_thing_and_restatements_stay() {
        assert!(!supersedes(
            "Run `go mod vendor` after changing `vendor/`.",
            "Don't edit `vendor/` by hand."
        ));
        assert!(!supersedes(
            "Run `pnpm test` before pushing.",
            "Use `pnpm`, not `npm`."
        ));
        assert!(!supersedes("use pnpm instead of npm", "Use pnpm, not npm."));
        assert!(!supersedes(
            "Always answer in English.",
            "Answer in German."
        ));
        assert!(supersedes(
            "Use pnpm as this project's package manager.",
            "Use yarn as this project's package manager."
        ));
        assert!(supersedes(
            "Always run the commit hooks (no --no-verify).",
            "When the hook hangs, commit with --no-verify."
        ));
        assert!(!supersedes(
            "Never use --no-verify.",
            "Don't commit with --no-verify; fix the hook."
        ));
        // A flag alone is no subject: two fixture rules stay two.
        assert!(!supersedes(
            "Run the fixture generator number 4 with `--seed 4` before the tests.",
            "Run the fixture generator number 3 with `--seed 3` before the tests."
        ));
    }
}
