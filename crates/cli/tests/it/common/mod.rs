//! Running the real `palisade` binary in tests: a coordinator process on a loopback port of
//! its own choosing, and CLI invocations against it.

#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub const BINARY: &str = env!("CARGO_BIN_EXE_palisade");

/// A `palisade serve` process.
pub struct ServerProcess {
    pub child: Child,
    pub url: String,
    pub data_dir: PathBuf,
}

impl ServerProcess {
    /// Starts `palisade serve` on 127.0.0.1 with an OS-chosen port and waits until it listens.
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(&["serve", "--listen", "127.0.0.1:0"], data_dir)
    }

    /// Starts `palisade serve` on 127.0.0.1 with `--policy POLICY` and waits until it listens.
    pub fn start_with_policy(policy: &Path, data_dir: &Path) -> Self {
        let policy = policy.to_str().expect("a UTF-8 path");
        let args = ["serve", "--listen", "127.0.0.1:0", "--policy", policy];
        Self::start_with(&args, data_dir)
    }

    /// Starts `palisade ARGS --data-dir DATA_DIR` and waits until it listens.
    pub fn start_with(args: &[&str], data_dir: &Path) -> Self {
        let mut command = Command::new(BINARY);
        command.args(args);
        Self::start_command(command, data_dir)
    }

    /// Starts `palisade ARGS --data-dir DATA_DIR` with `env` added to its environment (e.g.
    /// libfaketime's) and waits until it listens.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)], data_dir: &Path) -> Self {
        let mut command = Command::new(BINARY);
        command.args(args).envs(env.iter().copied());
        Self::start_command(command, data_dir)
    }

    /// Starts `palisade serve` with at most `descriptors` open files (`ulimit -n`).
    pub fn start_with_descriptor_limit(descriptors: u32, data_dir: &Path) -> Self {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {descriptors} && exec \"$0\" \"$@\""))
            .args([BINARY, "serve", "--listen", "127.0.0.1:0"]);
        Self::start_command(command, data_dir)
    }

    /// Runs `command --data-dir DATA_DIR` (a `palisade serve`) and waits until it listens.
    fn start_command(mut command: Command, data_dir: &Path) -> Self {
        let mut child = command
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start palisade serve");
        let url = read_stderr_until(&mut child, |line| {
            line.strip_prefix("palisade coordinator listening on ")
                .map(|address| format!("http://{address}"))
        });
        Self {
            child,
            url,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }

    /// SIGHUP: the coordinator reloads its auth, ACL and policy files.
    pub fn reload(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    }

    /// [`Self::reload`], then waits (at most 5 s) until `GET /v1/policy` satisfies `loaded`.
    pub fn reload_policy_until(&self, loaded: impl Fn(&serde_json::Value) -> bool) {
        self.reload();
        for _ in 0..100 {
            let (_, body) = self.http("GET", "/v1/policy", None, "");
            if serde_json::from_str(&body).is_ok_and(|shown| loaded(&shown)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the reloaded policy did not show within 5 s");
    }

    /// Runs `palisade ARGS --endpoint URL`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &self.url])
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_TOKEN")
            .env_remove("PALISADE_AUTH_TOKEN")
            .output()
            .expect("run palisade")
    }

    /// Runs `palisade ARGS --endpoint URL --token-file TOKEN_FILE`.
    pub fn cli_as(&self, token_file: &Path, args: &[&str]) -> Output {
        Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &self.url])
            .arg("--token-file")
            .arg(token_file)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run palisade")
    }

    /// Sends one HTTP/1.1 request (`Connection: close`) and returns the status and the body.
    pub fn http(
        &self,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        http_request(
            self.url.trim_start_matches("http://"),
            method,
            path,
            bearer,
            body,
        )
    }
}

/// One HTTP/1.1 request over a fresh loopback connection; the status and the body.
pub fn http_request(
    address: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let auth = bearer.map_or(String::new(), |secret| {
        format!("Authorization: Bearer {secret}\r\n")
    });
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    (status, body)
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `palisade resource serve` process.
pub struct ResourceProcess {
    pub child: Child,
    pub url: String,
}

impl ResourceProcess {
    /// Starts the reference store on an OS-chosen loopback port, trusting `coordinator`.
    pub fn start(data_dir: &Path, mode: &str, coordinator: &str) -> Self {
        Self::start_with(data_dir, mode, coordinator, &[])
    }

    /// [`Self::start`] with more arguments for `resource serve`.
    pub fn start_with(data_dir: &Path, mode: &str, coordinator: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--mode", mode, "--coordinator", coordinator];
        args.extend_from_slice(extra);
        Self::spawn(data_dir, &args)
    }

    /// `palisade resource serve --listen 127.0.0.1:0 ARGS --data-dir DATA_DIR`.
    pub fn spawn(data_dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(BINARY)
            .args(["resource", "serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start palisade resource serve");
        let url = read_stderr_until(&mut child, |line| {
            line.split_once(" listening on ")
                .map(|(_, address)| format!("http://{address}"))
        });
        Self { child, url }
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for a clean exit (the store records its witness).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }

    /// Runs `palisade resource ARGS --resource URL`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BINARY)
            .arg("resource")
            .args(args)
            .args(["--resource", &self.url])
            .env("RUST_LOG", "warn")
            .output()
            .expect("run palisade resource")
    }
}

impl Drop for ResourceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Peer credentials for a test cluster, written as PEM files in a directory: a CA of its own,
/// and one certificate per node naming `node-N.palisade` (server and client use). Private keys
/// are made here and never committed.
pub struct PeerFiles {
    pub dir: PathBuf,
}

impl PeerFiles {
    /// A CA and certificates for `nodes` in `dir` (the drill's maker).
    pub fn generate(dir: &Path, nodes: &[u64]) -> Self {
        palisade_drill::certs::peer_credentials(dir, nodes.iter().copied()).unwrap();
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The `serve` arguments of node `node`.
    pub fn args(&self, node: u64) -> Vec<String> {
        let file = |name: String| self.dir.join(name).to_string_lossy().into_owned();
        vec![
            "--peer-cert".into(),
            file(format!("node-{node}.pem")),
            "--peer-key".into(),
            file(format!("node-{node}.key")),
            "--peer-ca".into(),
            file("ca.pem".into()),
        ]
    }
}

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    // The kernel may hand the same free port out twice in a row (it was free both times): a
    // cluster's members would then share an address. Never twice in this process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// `cp -a FROM TO`: an operator's copy of a data directory (or putting one back).
/// Reads `child`'s stderr until `found` picks a line, and keeps draining the rest in a thread
/// so the process never blocks on a full pipe.
fn read_stderr_until(child: &mut Child, found: impl Fn(&str) -> Option<String>) -> String {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let picked = loop {
        let Some(line) = lines.next() else {
            panic!(
                "the process exited before printing its address:\n{}",
                seen.join("\n")
            );
        };
        let line = line.unwrap();
        if let Some(picked) = found(&line) {
            break picked;
        }
        seen.push(line);
    };
    std::thread::spawn(move || lines.for_each(drop));
    picked
}

/// SIGTERM to `child`, then waits (at most 10 s) for it to exit.
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the process did not stop within 10 s of SIGTERM");
}

pub fn cp_a(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A PostgreSQL connection to `url` (its driver task spawned on the current runtime).
pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}
