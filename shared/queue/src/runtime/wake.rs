//! Wake-up sources: the in-process bus (all-in-one mode and anything sharing a [`Db`] handle),
//! Postgres `LISTEN/NOTIFY` across processes, and polling as the fallback.

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::ledger::PG_CHANNEL;

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
