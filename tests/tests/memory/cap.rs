//! Memory at its cap: a write that would cross a document's character cap consolidates it in
//! the same transaction (entries stating the same rule merge; the lowest-value derived entries
//! go: unsupported, never recalled, violated, oldest) instead of being refused; entries a person
//! wrote or imported always stay; every merge and drop is in the revision's and the candidate's
//! audit; a dropped text comes back only with new evidence; and a document that cannot hold a
//! change makes maintenance skip it, never fail job after job.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;
use zuno_shared::clock::system_clock;
use zuno_shared::config::Config;
use zuno_shared::learning::retrieval;
use zuno_shared::ledger::JobState;
use zuno_shared::memory::consolidate::{Consolidation, DropReason};
use zuno_shared::memory::service::Origin;
use zuno_shared::memory::store::{self, Entry, Scope};
use zuno_shared::memory::write_check::{self, WriteRefusal, document_chars};
use zuno_shared::transcript::NewSession;
use zuno_tests::fake_provider::{FakeProvider, Reply, learning_config};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, PROJECT, add, file_entries, maintained, strings};

fn contents(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.content.clone()).collect()
}

/// Every consolidation a document's revisions record, oldest first.
async fn audits(env: &Env, scope: Scope) -> Vec<Consolidation> {
    let mut revisions = env.revisions(scope).await;
    revisions.reverse();
    revisions
        .iter()
        .filter_map(|revision| revision.consolidation())
        .collect()
}

/// Derived entries that left a document, with the revision that created them.
async fn retracted_derived(env: &Env, scope: Scope) -> BTreeMap<String, i64> {
    let document = env.document_id(scope).await;
    let rows: Vec<(String, i64)> = zuno_shared::on_db!(env.db.db, |pool| sqlx::query_as(
        "SELECT id, created_revision FROM memory_entry \
             WHERE document_id = $1 AND derived = TRUE AND retracted_revision IS NOT NULL"
    )
    .bind(&document)
    .fetch_all(pool)
    .await)
    .unwrap();
    rows.into_iter().collect()
}

async fn provenance(env: &Env, entry_id: &str) -> BTreeSet<String> {
    let rows: Vec<String> = zuno_shared::on_db!(env.db.db, |pool| sqlx::query_scalar(
        "SELECT experience_id FROM memory_provenance WHERE entry_id = $1"
    )
    .bind(entry_id)
    .fetch_all(pool)
    .await)
    .unwrap();
    rows.into_iter().collect()
}

/// Checks, after every batch, what must hold of a document at its cap.
async fn assert_healthy(env: &Env, scope: Scope, protected: &[String], context: &str) {
    let (limit, _) = write_check::cap(scope, &env.config.memory);
    let entries = contents(&env.document(scope).await);
    assert!(
        document_chars(&entries) <= limit,
        "{context}: {} characters over the {limit} cap",
        document_chars(&entries)
    );
    for entry in protected {
        assert!(
            entries.contains(entry),
            "{context}: the protected entry {entry:?} is gone"
        );
    }
}

/// The audit covers every derived entry that left: each one's id is listed as dropped (or
/// merged) exactly once, with its text, and the current derived entries are the newest.
async fn assert_audit_lists_every_departure(env: &Env, scope: Scope, derived_adds: usize) {
    let audits = audits(env, scope).await;
    let mut audited: BTreeMap<String, String> = BTreeMap::new();
    for consolidation in &audits {
        for dropped in &consolidation.dropped {
            assert!(
                audited
                    .insert(dropped.entry_id.clone(), dropped.content.clone())
                    .is_none(),
                "{dropped:?} audited twice"
            );
            assert_eq!(
                dropped.reason,
                DropReason::Unused,
                "nothing was recalled, so every drop is an unused entry: {dropped:?}"
            );
        }
        for merged in &consolidation.merged {
            let id = merged.entry_id.clone().expect("distinct rules never merge");
            audited.insert(id, merged.content.clone());
        }
    }
    let retracted = retracted_derived(env, scope).await;
    assert_eq!(
        audited.keys().collect::<BTreeSet<_>>(),
        retracted.keys().collect::<BTreeSet<_>>(),
        "the audit lists exactly the derived entries that left"
    );
    let current: Vec<Entry> = env
        .document(scope)
        .await
        .into_iter()
        .filter(|e| e.derived)
        .collect();
    assert_eq!(current.len() + retracted.len(), derived_adds);
    // Never recalled, never violated: the oldest went first.
    let newest_dropped = retracted.values().max().copied().unwrap_or(0);
    assert!(
        current.iter().all(|e| e.created_revision > newest_dropped),
        "a newer derived entry was dropped while an older one stayed"
    );
    // The text of each audited entry is the text the entry had.
    let document = env.document_id(scope).await;
    for (id, content) in &audited {
        let stored: String = zuno_shared::on_db!(env.db.db, |pool| sqlx::query_scalar(
            "SELECT content FROM memory_entry WHERE id = $1 AND document_id = $2"
        )
        .bind(id)
        .bind(&document)
        .fetch_one(pool)
        .await)
        .unwrap();
        assert_eq!(&stored, content);
    }
}

