//! Queue depth by kind and state, published as the `zuno_queue_depth` gauge.
//!
//! Every process that exports metrics runs [`report_queue_depth`] (the API and, when they export
//! metrics, the workers), so the gauge is visible wherever a scraper or collector looks. Each
//! process reports the same database-wide counts: dashboards aggregate it with `max`, not `sum`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ledger::{JobKind, JobState, Ledger, LedgerError};

/// How often the reporter reads the counts: often enough for a dashboard, rare enough that one
/// `GROUP BY` per process is negligible load.
pub const QUEUE_DEPTH_INTERVAL: Duration = Duration::from_secs(5);

/// Reads the counts once and records them. Every kind/state pair is recorded, absent ones as
/// zero: a gauge keeps its last value, so a state that empties (the last running job settles)
/// must be set back to zero explicitly.
pub async fn publish_queue_depth(ledger: &Ledger) -> Result<(), LedgerError> {
    let counts = ledger.counts().await?;
    let metrics = super::metrics::ledger();
    for kind in JobKind::ALL {
        for state in JobState::ALL {
            let count = counts
                .iter()
                .find(|count| count.kind == kind && count.state == state)
                .map_or(0, |count| count.count);
            metrics.queue_depth(kind, state.as_str(), count);
        }
    }
    Ok(())
}

/// Publishes queue depth every [`QUEUE_DEPTH_INTERVAL`] until `shutdown` is cancelled. A failed
/// read is logged at debug level and retried on the next tick (the database may be restarting;
/// the runner already reports that loudly).
pub async fn report_queue_depth(ledger: Ledger, shutdown: CancellationToken) {
    loop {
        if let Err(error) = publish_queue_depth(&ledger).await {
            tracing::debug!(%error, "cannot read queue depth");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(QUEUE_DEPTH_INTERVAL) => {}
        }
    }
}
