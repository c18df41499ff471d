//! One simulated run: the members, the clients, the fault schedule, and the checks.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(test)]
use palisade_cluster::membership::Changes;
use palisade_cluster::storage;
use palisade_cluster::{ClusterConfig, MemberStart, NodeId};
use palisade_coordinator::engine::CoordinatorError;
use palisade_coordinator::gateway::Gateway;
use palisade_coordinator::metrics::Metrics;
use palisade_core::{AcquireRequest, HolderId, Lease, LockClass, LockName, RequestId};
use palisade_history::{Entry, History, Op, Outcome};
use palisade_sim::SplitMix64;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::disk::Volume;
use crate::network::Router;
use crate::{ClusterFaults, ClusterSimConfig, Hold};

mod clock_faults;
mod copies;
mod faults;
pub(crate) mod liveness;
mod recovery;

pub use clock_faults::ClockFaults;

/// Lease TTL of the simulated clients, ms.
const TTL_MS: u64 = 400;
/// A client gives up on one answer after this long, ms.
const ANSWER_TIMEOUT_MS: u64 = 1_500;
/// Attempts of one acquire (the same request id) before the client gives up.
const ACQUIRE_ATTEMPTS: usize = 8;
/// How long after the last heal the cluster must serve again and converge, ms.
const RECOVERY_MS: u64 = 10_000;
/// Raft entries between snapshots in the simulation (5,000 in a server): crashed members
/// then catch up from snapshots too, not only from the log.
const SIM_SNAPSHOT_EVERY: u64 = 30;

/// With `torn_sectors`, how long a crash waits for the member's next Raft log write to land
/// in, ms: past it the power goes out between writes, as without the flag.
const TORN_WAIT_MS: u64 = 500;
/// Mixed into the seed for the generator of torn sectors.
const TEAR_STREAM: u64 = 0x746f_726e_5f73_6563;

/// Everything the tasks of a run share.
pub(crate) struct Shared {
    pub(crate) rng: Arc<Mutex<SplitMix64>>,
    origin: Instant,
    /// Gateways of the members that are up, with their incarnation.
    gateways: Mutex<BTreeMap<NodeId, (u64, Gateway)>>,
    ids: Vec<NodeId>,
    trace: Mutex<(u64, u64)>,
    pub(crate) log: Mutex<Vec<String>>,
    pub(crate) history: Mutex<History>,
    pub(crate) holds: Mutex<Vec<Hold>>,
    stop_clients: AtomicBool,
    /// When a client last had an acquire granted, ms (the liveness watchdog's evidence).
    last_grant_ms: AtomicU64,
}

impl Shared {
    pub(crate) fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn range(&self, low: u64, high: u64) -> u64 {
        self.rng.lock().expect("not poisoned").range(low, high)
    }

    fn chance(&self, percent: u64) -> bool {
        self.rng.lock().expect("not poisoned").chance(percent)
    }

    /// Adds an event to the trace hash (FNV-1a over its text and time).
    pub(crate) fn trace(&self, event: &str) {
        let line = format!("{} {event}", self.now_us());
        let mut trace = self.trace.lock().expect("not poisoned");
        for byte in line.bytes() {
            trace.0 ^= u64::from(byte);
            trace.0 = trace.0.wrapping_mul(0x0100_0000_01b3);
        }
        trace.1 += 1;
        self.log.lock().expect("not poisoned").push(line);
    }

    pub(crate) fn trace_hash(&self) -> (u64, u64) {
        *self.trace.lock().expect("not poisoned")
    }

    fn random_node(&self) -> NodeId {
        let i = self.range(0, self.ids.len() as u64) as usize;
        self.ids[i]
    }
}

/// How one request to a member ended, as a client sees it.
enum Answer<T> {
    Ok(T),
    /// Not applied: another node leads (maybe named).
    NotLeader(Option<NodeId>),
    /// Refused by the lease table (held, unknown lease): not applied.
    Refused,
    /// No answer, or "outcome unknown": it may or may not have been applied.
    Unknown,
}