async fn five_hundred_derived_entries_keep_the_project_document_under_its_cap(db: TestDb) {
    let env = Env::new(db).await;
    // Notes from before Zuno (adopted as imported) and rules the user typed.
    std::fs::create_dir(env.worktree.join(".zuno")).unwrap();
    std::fs::write(
        env.rules_path(),
        "- The API crate owns the HTTP error mapping.\n- Migrations are append-only.\n",
    )
    .unwrap();
    let typed = [
        "Never force-push to a release branch.",
        "Ask before deleting generated fixtures.",
        "Keep public APIs documented.",
    ];
    for text in typed {
        env.apply(add(Scope::Project, text, Origin::User)).await;
    }
    let mut protected = strings(&[
        "The API crate owns the HTTP error mapping.",
        "Migrations are append-only.",
    ]);
    protected.extend(strings(&typed));
    assert_eq!(env.entries(Scope::Project).await, protected);

    let (batches, per_batch) = (20, 25);
    let mut newest = String::new();
    for batch in 0..batches {
        let texts: Vec<String> = (0..per_batch)
            .map(|i| {
                let n = batch * per_batch + i;
                format!("Run `check-{n:03}` before changing module {n:03}.")
            })
            .collect();
        newest = texts.last().unwrap().clone();
        env.remember_batch(&texts).await;
        let report = env.run_maintain().await;
        assert_eq!(
            (report.completed, report.failed, report.retried),
            (1, 0, 0),
            "batch {batch}: {report:?}"
        );
        assert_healthy(&env, Scope::Project, &protected, &format!("batch {batch}")).await;
    }

    let jobs = env.maintain_jobs().await;
    assert_eq!(jobs.len(), batches);
    for job in &jobs {
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        let result = job.result.as_ref().unwrap();
        assert_eq!(result["applied"], json!(per_batch), "{result}");
        assert_eq!(result["skipped"], json!([]), "{result}");
    }
    assert!(
        jobs.iter()
            .any(|job| job.result.as_ref().unwrap()["consolidated"] != json!([])),
        "the document reached its cap"
    );
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_candidate WHERE origin = 'maintenance' AND state = 'applied'")
            .await,
        (batches * per_batch) as i64
    );
    assert_audit_lists_every_departure(&env, Scope::Project, batches * per_batch).await;
    // Every candidate that consolidated journals the same audit as its revision.
    let candidates: BTreeMap<String, Option<Consolidation>> =
        store::candidates(&env.db.db, Some(PROJECT), None, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|candidate| (candidate.id.clone(), candidate.consolidation()))
            .collect();
    for revision in env.revisions(Scope::Project).await {
        if let Some(audit) = revision.consolidation() {
            let candidate = revision
                .candidate_id
                .as_ref()
                .expect("a consolidating write");
            assert_eq!(candidates[candidate], Some(audit));
        }
    }
    // Dropped is not forgotten: the texts may be learned again from new evidence.
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_forgotten_text")
            .await,
        0
    );

    // The file and recall show the consolidated document.
    let shown = env.entries(Scope::Project).await;
    assert!(shown.contains(&newest));
    assert_eq!(file_entries(&env.rules_path()), shown);
    let session = zuno_shared::learning::LearningIngestion::new(
        zuno_shared::transcript::TranscriptStore::new(env.db.db.clone(), system_clock()),
        env.db.ledger(),
        env.config.clone(),
    )
    .create_session(&NewSession {
        project_id: PROJECT.into(),
        ..NewSession::default()
    })
    .await
    .unwrap()
    .0
    .id;
    let context = retrieval::assemble(
        &env.db.db,
        &env.config,
        &session,
        "Which checks run before changing a module?",
        system_clock().now_ms(),
    )
    .await
    .unwrap()
    .unwrap();
    let section = context
        .sections
        .iter()
        .find(|s| s.name == "memory.project")
        .expect("the project memory section");
    assert_eq!(section.revision, Some(env.revision(Scope::Project).await));
    for entry in protected.iter().chain([&newest]) {
        assert!(
            section.content.contains(entry.as_str()),
            "{entry:?} in {}",
            section.content
        );
    }
}

