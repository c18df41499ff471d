//! A real 3-process cluster: status, failover of acquires with several endpoints, and the
//! refusal of a start whose --cluster disagrees with the stored membership.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{cp_a, free_port, ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

/// Addresses of a 3-member cluster on free loopback ports.
struct Layout {
    ports: Vec<u16>,
    /// `--cluster` list.
    cluster: String,
    /// Every member's URL, comma-separated (`--endpoint`).
    endpoints: String,
}

impl Layout {
    fn three() -> Self {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cluster = (1..=3)
            .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
            .collect::<Vec<_>>()
            .join(",");
        let endpoints = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        Self {
            ports,
            cluster,
            endpoints,
        }
    }

    /// The URL of member `id` alone.
    fn endpoint(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.ports[id as usize - 1])
    }
}

fn start(id: u64, cluster: &str, dir: &Path) -> ServerProcess {
    let id = id.to_string();
    ServerProcess::start_with(
        &[
            "serve",
            "--node-id",
            &id,
            "--cluster",
            cluster,
            "--insecure-peers",
        ],
        dir,
    )
}

fn cli(args: &[&str], endpoints: &str) -> Output {
    Command::new(BINARY)
        .args(args)
        .args(["--endpoint", endpoints])
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `lock acquire LOCK --json --ttl 60s` at `endpoints`; the epoch granted (a decimal string in
/// JSON).
fn acquired_epoch(lock: &str, endpoints: &str) -> u64 {
    let granted = json(&cli(
        &["lock", "acquire", lock, "--json", "--ttl", "60s"],
        endpoints,
    ));
    palisade_core::json::read(&granted["epoch"]).expect("an epoch")
}

/// Waits (bounded) until `cluster status` names a leader.
fn leader(endpoints: &str) -> (u64, Value) {
    for _ in 0..200 {
        let output = cli(&["cluster", "status", "--json"], endpoints);
        if output.status.success() {
            let status: Value = serde_json::from_slice(&output.stdout).unwrap();
            if let Some(id) = status["leader"].as_u64() {
                return (id, status);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no leader within 10 s");
}

/// Waits (bounded) until the node at `endpoint` answers `cluster status` (it has started).
fn answers(endpoint: &str) {
    for _ in 0..200 {
        if cli(&["cluster", "status", "--json"], endpoint)
            .status
            .success()
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{endpoint} did not start within 10 s");
}

/// P8: a follower asked to stop (SIGTERM) stops promptly while the leader streams appends to
/// it. Its open append stream ends with the member instead of holding the listener's graceful
/// shutdown for the whole grace period (the leader never closes it), and the two others go on
/// granting.
#[test]
fn a_follower_stops_promptly_while_the_leader_streams_appends_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let Layout {
        cluster, endpoints, ..
    } = Layout::three();
    let mut nodes: Vec<ServerProcess> = (1..=3u64)
        .map(|id| start(id, &cluster, &dir.path().join(format!("n{id}"))))
        .collect();
    let (leader_id, _) = leader(&endpoints);
    // A grant is committed: the leader has appended to its followers on their streams.
    let first = acquired_epoch("streams/1", &endpoints);
    let follower = (1..=3u64).find(|id| *id != leader_id).unwrap();
    let asked = std::time::Instant::now();
    assert!(nodes[follower as usize - 1].terminate().success());
    let took = asked.elapsed();
    assert!(
        took + std::time::Duration::from_secs(2) < palisade_server::SHUTDOWN_GRACE,
        "the follower took {took:?} to stop: it waited for the leader's stream"
    );
    assert!(acquired_epoch("streams/2", &endpoints) > first);
}

/// P1, P8: epochs keep increasing across a kill -9 of the leader; the client finds the new
/// leader through the other endpoints; a retried acquire with the same request id returns
/// the same lease (no second lease).
#[test]
fn cluster_survives_a_leader_kill_and_refuses_a_disagreeing_member_list() {
    let dir = tempfile::tempdir().unwrap();
    let Layout {
        ports,
        cluster,
        endpoints,
    } = Layout::three();
    let mut nodes: Vec<Option<ServerProcess>> = (1..=3u64)
        .map(|id| Some(start(id, &cluster, &dir.path().join(format!("n{id}")))))
        .collect();

    let (first_leader, status) = leader(&endpoints);
    assert_eq!(status["members"].as_array().unwrap().len(), 3);
    every_member_is_ready_and_names_the_leader(&ports);

    let acquire = |lock: &str, request_id: &str| {
        json(&cli(
            &[
                "lock",
                "acquire",
                lock,
                "--json",
                "--holder",
                "t",
                "--ttl",
                "30s",
                "--request-id",
                request_id,
            ],
            &endpoints,
        ))
    };
    let a = acquire("cluster/a", "req-a");
    // The same request id and holder: the same lease, not a refusal and not a second lease.
    let again = acquire("cluster/a", "req-a");
    assert_eq!(a["lease_id"], again["lease_id"]);
    assert_eq!(a["epoch"], again["epoch"]);

    nodes[first_leader as usize - 1].take().unwrap().kill9();

    // The acknowledged lease survived the kill (P8): the lock is still held...
    let held = cli(
        &["lock", "acquire", "cluster/a", "--holder", "other"],
        &endpoints,
    );
    assert_eq!(
        held.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    // ... and a new grant is above every acknowledged epoch (P1).
    let b = acquire("cluster/b", "req-b");
    assert!(
        palisade_core::json::read(&b["epoch"]) > palisade_core::json::read(&a["epoch"]),
        "{a} then {b}"
    );
    let (second_leader, _) = leader(&endpoints);
    assert_ne!(second_leader, first_leader);
    the_new_leaders_feed_holds_the_old_leaders_grants(&nodes, second_leader, &a);

    // The killed member rejoins with the same list; a wrong list is refused.
    let killed_dir = dir.path().join(format!("n{first_leader}"));
    a_disagreeing_member_list_is_refused(first_leader, &cluster, ports[0], &killed_dir);
    nodes[first_leader as usize - 1] = Some(start(first_leader, &cluster, &killed_dir));
    let c = acquire("cluster/c", "req-c");
    assert!(palisade_core::json::read(&c["epoch"]) > palisade_core::json::read(&b["epoch"]));
    drop(nodes); // kills the members
}

/// The console's history survives the failover: every member records what it applies, so the
/// new leader's feed holds the grant the killed leader made.
fn the_new_leaders_feed_holds_the_old_leaders_grants(
    nodes: &[Option<ServerProcess>],
    leader: u64,
    granted: &Value,
) {
    let node = nodes[leader as usize - 1].as_ref().unwrap();
    let (status, body) = node.http("GET", "/v1/transitions", None, "");
    assert_eq!(status, 200, "{body}");
    let feed: Value = serde_json::from_str(&body).unwrap();
    let held = feed["transitions"].as_array().unwrap().iter().any(|t| {
        t["kind"] == "granted" && t["lock"] == "cluster/a" && t["epoch"] == granted["epoch"]
    });
    assert!(
        held,
        "the grant before the failover is in the new leader's feed: {feed}"
    );
}

/// Readiness is "this member sees a leader": followers are ready too (a Kubernetes Service
/// sends clients to any of them; they name the leader), and a client given one member alone
/// follows the leader it names.
fn every_member_is_ready_and_names_the_leader(ports: &[u16]) {
    for port in ports {
        let address = format!("127.0.0.1:{port}");
        let ready = (0..100).any(|_| {
            let (code, _) = crate::common::http_request(&address, "GET", "/readyz", None, "");
            code == 200 || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                false
            }
        });
        assert!(ready, "member at {address} never ready");
        let (health, _) = crate::common::http_request(&address, "GET", "/healthz", None, "");
        assert_eq!(health, 200);
        let lock = format!("cluster/via-{port}");
        acquired_epoch(&lock, &format!("http://{address}"));
    }
}

/// Member `id`, restarted over `data` with a member list that names another port for the
/// member at `first_port`, refuses to start and says why.
fn a_disagreeing_member_list_is_refused(id: u64, cluster: &str, first_port: u16, data: &Path) {
    let wrong = cluster.replace(&format!(":{first_port}"), ":1");
    let refused = Command::new(BINARY)
        .args([
            "serve",
            "--node-id",
            &id.to_string(),
            "--cluster",
            &wrong,
            "--insecure-peers",
        ])
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("disagrees with the membership stored"),
        "{stderr}"
    );
}

/// Membership changes through the CLI: a node started with `--join` is added (caught up as a
/// learner, then a voter), shows in `cluster status`, and is removed again.
#[test]
fn cluster_add_and_remove_a_member() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let list = |n: usize| {
        (1..=n)
            .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let endpoints = ports[..3]
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let nodes: Vec<ServerProcess> = (1..=3u64)
        .map(|id| start(id, &list(3), &dir.path().join(format!("n{id}"))))
        .collect();
    leader(&endpoints);
    let granted = json(&cli(
        &["lock", "acquire", "members/a", "--json"],
        &endpoints,
    ));

    // Before, `cluster add` of an address where nothing runs made it a voter at once, and
    // three of them wedged the cluster for good (every endpoint 503, DELETE included). Now
    // the node must say who it is first: nothing changes, and the cluster keeps serving.
    for attempt in 0..3 {
        let nobody = format!("127.0.0.1:{}", free_port());
        let refused = cli(&["cluster", "add", "5", &nobody], &endpoints);
        assert!(!refused.status.success(), "attempt {attempt}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("did not answer"), "{stderr}");
    }
    let (_, status) = leader(&endpoints);
    assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
    json(&cli(
        &["lock", "acquire", "members/b", "--json"],
        &endpoints,
    ));
    // The address of a running member is not node 5.
    let wrong = cli(
        &["cluster", "add", "5", &format!("127.0.0.1:{}", ports[1])],
        &endpoints,
    );
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("not 5"));

    // Node 4 joins: it waits, uninitialised, until the leader adds it.
    let mut joiner = Command::new(BINARY)
        .args(["serve", "--node-id", "4", "--cluster", &list(4), "--join"])
        .arg("--insecure-peers")
        .arg("--data-dir")
        .arg(dir.path().join("n4"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr4 = format!("127.0.0.1:{}", ports[3]);
    answers(&format!("http://{addr4}"));
    let added = cli(&["cluster", "add", "4", &addr4, "--json"], &endpoints);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let (_, status) = leader(&endpoints);
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{status}");
    let four = members.iter().find(|m| m["id"] == 4).unwrap();
    assert_eq!(four["kind"], "voter");
    // The new member applied the replicated state (it is caught up).
    assert!(four["last_applied"].as_u64().unwrap() > 0, "{status}");

    let removed = cli(&["cluster", "remove", "4", "--json"], &endpoints);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let (_, status) = leader(&endpoints);
    assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
    // Removing an unknown member is refused with a clear error.
    let unknown = cli(&["cluster", "remove", "9"], &endpoints);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not a member"));
    // The lease granted before the changes is still there (P8).
    let show = json(&cli(&["lock", "show", "members/a", "--json"], &endpoints));
    assert_eq!(show["epoch"], granted["epoch"]);

    joiner.kill().unwrap();
    joiner.wait().unwrap();
    drop(nodes); // kills the members
}

/// A corrupt cluster store stops the member at start, loudly, naming the file: it never serves
/// from partial state (P8).
#[test]
fn a_corrupt_cluster_store_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cluster.redb"),
        vec![0xa5; 64 * 1024], // not a redb file
    )
    .unwrap();
    let cluster = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}",
        free_port(),
        free_port(),
        free_port()
    );
    let stderr = refused_start(1, &cluster, dir.path());
    assert!(stderr.contains("cluster.redb"), "{stderr}");
}

/// A Raft log file that is not one (or is damaged) stops the member at start, naming the file
/// (P8): the log is never read short.
#[test]
fn a_damaged_raft_log_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.raftlog.0"), vec![0xa5; 4096]).unwrap();
    let stderr = refused_start(1, &format!("1=127.0.0.1:{}", free_port()), dir.path());
    assert!(
        stderr.contains("not a Palisade raft log") && stderr.contains("cluster.raftlog.0"),
        "{stderr}"
    );
}

/// P1, P8: a member whose data directory was lost and that restarts with the same flags is
/// refused by its peers (its store changed): with the other follower down, the leader and the
/// emptied member do **not** make a majority, so nothing is granted on an empty log. The way
/// back — `cluster remove`, restart with `--join`, `cluster add` — restores a full cluster that
/// still holds every acknowledged lease.
#[test]
fn a_member_that_lost_its_data_is_refused_until_added_back() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::three();
    let (ports, cluster, endpoints) = (&layout.ports, &layout.cluster, &layout.endpoints);
    let endpoint = |id: u64| layout.endpoint(id);
    let data = |id: u64| dir.path().join(format!("n{id}"));
    let mut nodes: Vec<Option<ServerProcess>> = (1..=3u64)
        .map(|id| Some(start(id, cluster, &data(id))))
        .collect();
    let (leader_id, _) = leader(endpoints);
    let granted = json(&cli(
        &["lock", "acquire", "wiped/a", "--json", "--ttl", "60s"],
        endpoints,
    ));
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader_id).collect();
    let (wiped, other) = (followers[0], followers[1]);

    // The follower loses its data directory and comes back with the same flags.
    nodes[wiped as usize - 1].take().unwrap().kill9();
    std::fs::remove_dir_all(data(wiped)).unwrap();
    nodes[wiped as usize - 1] = Some(start(wiped, cluster, &data(wiped)));
    std::thread::sleep(std::time::Duration::from_millis(500));
    // `cluster status` says so, with no lag (the leader's progress for it is from before).
    let (_, status) = leader(endpoints);
    let shown = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == wiped)
        .cloned()
        .unwrap();
    assert!(
        shown["role"]
            .as_str()
            .unwrap()
            .starts_with("refused: lost its data"),
        "{status}"
    );
    assert!(shown["lag"].is_null(), "{status}");
    // The other follower stops: the leader and the emptied member alone must not commit.
    nodes[other as usize - 1].take().unwrap().kill9();
    let refused = cli(
        &["lock", "acquire", "wiped/b", "--json"],
        &endpoint(leader_id),
    );
    assert!(
        !refused.status.success(),
        "granted with the emptied member counted in the majority: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    // The other follower is back: a majority again.
    nodes[other as usize - 1] = Some(start(other, cluster, &data(other)));
    leader(endpoints);

    // The way back: remove it, restart it empty with --join, add it.
    let removed = cli(&["cluster", "remove", &wiped.to_string()], endpoints);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    nodes[wiped as usize - 1].take().unwrap().kill9();
    std::fs::remove_dir_all(data(wiped)).unwrap();
    let joiner = ServerProcess::start_with(
        &[
            "serve",
            "--node-id",
            &wiped.to_string(),
            "--cluster",
            cluster,
            "--join",
            "--insecure-peers",
        ],
        &data(wiped),
    );
    nodes[wiped as usize - 1] = Some(joiner);
    let addr = format!("127.0.0.1:{}", ports[wiped as usize - 1]);
    let added = cli(&["cluster", "add", &wiped.to_string(), &addr], endpoints);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let (_, status) = leader(endpoints);
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{status}");
    assert!(members.iter().all(|m| m["kind"] == "voter"), "{status}");
    // Every acknowledged lease is still there (P8), and new epochs are higher (P1).
    let show = json(&cli(&["lock", "show", "wiped/a", "--json"], endpoints));
    assert_eq!(show["epoch"], granted["epoch"]);
    let next = json(&cli(&["lock", "acquire", "wiped/c", "--json"], endpoints));
    assert!(
        palisade_core::json::read(&next["epoch"]) > palisade_core::json::read(&granted["epoch"])
    );
    drop(nodes);
}

