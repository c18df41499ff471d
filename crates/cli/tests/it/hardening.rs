//! The coordinator process against clients that only open sockets or send slowly (P8: a
//! coordinator that cannot accept a connection cannot grant, renew or release anything).

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::ServerProcess;

fn address(server: &ServerProcess) -> String {
    server.url.trim_start_matches("http://").to_owned()
}

#[test]
fn p8_idle_sockets_beyond_the_descriptor_limit_do_not_stop_acquires() {
    // Before: with a 256-descriptor limit, 374 idle sockets used every descriptor; accept
    // failed with EMFILE and acquires timed out. Now connections are bounded below the
    // descriptor limit and silent ones give way to newcomers.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_descriptor_limit(256, dir.path());
    let addr = address(&server);
    let started = Instant::now();
    // A header drip alongside: it must be cut off by the header timeout (10 s).
    let mut drip = TcpStream::connect(&addr).unwrap();
    drip.write_all(b"POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut idle = Vec::new();
    for _ in 0..374 {
        match TcpStream::connect(&addr) {
            Ok(socket) => idle.push(socket),
            Err(_) => break, // the backlog is full: more than enough
        }
    }
    assert!(idle.len() > 256, "only {} sockets opened", idle.len());
    std::thread::sleep(Duration::from_millis(1_200));
    for i in 0..3 {
        let out = server.cli(&["lock", "acquire", &format!("idle/{i}"), "--json"]);
        assert!(
            out.status.success(),
            "acquire {i} with {} idle sockets open: {}",
            idle.len(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drip.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = drip.read_to_end(&mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the header drip was closed by the server"
    );
}

#[test]
fn p8_a_declared_oversized_body_is_refused_before_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let mut socket = TcpStream::connect(address(&server)).unwrap();
    socket
        .write_all(
            b"POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000000000\r\n\r\n",
        )
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = [0u8; 512];
    let n = socket.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body_too_large"), "{answer}");
}