fn plan(changes: Vec<serde_json::Value>) -> Reply {
    Reply::answer(json!({ "changes": changes }).to_string())
}

async fn derived_global_entries_keep_the_global_document_under_its_cap(db: TestDb) {
    // Global changes come from the model planner (the rules planner writes project rules).
    let provider = FakeProvider::start().await;
    let env = Env::with_config(db, learning_config(provider.base_url(), 10_000)).await;
    let protected = strings(&["Reply in English unless asked otherwise."]);
    env.apply(add(Scope::Global, &protected[0], Origin::User))
        .await;
    let (batches, per_batch) = (6, 20);
    for batch in 0..batches {
        let texts: Vec<String> = (0..per_batch)
            .map(|i| {
                let n = batch * per_batch + i;
                format!("Explain topic {n:03} with one short example.")
            })
            .collect();
        let ids = env.remember_batch(&texts).await;
        provider.push([plan(
            texts
                .iter()
                .zip(&ids)
                .map(|(text, id)| {
                    json!({"target": "global", "action": "add", "content": text, "old_text": null,
                           "reason": "a preference the user stated for all work", "confidence": 0.95,
                           "experience_ids": [id]})
                })
                .collect(),
        )]);
        let report = env.run_maintain().await;
        assert_eq!(
            (report.completed, report.failed, report.retried),
            (1, 0, 0),
            "batch {batch}: {report:?}"
        );
        assert_healthy(&env, Scope::Global, &protected, &format!("batch {batch}")).await;
    }
    assert_eq!(provider.request_count(), batches);
    assert_audit_lists_every_departure(&env, Scope::Global, batches * per_batch).await;
    assert_eq!(
        file_entries(&env.global_path()),
        env.entries(Scope::Global).await
    );
}

async fn a_document_full_of_user_entries_skips_a_derived_add_and_every_job_completes(db: TestDb) {
    let env = Env::new(db).await;
    // Three notes of 996 characters: 2990 of the 3000, too full for one more rule.
    let body: String = "keep it exact; ".repeat(70).chars().take(977).collect();
    let typed: Vec<String> = ["lint", "test", "docs"]
        .iter()
        .map(|topic| format!("Team note on {topic}: {body}"))
        .collect();
    for text in &typed {
        env.apply(add(Scope::Project, text, Origin::User)).await;
    }
    let (limit, _) = write_check::cap(Scope::Project, &env.config.memory);
    assert!(document_chars(&typed) + 20 > limit && document_chars(&typed) <= limit);
    let revision = env.revision(Scope::Project).await;

    for round in 0..3 {
        let ids = env
            .remember_batch(&[format!("Run `lint-{round}` before every push.")])
            .await;
        let report = env.run_maintain().await;
        assert_eq!(
            (report.completed, report.failed, report.retried),
            (1, 0, 0),
            "round {round}: {report:?}"
        );
        let job = &env.maintain_jobs().await[0];
        assert_eq!(job.state, JobState::Completed);
        let result = job.result.as_ref().unwrap();
        assert_eq!(result["applied"], json!(0), "{result}");
        let skipped = result["skipped"].as_array().expect("skipped changes");
        assert_eq!(skipped.len(), 1, "{result}");
        assert_eq!(skipped[0]["experienceIds"], json!(ids));
        assert!(
            skipped[0]["reason"]
                .as_str()
                .unwrap()
                .contains("memory.project_char_limit"),
            "the refusal names the key that raises the cap: {result}"
        );
        // The input was consumed: the next job does not meet it again.
        let watermark: String = zuno_shared::on_db!(env.db.db, |pool| sqlx::query_scalar(
            "SELECT watermark_id FROM memory_maintenance WHERE project_id = $1"
        )
        .bind(PROJECT)
        .fetch_one(pool)
        .await)
        .unwrap();
        assert_eq!(watermark, ids[0]);
    }
    assert_eq!(env.entries(Scope::Project).await, typed);
    assert_eq!(env.revision(Scope::Project).await, revision);
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_candidate WHERE origin = 'maintenance'")
            .await,
        0,
        "a skipped change journals nothing"
    );
}