/// Starts member `id` expecting it to refuse (within 20 s); its message.
fn refused_start(id: u64, cluster: &str, dir: &Path) -> String {
    let mut child = Command::new(BINARY)
        .args(["serve", "--node-id", &id.to_string(), "--cluster", cluster])
        .arg("--insecure-peers")
        .arg("--data-dir")
        .arg(dir)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "member {id} exited successfully");
            let mut message = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut message).unwrap();
            return message;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    panic!(
        "member {id} started from {} instead of refusing",
        dir.display()
    );
}

/// P6, P8: a member whose data directory is copied back from an older copy (`cp -a`) refuses
/// to start, naming the ways back — one member (it would forget acknowledged entries and votes
/// and could help lose grants) or every member from the same copy. The way back for the
/// latter: an offline backup of a copy, `palisade restore --cluster` into a new directory,
/// which founds a new cluster alone and issues above every epoch issued before; the others
/// join it empty.
///
/// Before: the copied-back members started and served, and the cluster issued epochs it had
/// issued before the copy-back.
#[test]
fn p6_p8_members_copied_back_refuse_to_start_and_a_restored_cluster_issues_above_all() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::three();
    let (cluster, endpoints) = (&layout.cluster, &layout.endpoints);
    let data = |id: u64| dir.path().join(format!("n{id}"));
    let copy = |id: u64| dir.path().join(format!("copy-n{id}"));
    let acquire = |lock: &str| acquired_epoch(lock, endpoints);
    let mut issued = Vec::new();
    let mut nodes: Vec<ServerProcess> = (1..=3).map(|id| start(id, cluster, &data(id))).collect();
    leader(endpoints);
    issued.push(acquire("copied/a"));
    an_online_backup_holds_the_counter(dir.path(), endpoints, issued.last().copied());
    for node in &mut nodes {
        assert!(node.terminate().success());
    }
    for id in 1..=3 {
        cp_a(&data(id), &copy(id)); // the operator's "backup" of every member
    }
    let mut nodes: Vec<ServerProcess> = (1..=3).map(|id| start(id, cluster, &data(id))).collect();
    leader(endpoints);
    for n in 0..5 {
        issued.push(acquire(&format!("copied/b{n}")));
    }
    // Every member applies the last grant before it stops (a clean stop records it).
    std::thread::sleep(std::time::Duration::from_millis(500));
    for node in &mut nodes {
        assert!(node.terminate().success());
    }

    copied_back_members_refuse_to_start(cluster, &data, &copy);
    let (restored, record) = restore_a_founder_from_an_offline_backup(dir.path(), &data(1));
    // Started with the old three-member list, it refuses: it must found alone.
    let message = refused_start(1, cluster, &restored);
    assert!(
        message.contains("founds the new cluster alone"),
        "{message}"
    );
    let alone = format!("1=127.0.0.1:{}", layout.ports[0]);
    let founder = start(1, &alone, &restored);
    let endpoint = layout.endpoint(1);
    leader(&endpoint);
    let next = json(&cli(&["lock", "acquire", "copied/a", "--json"], &endpoint))["epoch"]
        .as_str()
        .and_then(|e| e.parse::<u64>().ok())
        .unwrap();
    let highest = *issued.iter().max().unwrap();
    assert!(next > highest, "epoch {next} is not above {highest}");
    assert!(next > palisade_core::json::read(&record["counter"]).unwrap());
    // A second member joins it empty and learns the counter.
    let after = a_member_joins_the_founder(&layout, &dir.path().join("r2"), &alone);
    assert!(after > next);
    drop(founder);
}

