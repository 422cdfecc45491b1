//! A TCP proxy a test can cut: between a service and its database it plays a network or
//! database outage for that one service (other tests on the same server are unaffected).
//!
//! While cut, every open connection is closed and every new one is accepted and closed at once,
//! as a server that went away does; [`TcpProxy::restore`] lets connections through again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

struct State {
    cut: AtomicBool,
    /// Cancelled on a cut: ends the connections opened before it.
    generation: Mutex<CancellationToken>,
}

impl State {
    fn generation(&self) -> CancellationToken {
        self.generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A running proxy; stops when dropped.
pub struct TcpProxy {
    address: SocketAddr,
    state: Arc<State>,
    stop: CancellationToken,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: String) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let state = Arc::new(State {
            cut: AtomicBool::new(false),
            generation: Mutex::new(CancellationToken::new()),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, target, state.clone(), stop.clone()));
        Ok(TcpProxy {
            address,
            state,
            stop,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Closes every open connection and refuses service to new ones until [`Self::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        let mut generation = self
            .state
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        generation.cancel();
        *generation = CancellationToken::new();
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.generation().cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: String,
    state: Arc<State>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => return,
        };
        let Ok((client, _)) = accepted else {
            continue;
        };
        if state.cut.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let generation = state.generation();
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(&target).await else {
                return;
            };
            forward(client, upstream, generation).await;
        });
    }
}

async fn forward(mut client: TcpStream, mut upstream: TcpStream, generation: CancellationToken) {
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = generation.cancelled() => {}
    }
}