fn small_project_cap(chars: u32) -> Config {
    let mut config = Config::default();
    config.memory.project_char_limit = chars;
    config
}

/// Merges and drops at the service: the same rule merges into the entry worth keeping (evidence
/// moves with it), a person's text wins over a derived one, the unused derived entry goes, the
/// audit is readable over the revision history API, a dropped text is not resurrected by the
/// evidence it had, and undo restores what consolidation dropped.
async fn a_write_at_the_cap_merges_the_same_rule_and_drops_unused_derived_entries(db: TestDb) {
    let env = Env::with_config(db, small_project_cap(90)).await;
    let pnpm = "Use pnpm, not npm.";
    let commits = "Keep commits small and focused.";
    let e1 = env.experience(pnpm).await;
    let e2 = env.experience(commits).await;
    env.apply(maintained(Scope::Project, pnpm, &[&e1], 0.9))
        .await;
    env.apply(maintained(Scope::Project, commits, &[&e2], 0.9))
        .await;
    env.apply(add(Scope::Project, "Never push to main.", Origin::User))
        .await;
    let before = env.document(Scope::Project).await;
    let pnpm_entry = before[0].id.clone();
    let commits_entry = before[1].id.clone();
    assert_eq!(document_chars(&contents(&before)), 70);

    // The same rule in other words, over the cap: it supports the entry instead of adding one.
    let e3 = env.experience("use pnpm instead of npm").await;
    let outcome = env
        .apply(maintained(
            Scope::Project,
            "use pnpm instead of npm",
            &[&e3],
            0.9,
        ))
        .await;
    assert_eq!(outcome.revision, 3, "nothing changed in the text");
    assert_eq!(
        contents(&env.document(Scope::Project).await),
        contents(&before)
    );
    let audit = outcome.candidate.consolidation().expect("an audit");
    assert_eq!(audit.merged.len(), 1);
    assert_eq!(audit.merged[0].entry_id, None);
    assert_eq!(
        audit.merged[0].into_entry_id.as_deref(),
        Some(pnpm_entry.as_str())
    );
    assert_eq!(audit.merged[0].evidence, std::slice::from_ref(&e3));
    assert_eq!(
        provenance(&env, &pnpm_entry).await,
        BTreeSet::from([e1.clone(), e3.clone()])
    );

    // A person's wording of a derived rule replaces it and takes its evidence.
    let outcome = env
        .apply(add(
            Scope::Project,
            "Use pnpm instead of npm.",
            Origin::User,
        ))
        .await;
    let audit = outcome.candidate.consolidation().expect("an audit");
    assert_eq!(audit.merged.len(), 1, "{audit:?}");
    assert_eq!(
        audit.merged[0].entry_id.as_deref(),
        Some(pnpm_entry.as_str())
    );
    let mine = env
        .document(Scope::Project)
        .await
        .into_iter()
        .find(|e| e.content == "Use pnpm instead of npm.")
        .expect("the person's entry");
    assert_eq!(mine.owner, "user");
    assert_eq!(
        audit.merged[0].into_entry_id.as_deref(),
        Some(mine.id.as_str())
    );
    assert_eq!(
        provenance(&env, &mine.id).await,
        BTreeSet::from([e1.clone(), e3.clone()])
    );

    // A new derived rule that does not fit: the unused derived entry goes.
    let fmt = "Run cargo fmt before committing.";
    let e4 = env.experience(fmt).await;
    let dropping = env
        .apply(maintained(Scope::Project, fmt, &[&e4], 0.9))
        .await;
    let audit = dropping.candidate.consolidation().expect("an audit");
    assert!(audit.merged.is_empty());
    assert_eq!(audit.dropped.len(), 1);
    assert_eq!(audit.dropped[0].entry_id, commits_entry);
    assert_eq!(audit.dropped[0].content, commits);
    assert_eq!(audit.dropped[0].reason, DropReason::Unused);
    assert_eq!(audit.dropped[0].evidence, std::slice::from_ref(&e2));
    assert!(
        audit.chars_before > 90 && audit.chars_after <= 90,
        "{audit:?}"
    );
    assert_eq!(
        env.entries(Scope::Project).await,
        ["Never push to main.", "Use pnpm instead of npm.", fmt]
    );
    let revision = env.revisions(Scope::Project).await.remove(0);
    assert_eq!(revision.consolidation(), Some(audit.clone()));

    // The same audit over the revision history API (what `zuno memory revisions` prints).
    let server = TestServer::start(&env.db, (*env.config).clone(), None).await;
    let (status, history) = server
        .get(&format!(
            "/api/projects/{PROJECT}/memory/revisions?target=project"
        ))
        .await;
    assert_eq!(status, 200, "{history}");
    let newest = &history["revisions"][0];
    let listed: Consolidation =
        serde_json::from_str(newest["consolidation"].as_str().expect("an audit")).unwrap();
    assert_eq!(listed, audit);

    // The evidence it had does not bring the dropped text back; it is not forgotten either.
    let refused = env
        .refused(maintained(Scope::Project, commits, &[&e2], 0.9))
        .await;
    assert_eq!(refused, WriteRefusal::DroppedAtCap);
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_forgotten_text")
            .await,
        0
    );

    // Undo restores the dropped entry as it was: derived, with its evidence.
    env.memory.undo(&dropping.candidate.id).await.unwrap();
    let restored = env
        .document(Scope::Project)
        .await
        .into_iter()
        .find(|e| e.content == commits)
        .expect("restored");
    assert!(
        restored.derived && restored.owner == "automatic",
        "{restored:?}"
    );
    assert_eq!(provenance(&env, &restored.id).await, BTreeSet::from([e2]));
}