/// Sends one request to `node`'s gateway. The answer is lost if the member is down, crashes
/// (a new incarnation) before answering, or does not answer within [`ANSWER_TIMEOUT_MS`].
async fn call<T, F, Fut>(shared: &Shared, node: NodeId, request: F) -> Answer<T>
where
    F: FnOnce(Gateway) -> Fut,
    Fut: std::future::Future<Output = Result<T, CoordinatorError>>,
{
    let Some((incarnation, gateway)) = shared
        .gateways
        .lock()
        .expect("not poisoned")
        .get(&node)
        .cloned()
    else {
        tokio::time::sleep(Duration::from_millis(shared.range(1, 20))).await;
        return Answer::Unknown;
    };
    tokio::time::sleep(Duration::from_millis(shared.range(0, 3))).await;
    let answer =
        tokio::time::timeout(Duration::from_millis(ANSWER_TIMEOUT_MS), request(gateway)).await;
    tokio::time::sleep(Duration::from_millis(shared.range(0, 3))).await;
    let alive = shared
        .gateways
        .lock()
        .expect("not poisoned")
        .get(&node)
        .is_some_and(|(current, _)| *current == incarnation);
    match answer {
        _ if !alive => Answer::Unknown,
        Err(_) => Answer::Unknown,
        Ok(Ok(value)) => Answer::Ok(value),
        Ok(Err(CoordinatorError::NotLeader { leader })) => {
            Answer::NotLeader(leader.map(|hint| hint.id))
        }
        Ok(Err(CoordinatorError::Lease(_))) => Answer::Refused,
        Ok(Err(_)) => Answer::Unknown,
    }
}

/// One simulated client: acquire (retrying with its request id), hold with renewals — or pause
/// past its TTL — and release.
pub(crate) async fn client(shared: Arc<Shared>, index: usize, locks: usize) {
    let holder = HolderId::new(format!("c{index}")).expect("valid holder");
    let mut believed_leader: Option<NodeId> = None;
    let mut round = 0u64;
    while !shared.stop_clients.load(Ordering::Relaxed) {
        round += 1;
        let lock_index = shared.range(0, locks as u64);
        let lock = LockName::new(format!("sim/{lock_index}")).expect("valid lock");
        let request = AcquireRequest {
            lock: lock.clone(),
            holder: holder.clone(),
            principal: palisade_core::Principal::anonymous(),
            ttl_ms: TTL_MS,
            wait_ms: 0,
            class: LockClass::Critical,
            request_id: Some(RequestId::new(format!("c{index}-{round}")).expect("valid id")),
        };
        let invoked = shared.now_us();
        let Attempts {
            granted,
            ambiguous,
            last_sent_ms: attempt_sent_ms,
        } = acquire_with_retries(&shared, &mut believed_leader, &request).await;
        let completed = shared.now_us();
        let outcome = match &granted {
            Some(lease) => Outcome::Granted {
                epoch: lease.epoch.0,
            },
            None if ambiguous => Outcome::Unknown,
            None => {
                tokio::time::sleep(Duration::from_millis(shared.range(10, 80))).await;
                continue;
            }
        };
        shared.trace(&format!("c{index} acquire {lock} -> {outcome:?}"));
        shared.history.lock().expect("not poisoned").push(Entry {
            process: holder.to_string(),
            lock: lock.to_string(),
            op: Op::Acquire,
            invoked,
            completed,
            outcome,
        });
        let Some(lease) = granted else { continue };
        shared
            .last_grant_ms
            .store(shared.now_ms(), Ordering::Relaxed);
        // The lease is valid, as the Rust client counts, TTL after the attempt that was
        // answered was sent — for a retry with the same request id too, which the
        // coordinator must honour by renewing the lease (P8).
        let held_from = shared.now_ms();
        let valid_until = attempt_sent_ms + TTL_MS;
        let end = hold(&shared, &mut believed_leader, &lease, valid_until).await;
        shared.holds.lock().expect("not poisoned").push(Hold {
            lock: lock.to_string(),
            epoch: lease.epoch.0,
            holder: holder.to_string(),
            from_ms: held_from,
            until_ms: end.until_ms,
        });
        shared.trace(&format!(
            "c{index} held {lock}@{} until {} ({})",
            lease.epoch, end.until_ms, end.why
        ));
        if end.release {
            release_with_retries(&shared, &mut believed_leader, lease.id).await;
        }
        tokio::time::sleep(Duration::from_millis(shared.range(0, 60))).await;
    }
}

