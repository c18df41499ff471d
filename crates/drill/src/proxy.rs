//! A buffering TCP proxy on loopback: passes traffic through, or — while held — keeps every
//! byte a client sends until released, then delivers it. It models a request that sits in a
//! network buffer, a load balancer or a retrying sidecar while ownership changes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Most bytes held per connection; a client that sends more while held is cut off.
pub const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;

/// A running proxy. Dropping it stops accepting; open connections end with their peers.
pub struct BufferingProxy {
    /// Where clients connect.
    pub local_addr: SocketAddr,
    state: Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

struct ProxyState {
    held: AtomicBool,
    released: Notify,
    held_bytes: AtomicU64,
}

impl BufferingProxy {
    /// Listens on 127.0.0.1 (an OS-chosen port) and forwards to `upstream` (loopback only).
    pub async fn start(upstream: SocketAddr, held: bool) -> std::io::Result<Self> {
        assert!(
            upstream.ip().is_loopback(),
            "the drill proxy only forwards to loopback"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local_addr = listener.local_addr()?;
        let state = Arc::new(ProxyState {
            held: AtomicBool::new(held),
            released: Notify::new(),
            held_bytes: AtomicU64::new(0),
        });
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = pipe(client, server, state).await;
                    }
                });
            }
        });
        Ok(Self {
            local_addr,
            state,
            accept,
        })
    }

    /// Bytes received from clients and not yet delivered.
    pub fn held_bytes(&self) -> u64 {
        self.state.held_bytes.load(Ordering::SeqCst)
    }

    /// Keeps every byte clients send from now on, until [`Self::release`].
    pub fn hold(&self) {
        self.state.held.store(true, Ordering::SeqCst);
    }

    /// Delivers everything held, and passes traffic through from now on.
    pub fn release(&self) {
        self.state.held.store(false, Ordering::SeqCst);
        self.state.released.notify_waiters();
    }
}

impl Drop for BufferingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, state: Arc<ProxyState>) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut held = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let released = state.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if state.held.load(Ordering::SeqCst) {
                tokio::select! {
                    read = client_read.read(&mut buffer) => {
                        let n = read?;
                        if n == 0 { break; }
                        held.extend_from_slice(&buffer[..n]);
                        state.held_bytes.fetch_add(n as u64, Ordering::SeqCst);
                        if held.len() > MAX_HELD_BYTES { break; }
                    }
                    () = &mut released => {}
                }
                continue;
            }
            if !held.is_empty() {
                server_write.write_all(&held).await?;
                state
                    .held_bytes
                    .fetch_sub(held.len() as u64, Ordering::SeqCst);
                held.clear();
            }
            let n = client_read.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            // `hold` may have been called while this read waited: those bytes are held too.
            if state.held.load(Ordering::SeqCst) {
                held.extend_from_slice(&buffer[..n]);
                state.held_bytes.fetch_add(n as u64, Ordering::SeqCst);
                continue;
            }
            server_write.write_all(&buffer[..n]).await?;
        }
        server_write.shutdown().await
    };
    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
    let _ = tokio::join!(upstream, downstream);
    Ok(())
}
