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
        admission_waiters: 64,
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
async fn p8_a_newcomer_whose_eviction_went_to_an_earlier_waiter_still_gets_a_slot() {
    let limits = Limits {
        max_connections: 2,
        header_read: Duration::from_secs(60),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    let started = tokio::time::Instant::now();
    let _first = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _second = TcpStream::connect(&addr).await.unwrap();
    // A silent newcomer waits from 0.55 s; nothing is quiet enough to evict before 1 s.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _early = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep_until(started + Duration::from_millis(1_050)).await;
    // This client evicts the first socket at once, but the freed slot goes to the silent
    // newcomer that began to wait earlier. Before: each newcomer evicted one connection and
    // then only waited, so the client was closed after 2 s although the second socket had
    // been quiet long enough since 1.5 s. Now waiting newcomers go on evicting.
    assert_eq!(get_ok(&addr).await.unwrap(), "ok");
    stop.send(true).unwrap();
    task.await.unwrap();
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

/// Opens an HTTP/2 connection in clear and sends nothing but pings, every `every`, answering
/// the server's pings as a well-behaved peer does, until the server closes it; returns how
/// long that took (or `None` if it was still open after `limit`).
async fn ping_only(addr: &str, every: Duration, limit: Duration) -> Option<Duration> {
    let started = tokio::time::Instant::now();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    socket
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < limit {
        // A PING frame: length 8, type 6, no flags, stream 0, 8 opaque bytes.
        let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        if socket.write_all(&ping).await.is_err() {
            return Some(started.elapsed());
        }
        let deadline = tokio::time::Instant::now() + every;
        loop {
            match tokio::time::timeout_at(deadline, socket.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
                Ok(Ok(n)) => {
                    received.extend_from_slice(&buffer[..n]);
                    for answer in answers_to_pings(&mut received) {
                        if socket.write_all(&answer).await.is_err() {
                            return Some(started.elapsed());
                        }
                    }
                }
                Err(_) => break,
            }
        }
    }
    None
}

/// Takes the whole frames off `received` and returns an acknowledging PING frame for each
/// PING the server sent (settings are acknowledged implicitly: this peer never checks).
fn answers_to_pings(received: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut answers = Vec::new();
    while received.len() >= 9 {
        let length = usize::from(received[0]) << 16
            | usize::from(received[1]) << 8
            | usize::from(received[2]);
        if received.len() < 9 + length {
            break;
        }
        let (kind, flags) = (received[3], received[4]);
        if kind == 6 && flags & 1 == 0 && length == 8 {
            let mut answer = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
            answer.extend_from_slice(&received[9..17]);
            answers.push(answer);
        }
        received.drain(..9 + length);
    }
    answers
}

#[tokio::test]
async fn p8_connections_that_only_ping_give_way_to_a_newcomer_at_the_limit() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    // Before: every ping counted as traffic, so pinging connections were never "silent" and
    // a newcomer waited 2 s and was closed. Now only requests count.
    let pingers: Vec<_> = (0..limits.max_connections)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                ping_only(&addr, Duration::from_millis(200), Duration::from_secs(20)).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    for _ in 0..3 {
        assert_eq!(get_ok(&addr).await.unwrap(), "ok");
    }
    let mut closed = 0;
    for pinger in pingers {
        if tokio::time::timeout(Duration::from_millis(100), pinger)
            .await
            .is_ok_and(|ended| ended.unwrap().is_some())
        {
            closed += 1;
        }
    }
    assert!(closed >= 1, "at least one pinger was evicted");
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_connection_that_only_pings_is_closed_after_the_idle_timeout() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        idle: Duration::from_millis(400),
        ..limits()
    };
    let (addr, stop, task) = start(limits).await;
    let closed = ping_only(&addr, Duration::from_millis(100), Duration::from_secs(10)).await;
    let closed = closed.expect("the pinging connection was closed as idle");
    assert!(closed < Duration::from_secs(5), "{closed:?}");
    stop.send(true).unwrap();
    task.await.unwrap();
}

