//! `coordinator-failover`: a 3-node coordinator (three `palisade serve` processes) under
//! acquire churn; the leader is killed with SIGKILL, again and again (each killed node is
//! restarted and rejoins before the next kill). Every acquire is recorded in a history that
//! the checker reads for P1 (no epoch granted twice; a grant invoked after another completed
//! has a greater epoch — so an acknowledged grant was not lost either, P8). The time from
//! each kill to the next successful acquire is the unavailability.
//!
//! The cluster runs as in production: members speak over mutual TLS, clients over TLS on the
//! same port, authenticated by a client certificate (principal `churn`) against an ACL.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_client::{AcquireOptions, Client, ClientError, Credentials};
use palisade_history::{Entry, History, Mode, Op, Outcome};
use serde_json::Value;

use crate::env::Service;
use crate::ScenarioReport;

/// Members of the drill's cluster.
const MEMBERS: u64 = 3;
/// Concurrent churn workers.
const WORKERS: usize = 4;
/// Locks the churn spreads over.
const LOCKS: usize = 4;
/// Lease TTL of the churn (short: a lease whose release was lost expires soon).
const CHURN_TTL: Duration = Duration::from_secs(2);
/// After a killed member rejoined, the cluster runs this long under churn before the next
/// kill: each kill then hits a healthy cluster (a member restarted a moment ago does not vote
/// yet — openraft's leader lease — which would make the next election wait for it).
const SETTLE: Duration = Duration::from_secs(1);
/// Longest wait for a leader, a restart, or the first acquire after a kill.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

struct Node {
    id: u64,
    addr: String,
    dir: PathBuf,
    /// The running `palisade serve`; `None` while killed.
    process: Option<Service>,
}

impl Node {
    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn start(&mut self, binary: &Path, cluster: &str, pki: &Path) -> anyhow::Result<()> {
        let dir = self.dir.to_string_lossy();
        let id = self.id.to_string();
        let file = |name: String| pki.join(name).to_string_lossy().into_owned();
        let (cert, key, ca) = (
            file(format!("node-{id}.pem")),
            file(format!("node-{id}.key")),
            file("ca.pem".into()),
        );
        let (tls_cert, tls_key, client_ca, acl) = (
            file("server.pem".into()),
            file("server.key".into()),
            file("client-ca.pem".into()),
            file("acl".into()),
        );
        // The members speak over mutual TLS, as in production: every kill makes the survivors
        // reconnect and the restarted member handshake again; so do the clients.
        let args = [
            "serve",
            "--node-id",
            &id,
            "--cluster",
            cluster,
            "--peer-cert",
            &cert,
            "--peer-key",
            &key,
            "--peer-ca",
            &ca,
            "--tls-cert",
            &tls_cert,
            "--tls-key",
            &tls_key,
            "--client-ca",
            &client_ca,
            "--acl-file",
            &acl,
            "--data-dir",
            &dir,
        ];
        self.process = Some(Service::start(binary, &args)?);
        Ok(())
    }

