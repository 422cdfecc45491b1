//! The Markdown projections: `$CONFIG/memory/MEMORY.md` and `<worktree>/.zuno/RULES.md`.
//! Absent until the first accepted write; regular paths only (checked before reading or
//! importing and again before publishing; a link is never followed); an existing file is adopted
//! once; later external edits are preserved and reported, and accepted only by `import`; a
//! projection failure keeps the committed entries; start-up restores a missing projection.

use std::os::unix::fs::symlink;
use std::path::Path;

use zuno_shared::config::MemoryPromotion;
use zuno_shared::memory::markdown;
use zuno_shared::memory::service::{MemoryError, Origin};
use zuno_shared::memory::store::Scope;
use zuno_shared::memory::write_check::WriteRefusal;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, PROJECT, add, file_entries, strings};

fn is_symlink_refusal(result: &Result<impl std::fmt::Debug, MemoryError>) -> bool {
    matches!(
        result,
        Err(MemoryError::Refused(WriteRefusal::Invalid { field: "projection", reason }))
            if reason.contains("symbolic link")
    )
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn projections_are_created_by_the_first_accepted_write_and_never_at_start_up(db: TestDb) {
    let env = Env::new(db).await;
    assert_eq!(env.global_path(), env.home.join("memory/MEMORY.md"));
    assert_eq!(
        env.memory
            .projection_path(Scope::Project, Some(PROJECT))
            .await
            .unwrap(),
        Some(env.rules_path())
    );
    let report = env.memory.reconcile().await.unwrap();
    assert!(report.restored_projections.is_empty());
    env.memory
        .read(None, Some(PROJECT), None, None)
        .await
        .unwrap();
    for scope in [Scope::Global, Scope::Project] {
        let inspection = env.memory.inspect(scope, Some(PROJECT)).await.unwrap();
        assert_eq!(inspection.file, None);
        assert_eq!(inspection.revision, 0);
    }
    // A proposal still waiting for review writes nothing either.
    let review = env.service_with(MemoryPromotion::Review);
    for scope in [Scope::Global, Scope::Project] {
        assert!(
            !review
                .propose(add(scope, "Use pnpm.", Origin::Tool))
                .await
                .unwrap()
                .applied
        );
    }
    review.reconcile().await.unwrap();
    assert!(
        !env.home.exists(),
        "a fresh install has no config directory and no memory/"
    );
    assert!(
        listing(&env.worktree).is_empty(),
        "no .zuno/ in the worktree"
    );

    let outcome = env
        .apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    let published = outcome.projection.unwrap();
    assert_eq!(published.state, "synced");
    assert_eq!(
        published.path.as_deref(),
        Some(env.rules_path().to_str().unwrap())
    );
    assert_eq!(file_entries(&env.rules_path()), ["Run cargo nextest."]);
    assert!(
        !env.home.exists(),
        "a project write does not create the global store"
    );

    env.apply(add(Scope::Global, "Answer in English.", Origin::User))
        .await;
    assert_eq!(file_entries(&env.global_path()), ["Answer in English."]);
    assert_eq!(
        std::fs::read_to_string(env.global_path()).unwrap(),
        markdown::render("global", 1, &strings(&["Answer in English."]))
    );
}

async fn symlinked_memory_paths_are_refused_and_never_followed(db: TestDb) {
    let env = Env::new(db).await;
    let outside = env.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let planted = outside.join("RULES.md");
    std::fs::write(&planted, "- Planted entry.\n").unwrap();

    // A symlinked RULES.md is refused before anything is imported from it.
    std::fs::create_dir(env.worktree.join(".zuno")).unwrap();
    symlink(&planted, env.rules_path()).unwrap();
    let result = env
        .propose(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    assert!(is_symlink_refusal(&result), "{result:?}");
    assert!(
        is_symlink_refusal(&env.memory.import(Scope::Project, Some(PROJECT)).await),
        "import refuses it too"
    );
    let inspection = env
        .memory
        .inspect(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert_eq!(inspection.file, None);
    assert!(inspection.detail.unwrap().contains("symbolic link"));
    assert!(
        env.entries(Scope::Project).await.is_empty(),
        "nothing was adopted through the link"
    );
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        "- Planted entry.\n"
    );

    // A symlinked .zuno directory: nothing is created or written through it.
    let linked_worktree = env.dir.path().join("linked-repo");
    std::fs::create_dir(&linked_worktree).unwrap();
    let elsewhere = env.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    symlink(&elsewhere, linked_worktree.join(".zuno")).unwrap();
    env.project("linked", &linked_worktree).await;
    let mut proposal = add(Scope::Project, "Use pnpm.", Origin::Tool);
    proposal.project_id = Some("linked".into());
    let result = env.memory.propose(proposal).await;
    assert!(is_symlink_refusal(&result), "{result:?}");
    assert!(
        listing(&elsewhere).is_empty(),
        "no file or lock file behind the link"
    );

    // A link swapped in after the first write is refused again before publishing: the change
    // commits, the projection reports the error, and the link's target is untouched.
    let later_worktree = env.dir.path().join("later-repo");
    std::fs::create_dir(&later_worktree).unwrap();
    env.project("later", &later_worktree).await;
    let later = |content: &str| {
        let mut proposal = add(Scope::Project, content, Origin::Tool);
        proposal.project_id = Some("later".into());
        proposal
    };
    env.apply(later("Use pnpm.")).await;
    let rules = later_worktree.join(".zuno/RULES.md");
    std::fs::remove_file(&rules).unwrap();
    symlink(&planted, &rules).unwrap();
    let outcome = env.apply(later("Run cargo nextest.")).await;
    let published = outcome.projection.unwrap();
    assert_eq!(published.state, "error");
    assert!(published.detail.unwrap().contains("symbolic link"));
    assert!(
        std::fs::symlink_metadata(&rules)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        "- Planted entry.\n"
    );
    let views = env
        .memory
        .read(Some(Scope::Project), Some("later"), None, None)
        .await
        .unwrap();
    assert_eq!(
        views[0]
            .entries
            .iter()
            .map(|e| e.content.as_str())
            .collect::<Vec<_>>(),
        ["Use pnpm.", "Run cargo nextest."]
    );
    // Start-up neither follows nor replaces it.
    let report = env.memory.reconcile().await.unwrap();
    assert!(report.restored_projections.is_empty());
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        "- Planted entry.\n"
    );
    assert!(
        std::fs::symlink_metadata(&rules)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

async fn an_existing_file_is_adopted_once_and_later_edits_are_preserved_until_imported(db: TestDb) {
    let env = Env::new(db).await;
    std::fs::create_dir(env.worktree.join(".zuno")).unwrap();
    std::fs::write(
        env.rules_path(),
        "# Rules\n\n- Use pnpm.\n- Tabs, not spaces.\n",
    )
    .unwrap();

    let outcome = env
        .apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    assert_eq!(
        outcome.revision, 2,
        "adoption is revision 1, the write revision 2"
    );
    let history = env.revisions(Scope::Project).await;
    assert_eq!(
        history
            .iter()
            .map(|r| r.change.as_str())
            .collect::<Vec<_>>(),
        ["apply", "adopt"]
    );
    let view = env.view(Scope::Project).await;
    assert_eq!(
        view.entries
            .iter()
            .map(|e| (e.content.as_str(), e.owner.as_str()))
            .collect::<Vec<_>>(),
        [
            ("Use pnpm.", "imported"),
            ("Tabs, not spaces.", "imported"),
            ("Run cargo nextest.", "automatic")
        ]
    );
    let accepted = strings(&["Use pnpm.", "Tabs, not spaces.", "Run cargo nextest."]);
    assert_eq!(
        file_entries(&env.rules_path()),
        accepted,
        "the adopted file is now the projection"
    );

    // An external edit is never adopted again or overwritten.
    let edited = format!(
        "{}- Edited by hand.\n",
        std::fs::read_to_string(env.rules_path()).unwrap()
    );
    std::fs::write(env.rules_path(), &edited).unwrap();
    let outcome = env
        .apply(add(Scope::Project, "Prefer rg.", Origin::Tool))
        .await;
    assert_eq!(outcome.revision, 3);
    assert_eq!(outcome.projection.unwrap().state, "external_edit");
    let mut with_rg = accepted.clone();
    with_rg.push(String::from("Prefer rg."));
    assert_eq!(
        env.entries(Scope::Project).await,
        with_rg,
        "the edit does not replace accepted Memory"
    );
    assert_eq!(
        std::fs::read_to_string(env.rules_path()).unwrap(),
        edited,
        "the edit is preserved"
    );

    let inspection = env
        .memory
        .inspect(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert!(inspection.differs);
    assert_eq!(inspection.projection_state, "external_edit");
    assert_eq!(inspection.accepted, with_rg);
    let mut file = accepted.clone();
    file.push(String::from("Edited by hand."));
    assert_eq!(inspection.file.as_ref(), Some(&file));

    let report = env.memory.reconcile().await.unwrap();
    assert_eq!(
        report.external_edits,
        [env.rules_path().display().to_string()]
    );
    assert!(report.restored_projections.is_empty());
    assert_eq!(std::fs::read_to_string(env.rules_path()).unwrap(), edited);

    // import-memory accepts the edited file as a new version.
    let imported = env
        .memory
        .import(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert!(imported.applied);
    assert_eq!(imported.revision, 4);
    assert_eq!(imported.projection.unwrap().state, "synced");
    assert_eq!(env.entries(Scope::Project).await, file);
    assert_eq!(env.revisions(Scope::Project).await[0].change, "import");
    let view = env.view(Scope::Project).await;
    assert_eq!(view.entries.last().unwrap().owner, "user");
    let inspection = env
        .memory
        .inspect(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert!(!inspection.differs);
    assert_eq!(inspection.projection_state, "synced");
    // Writes publish again.
    env.apply(add(Scope::Project, "Prefer fd.", Origin::Tool))
        .await;
    file.push(String::from("Prefer fd."));
    assert_eq!(file_entries(&env.rules_path()), file);
}

async fn a_projection_failure_keeps_committed_entries_and_start_up_restores_it(db: TestDb) {
    let env = Env::new(db).await;
    env.apply(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    env.apply(add(Scope::Global, "Answer in English.", Origin::User))
        .await;
    // `.zuno` becomes a regular file: the directory cannot hold a projection.
    let dot_zuno = env.worktree.join(".zuno");
    std::fs::remove_dir_all(&dot_zuno).unwrap();
    std::fs::write(&dot_zuno, "not a directory").unwrap();
    let outcome = env
        .apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    assert_eq!(outcome.revision, 2);
    let published = outcome.projection.unwrap();
    assert_eq!(published.state, "error");
    assert!(published.detail.is_some());
    assert_eq!(
        env.entries(Scope::Project).await,
        ["Use pnpm.", "Run cargo nextest."]
    );
    assert_eq!(
        env.memory
            .inspect(Scope::Project, Some(PROJECT))
            .await
            .unwrap()
            .projection_state,
        "error"
    );
    assert_eq!(
        std::fs::read_to_string(&dot_zuno).unwrap(),
        "not a directory"
    );

    // A project whose worktree is gone: the write commits, the worktree is not recreated.
    let gone = env.dir.path().join("gone-repo");
    env.project("gone", &gone).await;
    let mut proposal = add(Scope::Project, "Use pnpm.", Origin::Tool);
    proposal.project_id = Some("gone".into());
    let outcome = env.apply(proposal).await;
    assert_eq!(outcome.projection.unwrap().state, "error");
    assert!(!gone.exists());
    let views = env
        .memory
        .read(Some(Scope::Project), Some("gone"), None, None)
        .await
        .unwrap();
    assert_eq!(views[0].entries.len(), 1);

    // Start-up restores missing projections from their recorded revision, without a new one.
    std::fs::remove_file(&dot_zuno).unwrap();
    std::fs::remove_file(env.global_path()).unwrap();
    let report = env.memory.reconcile().await.unwrap();
    let mut restored = report.restored_projections.clone();
    restored.sort();
    let mut expected = vec![
        env.rules_path().display().to_string(),
        env.global_path().display().to_string(),
    ];
    expected.sort();
    assert_eq!(restored, expected);
    assert_eq!(
        std::fs::read_to_string(env.rules_path()).unwrap(),
        markdown::render("project", 2, &strings(&["Use pnpm.", "Run cargo nextest."]))
    );
    assert_eq!(
        std::fs::read_to_string(env.global_path()).unwrap(),
        markdown::render("global", 1, &strings(&["Answer in English."]))
    );
    assert_eq!(env.revision(Scope::Project).await, 2);
    assert_eq!(env.revisions(Scope::Project).await.len(), 2);
    assert_eq!(env.revision(Scope::Global).await, 1);
    assert_eq!(
        env.memory
            .inspect(Scope::Project, Some(PROJECT))
            .await
            .unwrap()
            .projection_state,
        "synced"
    );
    assert!(!gone.exists(), "restoring never creates a missing worktree");

    let again = env.memory.reconcile().await.unwrap();
    assert!(again.restored_projections.is_empty());
}

/// True when `line` has an `@` or a `<` that starts a token and no backslash escapes it: what
/// Claude Code would import (`@path`) or a renderer would read as markup (`<!--`).
fn live_markup(line: &str) -> bool {
    line.char_indices().any(|(at, c)| {
        matches!(c, '@' | '<')
            && line[at + 1..].starts_with(|next: char| !next.is_whitespace())
            && !line[..at].ends_with('\\')
    })
}

/// Issue 31, item 3: an entry naming `@~/.ssh/id_ed25519` or opening `<!--`, written through the
/// API path or learned by maintenance, is projected inert: the `@` and `<` are escaped, so the
/// file imports nothing into Claude Code's context and a rendered file hides no later entry.
async fn projections_neutralise_at_imports_and_html_comments(db: TestDb) {
    let env = Env::new(db).await;
    let key = "Deploy keys are documented in @~/.ssh/id_ed25519";
    let comment = "<!-- the review notes follow";
    for text in [key, comment] {
        env.apply(add(Scope::Project, text, Origin::Tool)).await;
        env.apply(add(Scope::Global, text, Origin::User)).await;
    }
    let learned = "Always read @~/.aws/config before deploying.";
    env.remember_batch(&strings(&[learned])).await;
    let report = env.run_maintain().await;
    assert_eq!((report.completed, report.failed), (1, 0), "{report:?}");
    env.apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    env.apply(add(Scope::Global, "Answer in English.", Origin::User))
        .await;

    let rules = std::fs::read_to_string(env.rules_path()).unwrap();
    assert!(
        rules.contains("- Deploy keys are documented in \\@~/.ssh/id_ed25519\n"),
        "{rules}"
    );
    assert!(
        rules.contains("- \\<!-- the review notes follow\n"),
        "{rules}"
    );
    assert!(
        rules.contains("\\@~/.aws/config"),
        "the learned entry is escaped too: {rules}"
    );
    let global = std::fs::read_to_string(env.global_path()).unwrap();
    assert!(global.contains("\\@~/.ssh/id_ed25519"), "{global}");
    for (name, file) in [("RULES.md", &rules), ("MEMORY.md", &global)] {
        let body = file.split_once("-->\n").expect("the header comment ends").1;
        let live: Vec<&str> = body.lines().filter(|line| live_markup(line)).collect();
        assert!(live.is_empty(), "{name} has live markup: {live:?}");
    }
    // Every entry, the ones after the `<!--` included, still reads back from the files.
    let read_back = file_entries(&env.rules_path());
    assert_eq!(read_back.len(), 4, "{read_back:?}");
    assert_eq!(read_back.last().unwrap(), "Run cargo nextest.");
    assert_eq!(
        file_entries(&env.global_path()).last().unwrap(),
        "Answer in English."
    );
    // The database keeps the text as written; only the projection escapes it.
    let entries = env.entries(Scope::Project).await;
    assert!(entries.iter().any(|entry| entry == key), "{entries:?}");
    let inspection = env
        .memory
        .inspect(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert!(!inspection.differs, "an unedited projection is not an edit");
    // Importing the file changes nothing the next projection writes.
    env.memory
        .import(Scope::Project, Some(PROJECT))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(env.rules_path())
            .unwrap()
            .split_once("-->\n")
            .unwrap()
            .1,
        rules.split_once("-->\n").unwrap().1
    );
}

/// Issue 31, item 6: a worktree replaced by a symbolic link after its claim (here, to another
/// project's worktree) is neither written nor read: publishing records the refusal, import and
/// inspect answer the typed error, start-up restores nothing through the link, and the other
/// project's `RULES.md` keeps its bytes.
async fn a_worktree_replaced_by_a_link_is_neither_written_nor_read(db: TestDb) {
    let env = Env::new(db).await;
    let other = env.dir.path().join("other-repo");
    std::fs::create_dir_all(other.join(".zuno")).unwrap();
    let theirs = other.join(".zuno").join("RULES.md");
    std::fs::write(&theirs, "- The other project's own rule.\n").unwrap();
    env.project("other", &other).await;
    env.apply(add(Scope::Project, "Use pnpm.", Origin::Tool))
        .await;
    assert!(env.rules_path().exists());

    let moved = env.dir.path().join("repo-moved");
    std::fs::rename(&env.worktree, &moved).unwrap();
    symlink(&other, &env.worktree).unwrap();

    let outcome = env
        .apply(add(Scope::Project, "Run cargo nextest.", Origin::Tool))
        .await;
    let projection = outcome.projection.unwrap();
    assert_eq!(projection.state, "error", "{projection:?}");
    let detail = projection.detail.unwrap();
    assert!(detail.contains("no longer resolves to itself"), "{detail}");
    assert!(!detail.contains("other-repo"), "{detail}");
    assert_eq!(
        env.entries(Scope::Project).await,
        strings(&["Use pnpm.", "Run cargo nextest."]),
        "the committed change stays"
    );
    fn refused<T>(result: &Result<T, MemoryError>) -> bool {
        matches!(
            result,
            Err(MemoryError::Worktree(
                zuno_shared::worktree::WorktreeMoved::Redirected { .. }
            ))
        )
    }
    let imported = env.memory.import(Scope::Project, Some(PROJECT)).await;
    assert!(refused(&imported), "{imported:?}");
    let inspected = env.memory.inspect(Scope::Project, Some(PROJECT)).await;
    assert!(refused(&inspected), "{inspected:?}");
    env.memory.reconcile().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&theirs).unwrap(),
        "- The other project's own rule.\n",
        "nothing was written to the other project's RULES.md"
    );
    assert_eq!(listing(&other.join(".zuno")), ["RULES.md"]);
    assert_eq!(
        env.entries(Scope::Project).await,
        strings(&["Use pnpm.", "Run cargo nextest."]),
        "nothing was imported from it"
    );

    // Back in place, the next write projects again.
    std::fs::remove_file(&env.worktree).unwrap();
    std::fs::rename(&moved, &env.worktree).unwrap();
    let outcome = env
        .apply(add(Scope::Project, "Answer briefly.", Origin::Tool))
        .await;
    assert_eq!(outcome.projection.unwrap().state, "synced");
    assert_eq!(
        file_entries(&env.rules_path()),
        strings(&["Use pnpm.", "Run cargo nextest.", "Answer briefly."])
    );
}

on_both_backends!(
    projections_are_created_by_the_first_accepted_write_and_never_at_start_up,
    symlinked_memory_paths_are_refused_and_never_followed,
    an_existing_file_is_adopted_once_and_later_edits_are_preserved_until_imported,
    a_projection_failure_keeps_committed_entries_and_start_up_restores_it,
    projections_neutralise_at_imports_and_html_comments,
    a_worktree_replaced_by_a_link_is_neither_written_nor_read,
);