/// What a client's attempts at one acquire came to.
struct Attempts {
    granted: Option<Lease>,
    /// An attempt's answer was lost: the grant may have happened.
    ambiguous: bool,
    /// When the last attempt was sent (the answered one, when granted), ms.
    last_sent_ms: u64,
}

/// Sends one acquire (one request id) to the believed leader, following hints, up to
/// `ACQUIRE_ATTEMPTS` times.
async fn acquire_with_retries(
    shared: &Shared,
    believed_leader: &mut Option<NodeId>,
    request: &AcquireRequest,
) -> Attempts {
    let mut attempts = Attempts {
        granted: None,
        ambiguous: false,
        last_sent_ms: shared.now_ms(),
    };
    for _ in 0..ACQUIRE_ATTEMPTS {
        let node = believed_leader.unwrap_or_else(|| shared.random_node());
        let request = request.clone();
        attempts.last_sent_ms = shared.now_ms();
        match call(shared, node, |g| async move { g.acquire(request).await }).await {
            Answer::Ok(lease) => {
                *believed_leader = Some(node);
                attempts.granted = Some(lease);
                break;
            }
            Answer::Refused => break,
            Answer::NotLeader(hint) => {
                *believed_leader = hint;
                if hint.is_none() {
                    tokio::time::sleep(Duration::from_millis(shared.range(20, 120))).await;
                }
            }
            Answer::Unknown => {
                attempts.ambiguous = true;
                *believed_leader = None;
                tokio::time::sleep(Duration::from_millis(shared.range(20, 120))).await;
            }
        }
    }
    attempts
}

/// Releases a lease, following hints, at most three attempts.
async fn release_with_retries(
    shared: &Shared,
    believed_leader: &mut Option<NodeId>,
    id: palisade_core::LeaseId,
) {
    for _ in 0..3 {
        let node = believed_leader.unwrap_or_else(|| shared.random_node());
        match call(shared, node, |g| async move { g.release(id, None).await }).await {
            Answer::Ok(_) | Answer::Refused => break,
            Answer::NotLeader(hint) => *believed_leader = hint,
            Answer::Unknown => *believed_leader = None,
        }
    }
}

struct HoldEnd {
    until_ms: u64,
    why: &'static str,
    release: bool,
}

/// Holds `lease` for a random time, renewing every third of its TTL, until the time is up,
/// the client pauses past its TTL, or a renewal cannot be confirmed before the lease lapses.
async fn hold(
    shared: &Shared,
    believed_leader: &mut Option<NodeId>,
    lease: &Lease,
    mut valid_until: u64,
) -> HoldEnd {
    let hold_for = shared.range(0, 1_000);
    let pause = shared.chance(12).then(|| shared.range(0, hold_for.max(1)));
    let start = shared.now_ms();
    let mut paused = false;
    loop {
        let now = shared.now_ms();
        if now >= valid_until {
            return HoldEnd {
                until_ms: valid_until,
                why: if paused {
                    "paused past its TTL"
                } else {
                    "renewal not confirmed in time"
                },
                release: false,
            };
        }
        if now >= start + hold_for {
            return HoldEnd {
                until_ms: now,
                why: "done",
                release: true,
            };
        }
        if let Some(at) = pause {
            if !paused && now >= start + at {
                paused = true;
                let long = shared.range(TTL_MS, TTL_MS * 3);
                tokio::time::sleep(Duration::from_millis(long)).await;
                continue;
            }
        }
        tokio::time::sleep(Duration::from_millis(TTL_MS / 3)).await;
        let sent = shared.now_ms();
        if sent >= valid_until {
            continue;
        }
        let node = believed_leader.unwrap_or_else(|| shared.random_node());
        let id = lease.id;
        match call(shared, node, |g| async move { g.renew(id, None).await }).await {
            Answer::Ok(renewed) => {
                debug_assert_eq!(renewed.epoch, lease.epoch);
                valid_until = sent + TTL_MS;
                *believed_leader = Some(node);
            }
            Answer::Refused => {
                return HoldEnd {
                    until_ms: shared.now_ms().min(valid_until),
                    why: "renewal refused",
                    release: false,
                }
            }
            Answer::NotLeader(hint) => *believed_leader = hint,
            Answer::Unknown => *believed_leader = None,
        }
    }
}

