//! The process's one learning-change poller behind the live streams
//! (`routes/live.rs`), and the count of streams each token holds open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zuno_shared::db::Db;
use zuno_shared::learning::changes::{self, ChangeListener};

use super::error::ApiError;

/// How often the process's poller checks the database-wide change marker.
const POLL: Duration = Duration::from_millis(250);
/// The process's one change poller and the count of open streams per token.
#[derive(Clone)]
pub struct LiveHub {
    inner: Arc<HubInner>,
}

struct HubInner {
    db: Db,
    changes: tokio::sync::watch::Sender<u64>,
    /// Whether the poller task is running; changed only under this lock, together with the
    /// subscriber check, so a stream that subscribes while the poller stops is never left alone.
    running: Mutex<bool>,
    streams: Mutex<HashMap<String, usize>>,
    max_streams: usize,
}

/// An open stream's place in its token's count; released when the stream is dropped.
pub struct StreamPermit {
    hub: Arc<HubInner>,
    caller: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut streams = self
            .hub
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = streams.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                streams.remove(&self.caller);
            }
        }
    }
}

impl LiveHub {
    pub fn new(db: Db, max_streams_per_token: u32) -> LiveHub {
        let (changes, _) = tokio::sync::watch::channel(0);
        LiveHub {
            inner: Arc::new(HubInner {
                db,
                changes,
                running: Mutex::new(false),
                streams: Mutex::new(HashMap::new()),
                max_streams: max_streams_per_token.max(1) as usize,
            }),
        }
    }

    /// Takes one of the caller's stream slots, or refuses with 429 when all are in use.
    pub fn open_stream(&self, caller: &str) -> Result<StreamPermit, ApiError> {
        let mut streams = self
            .inner
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = streams.entry(caller.to_owned()).or_insert(0);
        if *count >= self.inner.max_streams {
            return Err(ApiError::TooManyRequests(format!(
                "this token already holds {} live streams open (server.max_streams_per_token); close one first",
                self.inner.max_streams
            )));
        }
        *count += 1;
        Ok(StreamPermit {
            hub: self.inner.clone(),
            caller: caller.to_owned(),
        })
    }

    /// Open streams per caller (for tests and diagnostics).
    pub fn open_streams(&self, caller: &str) -> usize {
        self.inner
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(caller)
            .copied()
            .unwrap_or(0)
    }

    /// A receiver of database-wide learning changes; starts the poller if it is not running.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        let receiver = self.inner.changes.subscribe();
        let mut running = self
            .inner
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*running {
            *running = true;
            tokio::spawn(poll_changes(self.inner.clone()));
        }
        receiver
    }
}

/// The process's poller: broadcasts a new version whenever the global marker moves; stops when
/// the last stream has gone.
async fn poll_changes(hub: Arc<HubInner>) {
    let mut listener = match ChangeListener::connect(&hub.db).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(%error, "learning streams: cannot LISTEN; polling only");
            None
        }
    };
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Vec<i64>> = None;
    loop {
        {
            let mut running = hub
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if hub.changes.receiver_count() == 0 {
                *running = false;
                return;
            }
        }
        match listener.as_mut() {
            Some(pg) => {
                tokio::select! {
                    _ = ticker.tick() => {}
                    received = pg.recv() => {
                        if let Err(error) = received {
                            tracing::warn!(%error, "learning streams: notification listener failed; polling only");
                            listener = None;
                        }
                    }
                }
            }
            None => {
                ticker.tick().await;
            }
        }
        match changes::global_marker(&hub.db).await {
            Ok(marker) => {
                if last.as_ref() != Some(&marker) {
                    last = Some(marker);
                    hub.changes.send_modify(|version| *version += 1);
                }
            }
            Err(error) => tracing::warn!(%error, "learning streams: change marker failed"),
        }
    }
}