/// An online backup asks the members in turn; the leader answers with the replicated counter,
/// `last` (the last epoch issued).
fn an_online_backup_holds_the_counter(dir: &Path, endpoints: &str, last: Option<u64>) {
    let online = dir.join("online.backup");
    let out = cli(
        &["backup", "--json", "--out", online.to_str().unwrap()],
        endpoints,
    );
    let taken = json(&out);
    assert_eq!(taken["mode"], "cluster", "{taken}");
    assert_eq!(palisade_core::json::read(&taken["last_epoch"]), last);
}

/// One member copied back from `copy` refuses to start, naming the way back; then every member
/// copied back from the same copy refuses.
fn copied_back_members_refuse_to_start(
    cluster: &str,
    data: &dyn Fn(u64) -> PathBuf,
    copy: &dyn Fn(u64) -> PathBuf,
) {
    std::fs::remove_dir_all(data(3)).unwrap();
    cp_a(&copy(3), &data(3));
    let message = refused_start(3, cluster, &data(3));
    assert!(message.contains("older copy"), "{message}");
    assert!(message.contains("cluster remove 3"), "{message}");
    for id in 1..=2 {
        std::fs::remove_dir_all(data(id)).unwrap();
        cp_a(&copy(id), &data(id));
    }
    for id in 1..=3 {
        let message = refused_start(id, cluster, &data(id));
        assert!(message.contains("palisade restore --cluster"), "{message}");
    }
}