/// A member as the fault driver manages it.
struct Member {
    id: NodeId,
    disk: Volume,
    signer: palisade_core::TokenSigner,
    running: Option<Running>,
    /// A copy of its disk taken while it was down (`cp -a`), to be put back later.
    copy: Option<Volume>,
    /// Its witness when `copy` was taken (put back with it when whole volumes roll back).
    copy_witness: Option<palisade_core::witness::WitnessRecord>,
    /// Its witness beside the data directory: store id and applied index
    /// (`palisade_cluster::witness` keeps it in a file; here in memory).
    witness: Option<palisade_core::witness::WitnessRecord>,
    /// A `--copy-anytime` copy of its whole volume, to be put back at a later crash.
    anytime: Option<copies::AnytimeCopy>,
    /// Its last start was with `--join`.
    joined: bool,
    /// Put back to an older volume (or wiped): the greatest log index a running member held
    /// then, which it may lack; `None` once it holds that much again (see `copies.rs`).
    behind: Option<u64>,
    /// Its wall clock: the simulation's time from `wall_clock_origin_ms`, off by a skew of
    /// up to [`MAX_CLOCK_SKEW_MS`] drawn from the seed (the members of a real cluster never
    /// agree exactly). It goes on through crashes, like a machine's.
    clock: Arc<palisade_coordinator::engine::SteppableClock>,
}

/// The greatest skew between a member's clock and the simulation's time.
const MAX_CLOCK_SKEW_MS: u64 = 20;

/// Member `id`'s wall clock: skewed by a draw from a generator of its own (so the run's other
/// draws stay as they were), or frozen.
fn member_clock(
    seed: u64,
    id: NodeId,
    sim: &ClusterSimConfig,
) -> Arc<palisade_coordinator::engine::SteppableClock> {
    if sim.frozen_clocks {
        let clock =
            palisade_coordinator::engine::SteppableClock::starting_at(sim.wall_clock_origin_ms);
        // Stepped back further than any run lasts: it reads its origin (saturating) throughout.
        clock.step(-(1 << 40));
        return Arc::new(clock);
    }
    let skew_ms = SplitMix64::new(seed ^ id).range(0, MAX_CLOCK_SKEW_MS + 1);
    Arc::new(palisade_coordinator::engine::SteppableClock::starting_at(
        sim.wall_clock_origin_ms + skew_ms,
    ))
}

struct Running {
    member: palisade_cluster::Member,
    shutdown: watch::Sender<bool>,
}

impl Running {
    /// Stops its supervisor (and engine) and Raft, and waits for them.
    async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.member.raft.shutdown().await;
        let _ = self.member.supervisor.await;
    }
}

/// The fault driver and the members: starts them, partitions, crashes and restarts them.
pub(crate) struct Cluster {
    pub(crate) shared: Arc<Shared>,
    router: Router,
    config: ClusterConfig,
    members: Vec<Member>,
    incarnations: u64,
    pub(crate) faults: ClusterFaults,
    /// For each crash of the serving leader: ms until another member served.
    pub(crate) failovers_ms: Vec<u64>,
    wipe_on_crash: bool,
    join_members: bool,
    copy_back_on_crash: bool,
    rollback_volumes: bool,
    plant_no_witness: bool,
    /// Crashes land inside a Raft log write and keep a random subset of its sectors.
    torn_sectors: bool,
    /// Draws which sectors a torn write keeps (apart from the run's generator, so that its
    /// other draws stay as they were).
    tear_rng: SplitMix64,
    copy_anytime: bool,
    /// Some of the network faults are clock faults instead (`--clock-faults`).
    clock_faults: bool,
    /// Every member has been started once (the cluster is formed).
    formed: bool,
}