/// A server whose `/hold` requests last `hold`.
async fn start_holding(
    limits: Limits,
    hold: Duration,
) -> (String, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let app = Router::new().route("/", get(|| async { "ok" })).route(
        "/hold",
        get(move || async move {
            tokio::time::sleep(hold).await;
            "held"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal) = watch::channel(false);
    let task = tokio::spawn(serve(listener, app, limits, signal));
    (addr, stop, task)
}

#[tokio::test]
async fn p8_newcomers_at_the_limit_wait_beside_the_accept_loop_not_in_it() {
    let limits = Limits {
        header_read: Duration::from_secs(60),
        ..limits()
    };
    let (addr, stop, task) = start_holding(limits, Duration::from_secs(8)).await;
    // Every slot busy with a request in flight (not evictable).
    let holders: Vec<_> = (0..limits.max_connections)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                reqwest::Client::new()
                    .get(format!("http://{addr}/hold"))
                    .send()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Before: each newcomer waited its 2 s inside the accept loop, one after another, so the
    // eighth was not even looked at for 14 s. Now up to 64 wait side by side.
    let started = tokio::time::Instant::now();
    let newcomers: Vec<_> = (0..60)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let mut socket = TcpStream::connect(&addr).await.unwrap();
                read_until_closed(&mut socket, Duration::from_secs(6)).await
            })
        })
        .collect();
    for newcomer in newcomers {
        assert!(
            newcomer.await.unwrap().is_some(),
            "every newcomer was closed"
        );
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(4_000),
        "60 newcomers were answered side by side: {took:?}"
    );
    for holder in holders {
        assert_eq!(holder.await.unwrap().unwrap().text().await.unwrap(), "held");
    }
    stop.send(true).unwrap();
    task.await.unwrap();
}

/// A server with a unary and a client-streaming gRPC-shaped route that report how much of
/// their body they read, or that it broke off.
async fn start_grpc(
    within: Duration,
) -> (String, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    async fn read_all(body: axum::body::Body) -> String {
        match axum::body::to_bytes(body, 1 << 20).await {
            Ok(bytes) => format!("read {}", bytes.len()),
            Err(error) => format!("broken: {error}"),
        }
    }
    let app = Router::new()
        .route("/x.Svc/Unary", post(read_all))
        .route("/x.Svc/Stream", post(read_all));
    let app = palisade_listener::grpc_message_deadlines(app, within, "/x.Svc/", &["/x.Svc/Stream"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, signal) = watch::channel(false);
    let task = tokio::spawn(serve(listener, app, limits(), signal));
    (addr, stop, task)
}

/// Sends a gRPC-shaped request on `path` over raw HTTP/2: `parts` with `pause` between them,
/// ending the stream after the last when `end` is true. Returns the answer's body text.
async fn grpc_request(
    addr: &str,
    path: &str,
    parts: &[&[u8]],
    pause: Duration,
    end: bool,
) -> String {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let sending = async move {
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            let last = end && i + 1 == parts.len();
            let _ = send.send_data(bytes::Bytes::copy_from_slice(part), last);
        }
        // Keep the stream (open, or ended by the client) until the answer arrives.
        std::future::pending::<()>().await;
        drop(send);
    };
    let answer = async {
        let mut body = response.await.unwrap().into_body();
        let mut text = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            text.extend_from_slice(&chunk);
        }
        String::from_utf8_lossy(&text).into_owned()
    };
    tokio::select! {
        answer = answer => answer,
        () = sending => unreachable!("the sender waits for ever"),
        () = tokio::time::sleep(Duration::from_secs(10)) => "no answer".into(),
    }
}

#[tokio::test]
async fn p8_a_grpc_message_that_stalls_midway_is_cut_after_the_deadline() {
    let (addr, stop, task) = start_grpc(Duration::from_millis(400)).await;
    let message: &[u8] = &[0, 0, 0, 0, 3, b'a', b'b', b'c'];
    // In time, split anywhere: read whole.
    let whole = grpc_request(
        &addr,
        "/x.Svc/Unary",
        &[&message[..2], &message[2..]],
        Duration::from_millis(50),
        true,
    )
    .await;
    assert_eq!(whole, "read 8");
    // Three bytes of a prefix, then nothing, stream left open: before, the request held its
    // stream for ever (tonic has no body timeout). Now it breaks off after 400 ms.
    let started = tokio::time::Instant::now();
    let stalled = grpc_request(
        &addr,
        "/x.Svc/Unary",
        &[&message[..3]],
        Duration::ZERO,
        false,
    )
    .await;
    assert!(stalled.starts_with("broken"), "{stalled}");
    assert!(stalled.contains("did not arrive within"), "{stalled}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The same on a client-streaming method: a message started must finish.
    let stalled = grpc_request(
        &addr,
        "/x.Svc/Stream",
        &[message, &message[..6]],
        Duration::from_millis(50),
        false,
    )
    .await;
    assert!(stalled.starts_with("broken"), "{stalled}");
    // A unary request that never starts its message is cut too.
    let silent = grpc_request(&addr, "/x.Svc/Unary", &[], Duration::ZERO, false).await;
    assert!(silent.starts_with("broken"), "{silent}");
    // A client-streaming method may wait between messages longer than the deadline.
    let patient = grpc_request(
        &addr,
        "/x.Svc/Stream",
        &[message, message],
        Duration::from_millis(900),
        true,
    )
    .await;
    assert_eq!(patient, "read 16");
    stop.send(true).unwrap();
    task.await.unwrap();
}