/// The way back: an offline backup of the member at `member`, restored as the founder of a
/// new cluster into `DIR/r1`. Returns that directory and the restore's record.
fn restore_a_founder_from_an_offline_backup(dir: &Path, member: &Path) -> (PathBuf, Value) {
    let backup = dir.join("cluster.backup");
    let out = Command::new(BINARY)
        .args(["backup", "--json", "--out"])
        .arg(&backup)
        .arg("--data-dir")
        .arg(member)
        .output()
        .unwrap();
    let taken = json(&out);
    assert_eq!(taken["mode"], "cluster");
    let restored = dir.join("r1");
    let out = Command::new(BINARY)
        .args(["restore", "--cluster", "--json", "--from"])
        .arg(&backup)
        .arg("--data-dir")
        .arg(&restored)
        .output()
        .unwrap();
    let record = json(&out);
    assert_eq!(record["target"], "cluster_founder");
    (restored, record)
}

/// Member 2 starts empty over `data` with `--join`, the founder (`alone`) adds it, and an
/// acquire through both is granted. Returns the epoch granted.
fn a_member_joins_the_founder(layout: &Layout, data: &Path, alone: &str) -> u64 {
    let two = format!("{alone},2=127.0.0.1:{}", layout.ports[1]);
    let mut joiner = Command::new(BINARY)
        .args(["serve", "--node-id", "2", "--cluster", &two, "--join"])
        .arg("--insecure-peers")
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    answers(&layout.endpoint(2));
    let addr2 = format!("127.0.0.1:{}", layout.ports[1]);
    let endpoint = layout.endpoint(1);
    json(&cli(&["cluster", "add", "2", &addr2, "--json"], &endpoint));
    let both = format!("{endpoint},{}", layout.endpoint(2));
    let after = json(&cli(&["lock", "acquire", "copied/c", "--json"], &both))["epoch"]
        .as_str()
        .and_then(|e| e.parse::<u64>().ok())
        .unwrap();
    joiner.kill().unwrap();
    joiner.wait().unwrap();
    after
}