async fn a_dropped_text_returns_with_new_evidence(db: TestDb) {
    let env = Env::with_config(db, small_project_cap(40)).await;
    let first = "Vendor crates before offline builds.";
    let second = "Pin the toolchain in CI runners.";
    let e1 = env.experience(first).await;
    env.apply(maintained(Scope::Project, first, &[&e1], 0.9))
        .await;
    let e2 = env.experience(second).await;
    let outcome = env
        .apply(maintained(Scope::Project, second, &[&e2], 0.9))
        .await;
    assert_eq!(
        outcome.candidate.consolidation().unwrap().dropped[0].content,
        first
    );
    assert_eq!(
        env.refused(maintained(Scope::Project, first, &[&e1], 0.9))
            .await,
        WriteRefusal::DroppedAtCap
    );
    // An automatic writer without evidence cannot bring it back either.
    assert_eq!(
        env.refused(add(Scope::Project, first, Origin::Tool)).await,
        WriteRefusal::DroppedAtCap
    );
    // New evidence for the same text: it is learned again.
    let e3 = env.experience(first).await;
    env.apply(maintained(Scope::Project, first, &[&e1, &e3], 0.9))
        .await;
    assert_eq!(env.entries(Scope::Project).await, [first]);
}

/// The drop order reads real usage: experiences recalled into a prompt by `context`, and a
/// violation recorded by the feedback loop.
async fn drops_take_unused_then_violated_then_the_oldest_entry_in_use(db: TestDb) {
    let words = [
        ("alpha", "amber"),
        ("bravo", "basil"),
        ("delta", "denim"),
        ("kappa", "koala"),
    ];
    let text = |(a, b): (&str, &str)| format!("Check the {a} gauge after {b} runs.");
    let length = text(words[0]).chars().count() as u32;
    let env = Env::with_config(db, small_project_cap(4 * length + 3)).await;
    let mut ids = Vec::new();
    for pair in words {
        let experience = env.experience(&text(pair)).await;
        let outcome = env
            .apply(maintained(Scope::Project, &text(pair), &[&experience], 0.9))
            .await;
        ids.push((experience, outcome.revision));
    }
    let entries = env.document(Scope::Project).await;
    let [old, violated, unused, recent] = [0, 1, 2, 3].map(|i| entries[i].id.clone());

    // Recall `old`, `violated` and `recent` into prompts; then the user corrects the turn that
    // used `violated`.
    let session = zuno_shared::learning::LearningIngestion::new(
        zuno_shared::transcript::TranscriptStore::new(env.db.db.clone(), system_clock()),
        env.db.ledger(),
        env.config.clone(),
    )
    .create_session(&NewSession {
        project_id: PROJECT.into(),
        ..NewSession::default()
    })
    .await
    .unwrap()
    .0
    .id;
    for index in [0, 1, 3] {
        let (a, b) = words[index];
        let context = retrieval::assemble(
            &env.db.db,
            &env.config,
            &session,
            &format!("{a} {b}"),
            system_clock().now_ms(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            context.experience_ids,
            [ids[index].0.clone()],
            "{a} alone is recalled"
        );
    }
    let mut tx = env.db.db.begin().await.unwrap();
    retrieval::adjust_in(&mut tx, &ids[1].0, -0.2)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Three rules a person adds, each as long as one entry: each takes one derived entry's place.
    let mut order = Vec::new();
    for pair in [("omega", "otter"), ("sigma", "sable"), ("gamma", "gecko")] {
        let outcome = env
            .apply(add(Scope::Project, &text(pair), Origin::User))
            .await;
        let audit = outcome.candidate.consolidation().expect("an audit");
        assert_eq!(audit.dropped.len(), 1, "{audit:?}");
        order.push((audit.dropped[0].entry_id.clone(), audit.dropped[0].reason));
    }
    assert_eq!(
        order,
        [
            (unused, DropReason::Unused),
            (violated, DropReason::Violated),
            (old, DropReason::Weakest),
        ]
    );
    let left: Vec<String> = env
        .document(Scope::Project)
        .await
        .into_iter()
        .filter(|e| e.derived)
        .map(|e| e.id)
        .collect();
    assert_eq!(left, [recent]);
    // Only person-owned entries remain besides it: the next derived rule that does not fit
    // takes the last derived entry's place, and after that nothing more can go.
    let last = env
        .experience("Check the zebra gauge after zesty runs.")
        .await;
    env.apply(maintained(
        Scope::Project,
        "Check the zebra gauge after zesty runs.",
        &[&last],
        0.9,
    ))
    .await;
    let refusal = env
        .refused(add(
            Scope::Project,
            "Check the tango gauge after tulip runs, and log it.",
            Origin::User,
        ))
        .await;
    assert!(
        matches!(
            refusal,
            WriteRefusal::OverCap {
                key: "memory.project_char_limit",
                ..
            }
        ),
        "{refusal:?}"
    );
    // The refused write changed nothing.
    assert!(
        env.entries(Scope::Project)
            .await
            .contains(&String::from("Check the zebra gauge after zesty runs."))
    );
}

on_both_backends!(
    five_hundred_derived_entries_keep_the_project_document_under_its_cap,
    derived_global_entries_keep_the_global_document_under_its_cap,
    a_document_full_of_user_entries_skips_a_derived_add_and_every_job_completes,
    a_write_at_the_cap_merges_the_same_rule_and_drops_unused_derived_entries,
    a_dropped_text_returns_with_new_evidence,
    drops_take_unused_then_violated_then_the_oldest_entry_in_use,
);