impl Cluster {
    pub(crate) fn new(seed: u64, sim: &ClusterSimConfig) -> Self {
        let rng = Arc::new(Mutex::new(SplitMix64::new(seed)));
        let ids: Vec<NodeId> = (1..=sim.members as NodeId).collect();
        let config = ClusterConfig {
            node_id: 1,
            members: ids
                .iter()
                .map(|id| (*id, format!("127.0.0.1:{}", 7000 + id)))
                .collect(),
            join: false,
            client_tls: false,
            max_clock_offset_ms: palisade_cluster::clock_check::DEFAULT_MAX_CLOCK_OFFSET_MS,
        };
        let shared = Arc::new(Shared {
            rng: rng.clone(),
            origin: Instant::now(),
            gateways: Mutex::default(),
            ids: ids.clone(),
            trace: Mutex::new((0xcbf2_9ce4_8422_2325, 0)),
            log: Mutex::default(),
            history: Mutex::default(),
            holds: Mutex::default(),
            stop_clients: AtomicBool::new(false),
            last_grant_ms: AtomicU64::new(0),
        });
        let members: Vec<Member> = ids
            .iter()
            .map(|id| Member {
                id: *id,
                disk: if sim.plant_lying_fsync {
                    Volume::lying()
                } else {
                    Volume::default()
                },
                signer: palisade_core::TokenSigner::from_secret_bytes(&[*id as u8; 32]),
                running: None,
                copy: None,
                copy_witness: None,
                witness: None,
                anytime: None,
                joined: false,
                behind: None,
                // Drawn from a generator of its own, so the run's other draws stay as they were.
                clock: member_clock(seed, *id, sim),
            })
            .collect();
        let router = Router::new(rng);
        for member in &members {
            router.clock(member.id, member.clock.clone());
        }
        Self {
            shared,
            router,
            config,
            members,
            incarnations: 0,
            faults: ClusterFaults::default(),
            failovers_ms: Vec::new(),
            wipe_on_crash: sim.wipe_on_crash,
            join_members: sim.join_members,
            copy_back_on_crash: sim.copy_back_on_crash,
            rollback_volumes: sim.rollback_volumes,
            plant_no_witness: sim.plant_no_witness,
            torn_sectors: sim.torn_sectors,
            tear_rng: SplitMix64::new(seed ^ TEAR_STREAM),
            copy_anytime: sim.copy_anytime,
            clock_faults: sim.clock_faults,
            formed: false,
        }
    }

    /// The network, for the liveness watchdog.
    pub(crate) fn router(&self) -> Router {
        self.router.clone()
    }

    pub(crate) fn stop_clients(&self) {
        self.shared.stop_clients.store(true, Ordering::Relaxed);
    }

    pub(crate) fn ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// Starts every member: all founding members at once, or (`join_members`) member 1 alone
    /// and then every other with `--join` and `cluster add`, one at a time.
    pub(crate) async fn form(&mut self) -> Result<(), String> {
        if self.join_members {
            self.start(1).await?;
            for id in self.ids().into_iter().filter(|id| *id != 1) {
                self.start_as(id, true).await?;
                self.maybe_copy(id);
                self.add(id).await?;
                self.shared.trace(&format!("added {id}"));
            }
        } else {
            for id in self.ids() {
                self.start(id).await?;
                self.maybe_copy(id);
            }
        }
        self.copy_during_founding().await;
        self.formed = true;
        Ok(())
    }

    pub(crate) async fn start(&mut self, id: NodeId) -> Result<(), String> {
        self.start_as(id, false).await.map(drop)
    }