/// The key ids member `endpoint` publishes at `/v1/keys` (its own first).
fn published_keys(endpoint: &str) -> Vec<String> {
    let address = endpoint.trim_start_matches("http://");
    let (status, body) = common::http_request(address, "GET", "/v1/keys", None, "");
    assert_eq!(status, 200, "{body}");
    let keys: Value = serde_json::from_str(&body).unwrap();
    keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key_id"].as_str().unwrap().to_owned())
        .collect()
}

/// P4: a signing key leaves the replicated list for good (`palisade cluster retire-key`), and a
/// resource that trusts the coordinator drops it on its next refresh: a token it signed is
/// refused even though its epoch is the newest. Refused while the key's member leads or is a
/// member. Before, every key that ever led stayed published for ever.
#[test]
fn p4_a_removed_members_key_is_retired_and_resources_drop_it() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::three();
    let (cluster, endpoints) = (&layout.cluster, &layout.endpoints);
    let mut nodes: Vec<Option<ServerProcess>> = (1..=3u64)
        .map(|id| Some(start(id, cluster, &dir.path().join(format!("n{id}")))))
        .collect();
    let (leader_id, _) = leader(endpoints);
    let follower = (1..=3).find(|id| *id != leader_id).unwrap();
    let grant = json(&cli(
        &["lock", "acquire", "keys/a", "--json", "--ttl", "60s"],
        endpoints,
    ));
    let token = grant["token"].as_str().unwrap().to_owned();
    let leader_key = published_keys(&layout.endpoint(leader_id))[0].clone();
    assert!(published_keys(&layout.endpoint(follower)).contains(&leader_key));
    let store = ResourceProcess::start_with(
        &dir.path().join("store"),
        "strict",
        &layout.endpoint(follower),
        &["--key-refresh", "1"],
    );
    let put = |key: &str| store.cli(&["put", "keys/a", key, "v", "--token", &token]);
    assert!(put("k1").status.success());

    let retire = || cli(&["cluster", "retire-key", &leader_key, "--json"], endpoints);
    let refused = retire();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("own signing key"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    nodes[leader_id as usize - 1].take().unwrap().kill9();
    leader(endpoints);
    let refused = retire();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains(&format!("belongs to member {leader_id}")),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    json(&cli(
        &["cluster", "remove", &leader_id.to_string(), "--json"],
        endpoints,
    ));
    let retired = json(&retire());
    assert_eq!(retired["retired"], leader_key.as_str());
    // The leader answers once the retirement is committed; the other member applies it when it
    // learns the commit index (its next append or heartbeat): wait for that, boundedly.
    for id in (1..=3).filter(|id| *id != leader_id) {
        let mut published = published_keys(&layout.endpoint(id));
        for _ in 0..50 {
            if !published.contains(&leader_key) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            published = published_keys(&layout.endpoint(id));
        }
        assert!(
            !published.contains(&leader_key),
            "member {id} still publishes the retired key {leader_key}: {published:?}"
        );
    }
    // The store drops the key on its next refresh (every second here); each attempt writes a
    // new key, so only the key's retirement can refuse it.
    let mut refused = put("k2-0");
    for attempt in 1..40 {
        if !refused.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        refused = put(&format!("k2-{attempt}"));
    }
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(5), "{message}");
    assert!(message.contains("invalid_token"), "{message}");
    drop(nodes);
}