    /// kill -9 (dropping the service kills and reaps it).
    fn kill9(&mut self) {
        self.process = None;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Figures of one failover drill.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FailoverFigures {
    /// Leaders killed (and survived).
    pub leader_kills: usize,
    /// Grants acknowledged during the drill.
    pub grants: usize,
    /// Kill → next successful acquire, ms, one per kill.
    pub unavailable_ms: Vec<u64>,
    /// Median of `unavailable_ms`.
    pub unavailable_p50_ms: u64,
    /// Maximum of `unavailable_ms`.
    pub unavailable_max_ms: u64,
}

async fn leader(client: &reqwest::Client, nodes: &[Node]) -> Option<u64> {
    for node in nodes.iter().filter(|n| n.process.is_some()) {
        let Ok(reply) = client
            .get(format!("{}/v1/cluster", node.url()))
            .send()
            .await
        else {
            continue;
        };
        let Ok(view) = reply.json::<Value>().await else {
            continue;
        };
        if view["role"] == "leader" && view["serving"] == true {
            return view["node_id"].as_u64();
        }
    }
    None
}

async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        anyhow::ensure!(
            started.elapsed() < STEP_TIMEOUT,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `kills` leader kills under churn and checks the history.
pub async fn run(
    binary: &Path,
    kills: usize,
    progress: bool,
    report: &mut ScenarioReport,
) -> anyhow::Result<FailoverFigures> {
    let dir = tempfile::tempdir()?;
    let mut drill = Failover::start(binary, dir.path()).await?;
    let history = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = spawn_churn(&drill.client, &history, &stop, drill.origin);
    let mut figures = FailoverFigures::default();
    let mut outcome = Ok(());
    for kill in 0..kills {
        if progress {
            eprint!("\rcoordinator-failover: kill {}/{kills}   ", kill + 1);
        }
        match drill.kill_the_leader(kill, &history).await {
            Ok(unavailable_ms) => {
                figures.unavailable_ms.push(unavailable_ms);
                figures.leader_kills += 1;
            }
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
    }
    if progress {
        eprintln!();
    }
    stop.store(true, Ordering::Relaxed);
    for task in churn {
        let _ = task.await;
    }
    outcome?;
    let history = history.lock().expect("not poisoned").clone();
    report.absorb(&history, Mode::Strict);
    report.iterations = figures.leader_kills;
    figures.grants = history
        .entries
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Granted { .. }))
        .count();
    let mut sorted = figures.unavailable_ms.clone();
    sorted.sort_unstable();
    figures.unavailable_p50_ms = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    figures.unavailable_max_ms = sorted.last().copied().unwrap_or(0);
    Ok(figures)
}

/// The drill's cluster: its members, their credentials, and clients of it.
struct Failover {
    binary: PathBuf,
    nodes: Vec<Node>,
    cluster: String,
    pki: PathBuf,
    client: Client,
    http: reqwest::Client,
    origin: Instant,
}

impl Failover {
    /// Three members over mutual TLS (certificates made for the run), clients over TLS with a
    /// client certificate and an ACL, once a first leader is elected.
    async fn start(binary: &Path, dir: &Path) -> anyhow::Result<Self> {
        let mut nodes = Vec::new();
        for id in 1..=MEMBERS {
            nodes.push(Node {
                id,
                addr: format!("127.0.0.1:{}", free_port()?),
                dir: dir.join(format!("node{id}")),
                process: None,
            });
        }
        let cluster = nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.addr))
            .collect::<Vec<_>>()
            .join(",");
        let pki = dir.join("pki");
        crate::certs::peer_credentials(&pki, 1..=MEMBERS)?;
        crate::certs::client_credentials(&pki, &["churn"])?;
        std::fs::write(pki.join("acl"), "churn acquire failover/\nchurn read *\n")?;
        for node in &mut nodes {
            node.start(binary, &cluster, &pki)?;
        }
        let urls: Vec<String> = nodes.iter().map(Node::url).collect();
        let (client, http) = tls_clients(&pki, &urls).await?;
        wait_for("a first leader", || leader(&http, &nodes)).await?;
        Ok(Self {
            binary: binary.to_owned(),
            nodes,
            cluster,
            pki,
            client,
            http,
            origin: Instant::now(),
        })
    }

