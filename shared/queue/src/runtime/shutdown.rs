//! SIGTERM/SIGINT handling.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
        }
        cancel.cancel();
    });
    token
}
