//! The listener's limits against real sockets on loopback: what an attacker who can only open
//! connections and send bytes slowly can hold, and for how long. (P8: a coordinator that
//! cannot accept a connection cannot grant or renew anything.)

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use palisade_listener::{bounded_bodies, serve, ClearText, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const MAX_BODY: usize = 1024;

fn limits() -> Limits {
    Limits {
        max_connections: 4,
        header_read: Duration::from_millis(400),
        body_read: Duration::from_millis(400),
        idle: Duration::from_secs(60),
    }
}

/// A server on a loopback port; the sender stops it.
async fn start(limits: Limits) -> (String, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let app = Router::new().route("/", get(|| async { "ok" })).route(
        "/echo",
        post(|body: String| async move { body.len().to_string() }),
    );
    let app = bounded_bodies(app, MAX_BODY, "body_too_large", limits.body_read);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal) = watch::channel(false);
    let task = tokio::spawn(serve(listener, app, limits, signal));
    (addr, stop, task)
}

/// Everything the server sends until it closes, or `None` if it is still open after `limit`.
async fn read_until_closed(socket: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(limit, socket.read_to_end(&mut out)).await;
    match read {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

async fn get_ok(addr: &str) -> Result<String, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?
        .get(format!("http://{addr}/"))
        .send()
        .await?
        .text()
        .await
}

#[tokio::test]
async fn a_header_drip_is_cut_off_after_the_header_timeout() {
    let (addr, stop, task) = start(limits()).await;
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Before: axum::serve has no header timeout; the socket stayed open for ever.
    let closed = read_until_closed(&mut socket, Duration::from_secs(5)).await;
    assert!(
        closed.is_some(),
        "the server closed the dripping connection"
    );
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_declared_oversized_body_is_refused_before_it_is_sent() {
    let (addr, stop, task) = start(limits()).await;
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut answer))
        .await
        .expect("an answer without the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body_too_large"), "{answer}");
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_stalled_body_is_refused_after_the_body_timeout() {
    let (addr, stop, task) = start(limits()).await;
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut answer))
        .await
        .expect("an answer although the body stalled")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    // A body within the limits still goes through.
    let echoed = reqwest::Client::new()
        .post(format!("http://{addr}/echo"))
        .body("x".repeat(MAX_BODY))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(echoed, MAX_BODY.to_string());
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn silent_sockets_at_the_connection_limit_give_way_to_a_newcomer() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    // Twice the limit of sockets that never say anything.
    let mut silent = Vec::new();
    for _ in 0..2 * limits.max_connections {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Before: a newcomer waited behind them for ever. Now the silentest are evicted.
    for _ in 0..3 {
        assert_eq!(get_ok(&addr).await.unwrap(), "ok");
    }
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("shutdown does not wait for silent sockets")
        .unwrap();
}

#[tokio::test]
async fn a_connection_silent_for_the_idle_timeout_is_closed() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        idle: Duration::from_millis(400),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    let closed = read_until_closed(&mut socket, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "the idle connection was closed");
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn shutdown_closes_idle_keep_alive_connections_and_returns() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    let client = reqwest::Client::new();
    let answer = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(answer.text().await.unwrap(), "ok");
    // The client keeps its connection in its pool; shutdown must not wait for it.
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("shutdown finished")
        .unwrap();
}

/// A TLS acceptor with a self-signed certificate (no client certificate asked for).
fn acceptor() -> tokio_rustls::TlsAcceptor {
    use tokio_rustls::rustls;
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let chain = vec![certified.cert.der().clone()];
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
}

#[tokio::test]
async fn p8_with_tls_on_the_port_a_stalled_handshake_is_cut_and_clear_text_is_still_served() {
    let app = Router::new().route("/", get(|| async { "ok" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal) = watch::channel(false);
    let task = tokio::spawn(palisade_listener::serve_with_tls(
        listener,
        app,
        limits(),
        Some(palisade_listener::Tls::new(acceptor(), ClearText::Serve)),
        signal,
    ));
    // A handshake record's first byte, then silence: closed within the header time.
    let mut drip = TcpStream::connect(&addr).await.unwrap();
    drip.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    assert!(
        read_until_closed(&mut drip, Duration::from_secs(3))
            .await
            .is_some(),
        "a stalled TLS handshake held its connection"
    );
    // (A connection that says nothing at all is treated as before: served in clear after the
    // header time, closed when idle or evicted for a newcomer — tested above.)
    // Garbage that is not TLS is served as HTTP (and refused as such), not hung.
    let mut garbage = TcpStream::connect(&addr).await.unwrap();
    garbage
        .write_all(b"\x16not tls at all\r\n\r\n")
        .await
        .unwrap();
    assert!(read_until_closed(&mut garbage, Duration::from_secs(3))
        .await
        .is_some());
    // Clear-text clients are served as before.
    assert_eq!(get_ok(&addr).await.unwrap(), "ok");
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn p8_a_tls_only_port_answers_clear_text_with_an_error_naming_https_and_closes() {
    let app = Router::new().route("/", get(|| async { "ok" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal) = watch::channel(false);
    let task = tokio::spawn(palisade_listener::serve_with_tls(
        listener,
        app,
        limits(),
        Some(palisade_listener::Tls::new(acceptor(), ClearText::Refuse)),
        signal,
    ));
    let response = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "tls_required");
    assert!(body["message"].as_str().unwrap().contains("https://"));
    stop.send(true).unwrap();
    task.await.unwrap();
}