/// P1, P6: every member's whole volume — data directory *and* witness beside it — put back
/// from a snapshot, as a VM or disk snapshot restore does. Nothing on the volumes can tell
/// what was issued after the snapshot; every leader's start floors the counter at its clock
/// (`palisade_core::clock`), so the cluster issues above every epoch acknowledged before.
/// Then one member put back again (with its witness) while another lags: the two form a
/// majority without the member that holds the latest history, and still issue above it.
///
/// Before: all three started and issued epochs 4, 5, 6 a second time; the second case
/// granted epochs 10–12 again.
#[test]
fn p1_p6_members_whole_volumes_put_back_never_issue_an_epoch_twice() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::three();
    let (cluster, endpoints) = (&layout.cluster, &layout.endpoints);
    let volume = |id: u64| dir.path().join(format!("volume{id}"));
    let snapshot = |id: u64| dir.path().join(format!("snapshot{id}"));
    let data = |id: u64| volume(id).join("data");
    let mut issued = Vec::new();
    for id in 1..=3 {
        std::fs::create_dir_all(volume(id)).unwrap();
    }
    let mut nodes: Vec<ServerProcess> = (1..=3).map(|id| start(id, cluster, &data(id))).collect();
    leader(endpoints);
    issued.push(acquired_epoch("volumes/a", endpoints));
    std::thread::sleep(std::time::Duration::from_millis(500));
    for node in &mut nodes {
        assert!(node.terminate().success());
    }
    for id in 1..=3 {
        cp_a(&volume(id), &snapshot(id));
        assert!(snapshot(id).join("data.witness").exists());
    }
    let mut nodes: Vec<ServerProcess> = (1..=3).map(|id| start(id, cluster, &data(id))).collect();
    leader(endpoints);
    for n in 0..3 {
        issued.push(acquired_epoch(&format!("volumes/b{n}"), endpoints));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    for node in &mut nodes {
        assert!(node.terminate().success());
    }
    // Every volume put back at once: the members start (their witnesses agree with them).
    for id in 1..=3 {
        std::fs::remove_dir_all(volume(id)).unwrap();
        cp_a(&snapshot(id), &volume(id));
    }
    let mut nodes: Vec<ServerProcess> = (1..=3).map(|id| start(id, cluster, &data(id))).collect();
    leader(endpoints);
    let highest = *issued.iter().max().unwrap();
    let next = acquired_epoch("volumes/c", endpoints);
    assert!(
        next > highest,
        "epoch {next} issued again or below {highest}"
    );
    issued.push(next);

    // Member 3 lags (down) while 1 and 2 grant; then 1 goes down for good, 2 is put back to
    // its snapshot (witness included), and 2 + 3 wait for 1 (their census needs it) until the
    // operator declares it lost (`palisade cluster lost 1`): then they form a majority
    // without 1's history, and epochs still only rise (the clock floor).
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(nodes[2].terminate().success());
    let two = format!("{},{}", layout.endpoint(1), layout.endpoint(2));
    leader(&two);
    for n in 0..3 {
        issued.push(acquired_epoch(&format!("volumes/d{n}"), &two));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(nodes[0].terminate().success());
    assert!(nodes[1].terminate().success());
    std::fs::remove_dir_all(volume(2)).unwrap();
    cp_a(&snapshot(2), &volume(2));
    let _two = start(2, cluster, &data(2));
    let _three = start(3, cluster, &data(3));
    let others = format!("{},{}", layout.endpoint(2), layout.endpoint(3));
    answers(&layout.endpoint(2));
    answers(&layout.endpoint(3));
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = json(&cli(&["cluster", "status", "--json"], &others));
    assert!(status["leader"].is_null(), "2 + 3 wait for 1: {status}");
    let told = json(&cli(&["cluster", "lost", "1", "--json"], &others));
    assert_eq!(told["members"].as_array().map(Vec::len), Some(2), "{told}");
    leader(&others);
    let highest = *issued.iter().max().unwrap();
    let next = acquired_epoch("volumes/e", &others);
    assert!(
        next > highest,
        "epoch {next} issued again or below {highest}"
    );
    issued.push(next);
    let mut sorted = issued.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, issued, "epochs strictly increase: {issued:?}");
}