    /// kill -9 of the leader under churn; the milliseconds until an acquire is granted again
    /// (recorded in `history`); then the member restarted and caught up.
    async fn kill_the_leader(
        &mut self,
        kill: usize,
        history: &Mutex<History>,
    ) -> anyhow::Result<u64> {
        let leader_id = wait_for("a leader", || leader(&self.http, &self.nodes)).await?;
        tokio::time::sleep(Duration::from_millis(150)).await; // churn under this leader
        self.node(leader_id).kill9();
        let killed_at = Instant::now();
        // The first acquire that succeeds after the kill, on a lock nobody holds.
        let mut options = AcquireOptions::new(format!("failover/probe-{kill}"));
        options.ttl = CHURN_TTL;
        options.holder = "probe".into();
        let invoked = self.now_us();
        let grant = wait_for("an acquire after the kill", || {
            let client = self.client.clone();
            let options = options.clone();
            async move { client.acquire_once(&options).await.ok() }
        })
        .await?;
        let unavailable = killed_at.elapsed();
        history.lock().expect("not poisoned").push(Entry {
            process: "probe".into(),
            lock: options.lock.clone(),
            op: Op::Acquire,
            invoked,
            completed: self.now_us(),
            outcome: Outcome::Granted { epoch: grant.epoch },
        });
        let _ = self.client.release(&grant.lease_id).await;
        self.restart(leader_id).await?;
        tokio::time::sleep(SETTLE).await;
        Ok(unavailable.as_millis() as u64)
    }

    /// Restarts member `id`; it must follow a leader again before the next kill.
    async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let (binary, cluster, pki) = (self.binary.clone(), self.cluster.clone(), self.pki.clone());
        let node = self.node(id);
        node.start(&binary, &cluster, &pki)?;
        let url = node.url();
        let http = self.http.clone();
        wait_for("the restarted member to follow", || {
            let http = http.clone();
            let url = url.clone();
            async move {
                let view: Value = http
                    .get(format!("{url}/v1/cluster"))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                (view["leader"].is_u64() && view["last_applied"].is_u64()).then_some(())
            }
        })
        .await
    }

    fn node(&mut self, id: u64) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .expect("a member of the drill")
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// The gRPC client (every member, the client certificate) and an HTTP client for the members'
/// status.
async fn tls_clients(pki: &Path, urls: &[String]) -> anyhow::Result<(Client, reqwest::Client)> {
    let (ca, cert, key) = (
        std::fs::read(pki.join("server-ca.pem"))?,
        std::fs::read(pki.join("client-churn.pem"))?,
        std::fs::read(pki.join("client-churn.key"))?,
    );
    let credentials = Credentials::default()
        .with_ca_pem(&ca)
        .with_identity_pem(&cert, &key);
    let client = Client::connect_with(urls, credentials).await?;
    let identity = reqwest::Identity::from_pem(&[key.as_slice(), b"\n", cert.as_slice()].concat())?;
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .identity(identity)
        .timeout(Duration::from_millis(500))
        .build()?;
    Ok((client, http))
}

/// Workers acquiring and releasing the drill's locks until `stop`, each acquire recorded.
fn spawn_churn(
    client: &Client,
    history: &Arc<Mutex<History>>,
    stop: &Arc<AtomicBool>,
    origin: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let now_us = move || origin.elapsed().as_micros() as u64;
    (0..WORKERS)
        .map(|worker| {
            let (client, history, stop) = (client.clone(), history.clone(), stop.clone());
            tokio::spawn(async move {
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let lock = format!("failover/{}", (worker + round) % LOCKS);
                    let mut options = AcquireOptions::new(lock.clone());
                    options.ttl = CHURN_TTL;
                    options.holder = format!("w{worker}");
                    let invoked = now_us();
                    let result = client.acquire_once(&options).await;
                    let outcome = match &result {
                        Ok(grant) => Outcome::Granted { epoch: grant.epoch },
                        Err(ClientError::Held(_)) => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(_) => Outcome::Unknown,
                    };
                    history.lock().expect("not poisoned").push(Entry {
                        process: format!("w{worker}"),
                        lock,
                        op: Op::Acquire,
                        invoked,
                        completed: now_us(),
                        outcome,
                    });
                    if let Ok(grant) = result {
                        let _ = client.release(&grant.lease_id).await;
                    }
                }
            })
        })
        .collect()
}
