//! Accepting connections: at most `max_connections` at once, each closed when its client is too
//! slow to send a request, and all of them drained on shutdown.
//!
//! A connection holds one slot from its acceptance to its close; when every slot is taken the
//! proxy stops accepting (the kernel's backlog holds new connections) and says so once in the
//! log until a slot frees. A client must send the first byte of a request within the header
//! timeout of connecting and the whole header within the same time of its first byte (hyper's
//! `header_read_timeout`, which also bounds the wait for the next request on a kept-alive
//! connection); a request body that pauses longer is answered 408 (`server::read_body`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::metrics::Metrics;
use crate::state::State;

/// How connections are bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, asks every
/// open connection to close after its current response, and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    state: Arc<State>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let metrics = &state.metrics;
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing, closed) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut full = false;
    loop {
        // Reap finished connection tasks so the set stays as small as the open connections.
        while conns.try_join_next().is_some() {}
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => {
                full = false;
                slot
            }
            Err(_) => {
                if !full {
                    full = true;
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "connection limit reached; new connections wait for a free slot"
                    );
                }
                metrics.connection_wait();
                tokio::select! {
                    s = Arc::clone(&slots).acquire_owned() => match s {
                        Ok(s) => s,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(error) => {
                    // Out of descriptors or a connection reset before it was accepted: wait a
                    // moment rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let state = Arc::clone(&state);
        let mut closed = closed.clone();
        conns.spawn(async move {
            connection(stream, addr, router, limits, &state.metrics, &mut closed).await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = closing.send(true);
    while conns.join_next().await.is_some() {}
}

async fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    router: Router,
    limits: Limits,
    metrics: &Metrics,
    closed: &mut watch::Receiver<bool>,
) {
    // Stream events are small writes: without TCP_NODELAY the last ones of a response wait for
    // the client's delayed ACK (about 40 ms on Linux).
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY on a client connection");
    }
    // The first byte of the first request; hyper's header timer covers the rest.
    let mut byte = [0u8; 1];
    match tokio::time::timeout(limits.header_timeout, stream.peek(&mut byte)).await {
        Ok(Ok(n)) if n > 0 => {}
        Ok(_) => return,
        Err(_) => {
            metrics.slow_client();
            tracing::debug!(%addr, "no request within the header timeout; connection closed");
            return;
        }
    }
    let service = TowerToHyperService::new(router);
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let mut asked = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(error) = r {
                    if error.is_timeout() {
                        metrics.slow_client();
                    }
                    tracing::debug!(%addr, %error, "connection ended with an error");
                }
                return;
            }
            changed = closed.changed(), if !asked => {
                asked = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