    /// Starts `id`; with `join`, as `palisade serve --join` (wait to be added). False when its
    /// witness refused the start: its disk is an older copy of its store.
    async fn start_as(&mut self, id: NodeId, join: bool) -> Result<bool, String> {
        let index = self.index(id);
        if self.members[index].running.is_some() {
            return Ok(true);
        }
        let mut config = self.config.clone();
        config.node_id = id;
        config.join = join;
        if self.join_members && !self.formed && id == 1 {
            // Founded alone; later starts name every member, as its stored membership does.
            config.members.retain(|member, _| *member == 1);
        }
        let mut raft_config = palisade_cluster::raft_config();
        raft_config.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(SIM_SNAPSHOT_EVERY);
        raft_config.max_in_snapshot_log_to_keep = 5;
        let (shutdown, shutdown_signal) = watch::channel(false);
        self.members[index].joined = join;
        let member = &self.members[index];
        let (store, logs) = member.disk.open();
        let stores = storage::open_backend(store, logs).map_err(|e| e.to_string())?;
        if self.witness_refuses(id, &stores.1) {
            return Ok(false);
        }
        let started = MemberStart {
            config: &config,
            raft_config,
            stores,
            store_name: format!("the disk of node {id}"),
            signer: &member.signer,
            metrics: Arc::new(Metrics::new()),
            shutdown: shutdown_signal,
            introducer: Arc::new(self.router.introducer(id)),
            floor: palisade_core::Epoch(0),
            clock: member.clock.clone(),
            refusals: None,
        }
        .run(self.router.endpoint(id))
        .await
        .map_err(|e| format!("node {id} did not start: {e}"))?;
        self.router
            .up(id, started.raft.clone(), started.identity.clone());
        self.incarnations += 1;
        self.shared
            .gateways
            .lock()
            .expect("not poisoned")
            .insert(id, (self.incarnations, started.gateway.clone()));
        self.members[index].running = Some(Running {
            member: started,
            shutdown,
        });
        self.shared.trace(&format!("start {id}"));
        Ok(true)
    }

    /// Whether `id`'s witness refuses the store it is starting from: applied less than the
    /// witness saw, an older copy (unless the run plants a member without a witness).
    fn witness_refuses(&self, id: NodeId, sm: &storage::StateMachine) -> bool {
        let current = palisade_core::witness::WitnessRecord {
            kind: "member".into(),
            store: sm.identity().store().to_owned(),
            mark: sm
                .shared()
                .lock()
                .expect("not poisoned")
                .header
                .last_applied
                .map_or(0, |l| l.index),
        };
        let member = &self.members[self.index(id)];
        if let palisade_core::witness::Verdict::Behind { seen } =
            palisade_core::witness::judge(member.witness.as_ref(), &current)
        {
            if !self.plant_no_witness {
                self.shared.trace(&format!(
                    "{id} refused: applied {} < {seen} (an older copy)",
                    current.mark
                ));
                return true;
            }
        }
        false
    }

    /// kill -9 and a power cut: unsynced writes are lost, nothing more is sent or answered.
    pub(crate) async fn crash(&mut self, id: NodeId) {
        if self.torn_sectors && self.members[self.index(id)].running.is_some() {
            self.cut_in_a_write(id).await;
        }
        let Some(running) = self.take_down(id) else {
            return;
        };
        // Its witness saw what it durably applied (an apply is made durable by the store's
        // next immediate commit; the real witness may lag even that, which only weakens it).
        let applied = *running.member.durable_applied.borrow();
        let seen = palisade_core::witness::WitnessRecord {
            kind: "member".into(),
            store: running.member.identity.store().to_owned(),
            mark: applied.map_or(0, |l| l.index),
        };
        let index = self.index(id);
        let keep = self.members[index]
            .witness
            .as_ref()
            .is_some_and(|w| w.store == seen.store && w.mark > seen.mark);
        if !keep {
            self.members[index].witness = Some(seen);
        }
        // Every third crash cuts an append midway: the log files end in part of a record
        // that was never acknowledged (drawn from the crash count, not the seed's generator,
        // so that the seed's other draws stay as they were).
        let crashes = self.faults.crashes;
        // Its header claims a 40-byte payload: cut short, or whole with a payload that never
        // reached the disk (its checksum does not match).
        let torn = (crashes % 3 == 1).then(|| {
            let mut bytes = 40u32.to_le_bytes().to_vec();
            bytes.extend_from_slice(&(crashes + 1).to_le_bytes());
            bytes.extend_from_slice(&[0xAB; 48]);
            bytes.truncate(1 + (crashes as usize * 7) % 60);
            bytes
        });
        let tear = self.members[self.index(id)]
            .disk
            .crash(torn, &mut self.tear_rng);
        running.stop().await;
        self.faults.crashes += 1;
        if let Some(tear) = tear {
            self.faults.torn_sector_crashes += 1;
            self.faults.torn_sectors_out_of_order += u64::from(tear.out_of_order);
            self.shared.trace(&format!(
                "crash {id} in a raft log write: kept {} of its {} sectors",
                tear.kept, tear.sectors
            ));
        }
        self.shared.trace(&format!("crash {id}"));
    }

