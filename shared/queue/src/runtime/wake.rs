//! Wake-up sources: the in-process bus (all-in-one mode and anything sharing a [`Db`] handle),
//! and, across processes, Postgres `LISTEN/NOTIFY` or SQLite's commit counter; polling stays the
//! fallback.

use std::time::{Duration, Instant};

use sqlx::ConnectOptions as _;
use sqlx::postgres::PgListener;
use sqlx::sqlite::SqliteConnection;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::ledger::PG_CHANNEL;

/// How often a SQLite watcher reads the database's commit counter while the database is busy.
/// The read is of the WAL index in shared memory (no disk I/O, no lock held afterwards).
pub const SQLITE_WATCH_BUSY: Duration = Duration::from_millis(20);
/// The longest interval between readings once the database has been quiet for
/// [`SQLITE_WATCH_QUIET_AFTER`]: a resident process that waits for hours should not wake 50
/// times a second (20 ms doubles up to this).
pub const SQLITE_WATCH_IDLE: Duration = Duration::from_millis(250);
/// How long without a commit before the watcher slows down.
pub const SQLITE_WATCH_QUIET_AFTER: Duration = Duration::from_secs(2);

/// Wakes this handle's bus when another process changes the database, until cancelled: Postgres
/// notifications ([`start_pg_listener`]) or SQLite commits ([`start_sqlite_watcher`]).
pub async fn start_cross_process_wake(
    db: &Db,
    cancel: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, sqlx::Error> {
    match db.as_postgres() {
        Some(_) => start_pg_listener(db, cancel).await,
        None => start_sqlite_watcher(db, cancel).await,
    }
}

/// Forwards Postgres notifications to the database handle's wake bus until cancelled.
///
/// LISTEN is registered before this returns, so a notification sent while the first claim runs
/// is not lost. A broken listener reconnects with capped backoff and wakes once after
/// reconnecting, since notifications sent while it was down are gone.
pub async fn start_pg_listener(
    db: &Db,
    cancel: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, sqlx::Error> {
    let Some(pool) = db.as_postgres().cloned() else {
        return Ok(None);
    };
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(PG_CHANNEL).await?;
    let bus = db.wake_bus().clone();
    Ok(Some(tokio::spawn(async move {
        let mut delay = Duration::from_millis(100);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                received = listener.recv() => match received {
                    Ok(_) => {
                        delay = Duration::from_millis(100);
                        bus.wake();
                    }
                    Err(error) => {
                        tracing::warn!(%error, "job notification listener lost its connection; reconnecting");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                        // PgListener reconnects on the next recv; wake in case we missed work.
                        bus.wake();
                    }
                }
            }
        }
    })))
}

/// Wakes the database handle's bus when another connection (any other process on this host, or
/// another pool) commits to the SQLite database, until cancelled.
///
/// SQLite has no NOTIFY; its `PRAGMA data_version` changes whenever a commit by any other
/// connection lands, so one dedicated connection reads it: every [`SQLITE_WATCH_BUSY`] while
/// commits keep coming, slowing to [`SQLITE_WATCH_IDLE`] once the database has been quiet for
/// [`SQLITE_WATCH_QUIET_AFTER`]. Any commit wakes (a job admitted, retried, released or rescued,
/// but also a heartbeat or a receipt): a woken runner's claim that finds nothing writes nothing,
/// so it wakes no one in turn. The first reading is taken before this returns, so a commit made
/// after it is seen.
pub async fn start_sqlite_watcher(
    db: &Db,
    cancel: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, sqlx::Error> {
    let Some(pool) = db.as_sqlite() else {
        return Ok(None);
    };
    let options = pool.connect_options();
    let mut connection = options.connect().await?;
    let mut seen = data_version(&mut connection).await?;
    let bus = db.wake_bus().clone();
    Ok(Some(tokio::spawn(async move {
        let mut pace = WatchPace::new(Instant::now());
        let mut broken = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pace.interval()) => {}
            }
            if broken {
                // A new connection counts from its own start: take its first reading as the
                // baseline, and wake once for the commits made while the watcher was down.
                let Ok(mut fresh) = options.connect().await else {
                    pace.quiet(Instant::now());
                    continue;
                };
                let Ok(version) = data_version(&mut fresh).await else {
                    pace.quiet(Instant::now());
                    continue;
                };
                connection = fresh;
                seen = version;
                broken = false;
                tracing::info!("database change watcher reconnected");
                bus.wake();
                continue;
            }
            match data_version(&mut connection).await {
                Ok(version) if version != seen => {
                    seen = version;
                    pace.changed(Instant::now());
                    bus.wake();
                }
                Ok(_) => pace.quiet(Instant::now()),
                Err(error) => {
                    tracing::warn!(%error, "database change watcher lost its connection; reconnecting");
                    broken = true;
                }
            }
        }
    })))
}

/// The SQLite watcher's reading interval: fast while commits come, slower when quiet.
#[derive(Debug)]
struct WatchPace {
    interval: Duration,
    last_change: Instant,
}

impl WatchPace {
    fn new(now: Instant) -> WatchPace {
        WatchPace {
            interval: SQLITE_WATCH_BUSY,
            last_change: now,
        }
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn changed(&mut self, now: Instant) {
        self.interval = SQLITE_WATCH_BUSY;
        self.last_change = now;
    }

    fn quiet(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_change) >= SQLITE_WATCH_QUIET_AFTER {
            self.interval = (self.interval * 2).min(SQLITE_WATCH_IDLE);
        }
    }
}

async fn data_version(connection: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("PRAGMA data_version")
        .fetch_one(connection)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watcher_reads_fast_while_commits_come_and_slows_when_quiet() {
        let start = Instant::now();
        let mut pace = WatchPace::new(start);
        pace.quiet(start + Duration::from_millis(1_900));
        assert_eq!(
            pace.interval(),
            SQLITE_WATCH_BUSY,
            "quiet for less than 2 s"
        );
        let quiet = start + SQLITE_WATCH_QUIET_AFTER;
        let intervals: Vec<u128> = (0..6)
            .map(|step| {
                pace.quiet(quiet + Duration::from_millis(step));
                pace.interval().as_millis()
            })
            .collect();
        assert_eq!(intervals, [40, 80, 160, 250, 250, 250]);
        pace.changed(quiet + Duration::from_secs(1));
        assert_eq!(
            pace.interval(),
            SQLITE_WATCH_BUSY,
            "a commit restores the fast pace"
        );
        pace.quiet(quiet + Duration::from_secs(2));
        assert_eq!(pace.interval(), SQLITE_WATCH_BUSY);
    }
}
