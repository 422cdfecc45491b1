//! WAL checkpoints off the request path (SQLite).
//!
//! With SQLite's own automatic checkpoint, the commit that takes the WAL past its threshold
//! copies the WAL into the database file and syncs it before it returns: every few dozen commits
//! one caller waits several milliseconds for work that is not its own (the tail of `context`
//! latency was exactly these commits). Here a commit only counts; every [`EVERY`] commits a
//! passive checkpoint runs in a task of its own, which neither waits for nor blocks readers and
//! writers. The connections keep a larger automatic threshold ([`BACKSTOP_PAGES`]) in case the
//! background checkpoints fall behind (or a process writes outside [`super::Tx`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use sqlx::SqlitePool;

/// Commits between two background checkpoints.
const EVERY: u32 = 256;
/// `wal_autocheckpoint` of every SQLite connection: SQLite's default is 1000 pages.
pub(super) const BACKSTOP_PAGES: u32 = 10_000;

/// The checkpoint schedule of one SQLite pool, shared by every clone of its [`super::Db`].
#[derive(Debug, Clone)]
pub(super) struct Checkpoints {
    pool: SqlitePool,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    commits: AtomicU32,
    running: AtomicBool,
}

impl Checkpoints {
    pub(super) fn new(pool: SqlitePool) -> Checkpoints {
        Checkpoints {
            pool,
            state: Arc::default(),
        }
    }

    /// Counts a commit; starts a background checkpoint when one is due and none runs.
    pub(super) fn committed(&self) {
        let commits = self.state.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if commits < EVERY || self.state.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.state.commits.store(0, Ordering::Relaxed);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.state.running.store(false, Ordering::Release);
            return;
        };
        let pool = self.pool.clone();
        let state = self.state.clone();
        runtime.spawn(async move {
            // PASSIVE copies what no reader still needs and never waits; what it leaves is
            // copied by a later checkpoint.
            if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&pool)
                .await
            {
                tracing::debug!(%error, "background WAL checkpoint failed; a later one retries");
            }
            state.running.store(false, Ordering::Release);
        });
    }
}