    /// Lets `id` run until its next Raft log write, in which the power goes out (at most
    /// [`TORN_WAIT_MS`]).
    async fn cut_in_a_write(&mut self, id: NodeId) {
        let disk = self.members[self.index(id)].disk.clone();
        disk.arm_cut();
        let until = self.shared.now_ms() + TORN_WAIT_MS;
        while !disk.cut_landed() && self.shared.now_ms() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn index(&self, id: NodeId) -> usize {
        self.members
            .iter()
            .position(|m| m.id == id)
            .expect("a member")
    }

    /// Cuts every link between members.
    #[cfg(test)]
    pub(crate) fn isolate_all(&self) {
        let ids = self.ids();
        for id in &ids {
            self.router.isolate(&[*id], &ids);
        }
    }

    /// Cuts every link between `id` and the other members.
    #[cfg(test)]
    pub(crate) fn isolate_member(&self, id: NodeId) {
        self.router.isolate(&[id], &self.ids());
    }

    /// Cuts the links between `a` and `b` (both ways), and only those.
    #[cfg(test)]
    pub(crate) fn cut_between(&self, a: NodeId, b: NodeId) {
        self.router.isolate(&[a], &[a, b]);
    }

    /// The link from `from` to `to` carries everything but a leader's entries.
    #[cfg(test)]
    pub(crate) fn hold_entries(&self, from: NodeId, to: NodeId) {
        self.router.hold_entries(from, to);
    }

    /// Restores every link.
    #[cfg(test)]
    pub(crate) fn heal_all(&self) {
        self.heal();
    }

    /// The running member `id`'s membership changes and Raft node.
    #[cfg(test)]
    pub(crate) fn member(&self, id: NodeId) -> Option<(Arc<Changes>, palisade_cluster::RaftNode)> {
        let running = self.members[self.index(id)].running.as_ref()?;
        Some((running.member.changes.clone(), running.member.raft.clone()))
    }

    /// The engine's store of cluster mode over member `id`'s Raft and applied state.
    #[cfg(test)]
    pub(crate) fn lease_store(&self, id: NodeId) -> Option<palisade_cluster::RaftLeaseStore> {
        let running = self.members[self.index(id)].running.as_ref()?;
        Some(palisade_cluster::RaftLeaseStore::new(
            running.member.raft.clone(),
            running.member.state.clone(),
        ))
    }

    /// Every member loses power at once, then starts again.
    #[cfg(test)]
    pub(crate) async fn power_cut(&mut self) -> Result<(), String> {
        for id in self.ids() {
            self.crash(id).await;
        }
        for id in self.ids() {
            self.start(id).await?;
        }
        Ok(())
    }

    /// Wipes `id` and brings it back the documented way (remove, `--join`, add).
    #[cfg(test)]
    pub(crate) async fn wipe_and_readd(&mut self, id: NodeId) -> Result<(), String> {
        self.readd(id).await
    }

    /// A snapshot of `id`'s whole volume — its disk and the witness beside it — as a VM or
    /// disk snapshot takes it (`id` should be down).
    #[cfg(test)]
    pub(crate) fn snapshot_volume(
        &self,
        id: NodeId,
    ) -> (Volume, Option<palisade_core::witness::WitnessRecord>) {
        let member = &self.members[self.index(id)];
        (member.disk.copy(), member.witness.clone())
    }

    /// Puts `id`'s whole volume back from `snapshot` (`id` should be down): nothing on it
    /// can tell what it forgot.
    #[cfg(test)]
    pub(crate) fn put_back_volume(
        &mut self,
        id: NodeId,
        snapshot: (Volume, Option<palisade_core::witness::WitnessRecord>),
    ) {
        let index = self.index(id);
        self.members[index].disk = snapshot.0;
        self.members[index].witness = snapshot.1;
        self.shared.trace(&format!("put back the volume of {id}"));
    }

    /// `palisade cluster lost LOST` on running member `on`: whether it was on probation.
    #[cfg(test)]
    pub(crate) fn declare_lost(&self, on: NodeId, lost: NodeId) -> bool {
        let running = self.members[self.index(on)].running.as_ref();
        running.is_some_and(|r| r.member.identity.declare_lost(lost))
    }

    /// True while `id` runs and its Raft has not stopped (a fatal storage error stops it).
    #[cfg(test)]
    pub(crate) fn raft_runs(&self, id: NodeId) -> bool {
        self.members[self.index(id)]
            .running
            .as_ref()
            .is_some_and(|r| r.member.raft.metrics().borrow().running_state.is_ok())
    }

    /// Why `id`'s Raft stopped, if it did.
    #[cfg(test)]
    pub(crate) fn raft_error(&self, id: NodeId) -> Option<String> {
        let running = self.members[self.index(id)].running.as_ref()?;
        let state = running.member.raft.metrics().borrow().running_state.clone();
        state.err().map(|fatal| fatal.to_string())
    }

    /// The disk of `id` fills up.
    #[cfg(test)]
    pub(crate) fn fill_disk(&self, id: NodeId) {
        self.members[self.index(id)].disk.fill();
    }

    /// The gateway of `id`, while it is up.
    #[cfg(test)]
    pub(crate) fn gateway(&self, id: NodeId) -> Option<Gateway> {
        let running = self.members[self.index(id)].running.as_ref()?;
        Some(running.member.gateway.clone())
    }

    /// How the supervisor of `id` ended, once it has (the member is then down).
    #[cfg(test)]
    pub(crate) async fn stopped(&mut self, id: NodeId) -> Option<Result<(), String>> {
        let index = self.index(id);
        if !self.members[index]
            .running
            .as_ref()?
            .member
            .supervisor
            .is_finished()
        {
            return None;
        }
        let running = self.take_down(id)?;
        Some(
            running
                .member
                .supervisor
                .await
                .expect("no panic")
                .map_err(|e| e.to_string()),
        )
    }

    /// The member that leads and serves now, if one does.
    pub(crate) fn serving_leader(&self) -> Option<NodeId> {
        self.members.iter().find_map(|m| {
            let running = m.running.as_ref()?;
            let metrics = running.member.raft.metrics().borrow().clone();
            (metrics.current_leader == Some(m.id) && running.member.gateway.not_serving().is_none())
                .then_some(m.id)
        })
    }

    /// Stops `id` without losing anything (as SIGTERM).
    async fn stop(&mut self, id: NodeId) {
        if let Some(running) = self.take_down(id) {
            running.stop().await;
        }
    }

    /// `id` no longer answers clients or Raft messages; its processes are still to stop.
    fn take_down(&mut self, id: NodeId) -> Option<Running> {
        let index = self.index(id);
        let running = self.members[index].running.take()?;
        self.shared
            .gateways
            .lock()
            .expect("not poisoned")
            .remove(&id);
        self.router.down(id);
        Some(running)
    }

    fn heal(&self) {
        self.router.heal();
        self.shared.trace("heal");
    }
}

/// Describes a hold for a violation message.
pub(crate) fn describe(hold: &Hold) -> String {
    let mut text = String::new();
    let _ = write!(
        text,
        "{} held {} at epoch {} from {} ms to {} ms",
        hold.holder, hold.lock, hold.epoch, hold.from_ms, hold.until_ms
    );
    text
}
