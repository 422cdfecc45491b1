//! Every change is a compare-and-set on the document revision: two writers cannot both replace
//! the same revision.

use std::sync::Arc;

use zuno_shared::memory::service::{MemoryError, Origin, Proposal};
use zuno_shared::memory::store::Scope;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{Env, add, file_entries, replace};

fn replace_at(revision: i64, content: &str) -> Proposal {
    Proposal {
        expected_revision: Some(revision),
        ..replace(Scope::Project, "Install with npm.", content, Origin::Tool)
    }
}

async fn concurrent_replacements_of_one_revision_apply_once(db: TestDb) {
    let env = Env::new(db).await;
    let base = env
        .apply(add(Scope::Project, "Install with npm.", Origin::Tool))
        .await;
    assert_eq!(base.revision, 1);
    // Two writers, each on a pool of its own (like two processes), released together.
    let services = [env.memory.clone(), env.service_on(env.db.reopen().await)];
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let writers = services
        .into_iter()
        .zip(["Install with pnpm.", "Install with yarn."])
        .map(|(service, content)| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (content, service.propose(replace_at(1, content)).await)
            })
        });
    let results: Vec<_> = futures::future::join_all(writers)
        .await
        .into_iter()
        .map(|joined| joined.expect("writer task"))
        .collect();

    let winners: Vec<_> = results
        .iter()
        .filter_map(|(content, result)| result.as_ref().ok().map(|outcome| (*content, outcome)))
        .collect();
    assert_eq!(winners.len(), 1, "exactly one writer applies: {results:?}");
    let (winner, outcome) = winners[0];
    assert!(outcome.applied);
    assert_eq!(outcome.revision, 2);
    let losers: Vec<_> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert_eq!(losers.len(), 1);
    assert!(
        matches!(
            losers[0],
            MemoryError::Stale {
                expected: 1,
                current: 2
            }
        ),
        "the other writer is stale: {:?}",
        losers[0]
    );

    let history = env.revisions(Scope::Project).await;
    assert_eq!(
        history.iter().map(|r| r.revision).collect::<Vec<_>>(),
        [2, 1],
        "exactly one new revision"
    );
    assert_eq!(env.entries(Scope::Project).await, [winner]);
    assert_eq!(
        env.count("SELECT COUNT(*) FROM memory_candidate").await,
        2,
        "the stale write leaves no candidate behind"
    );
    assert_eq!(file_entries(&env.rules_path()), [winner]);
}

/// The second writer reads the revision while the first one's replacement is still uncommitted;
/// the revision it planned against is gone by the time it can write.
async fn a_writer_queued_behind_an_uncommitted_replace_is_stale(db: TestDb) {
    let env = Env::new(db).await;
    env.apply(add(Scope::Project, "Install with npm.", Origin::Tool))
        .await;
    // A second handle on the same database (opening one migrates, so open it before the lock).
    let other = env.service_on(env.db.reopen().await);
    let mut tx = env.db.db.begin().await.unwrap();
    let staged = env
        .memory
        .propose_in(&mut tx, &replace_at(1, "Install with pnpm."))
        .await
        .unwrap();
    assert!(staged.applied);
    assert_eq!(staged.revision, 2);

    let second =
        tokio::spawn(async move { other.propose(replace_at(1, "Install with yarn.")).await });
    if env.db.backend == zuno_shared::db::Backend::Postgres {
        // Postgres: the second writer read revision 1 and now waits on the first one's row lock
        // in its `UPDATE … WHERE revision = 1`. (SQLite queues it at BEGIN IMMEDIATE instead.)
        zuno_tests::until_a_session_waits_on_a_lock(&env.db.db, "the second writer").await;
    }
    tx.commit().await.unwrap();
    let result = second.await.unwrap();
    assert!(
        matches!(
            result,
            Err(MemoryError::Stale {
                expected: 1,
                current: 2
            })
        ),
        "{result:?}"
    );
    assert_eq!(env.entries(Scope::Project).await, ["Install with pnpm."]);
    assert_eq!(
        env.revisions(Scope::Project)
            .await
            .iter()
            .map(|r| r.revision)
            .collect::<Vec<_>>(),
        [2, 1]
    );
    assert_eq!(env.count("SELECT COUNT(*) FROM memory_candidate").await, 2);
}

on_both_backends!(
    concurrent_replacements_of_one_revision_apply_once,
    a_writer_queued_behind_an_uncommitted_replace_is_stale,
);
