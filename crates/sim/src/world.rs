//! The simulated world: one coordinator, one fenced resource, a few clients, a network.

use std::collections::{BTreeMap, HashMap};

use palisade_core::{
    AcquireOutcome, AcquireRequest, Epoch, HolderId, Lease, LeaseId, LeaseTable, LockClass,
    LockName, Principal, TokenSigner, TokenVerifier,
};
use palisade_fence::conformance::alter_epoch;
use palisade_fence::rules;
use palisade_history::{check, Entry, History, Mode, Op, Outcome, TokenKind};

use crate::network::{Message, Network, Node};
use crate::rng::SplitMix64;
use crate::{Faults, SimConfig, SimReport};

/// A client's ownership of one lock, as the client believes it.
#[derive(Debug, Clone)]
struct Ownership {
    lock: usize,
    epoch: Epoch,
    lease: LeaseId,
    token: String,
    activated: bool,
    /// Writes without activating (its activation was lost, or it forgot): the resource must
    /// refuse those writes.
    skips_activation: bool,
    writes_left: u32,
}

#[derive(Debug, Default)]
struct Client {
    owner: Option<Ownership>,
    /// Waiting for an answer until this time (then the request is abandoned).
    waiting_until: Option<u64>,
    writes: u64,
}

/// The coordinator: the real lease table and the image a disk would hold.
struct Coordinator {
    table: LeaseTable,
    image_epoch: Epoch,
    image_leases: BTreeMap<LockName, Lease>,
    /// Every epoch ever made durable (the high-water bound, kept outside the image).
    high_water: Epoch,
}

impl Coordinator {
    fn persist(&mut self) {
        let changes = self.table.take_changes();
        self.table.take_events();
        self.image_epoch = changes.last_epoch;
        self.high_water = self.high_water.max(changes.last_epoch);
        for (lock, lease) in changes.locks {
            match lease {
                Some(lease) => self.image_leases.insert(lock, lease),
                None => self.image_leases.remove(&lock),
            };
        }
    }
}

/// The fenced resource: one key per lock.
#[derive(Default, Clone)]
struct Resource {
    fences: HashMap<usize, Epoch>,
    values: HashMap<usize, (Epoch, String)>,
    /// The restore floor: nothing at or below it is accepted (set when the resource is put
    /// back to an older copy).
    floor: Epoch,
}

impl Resource {
    /// The greatest epoch it holds (what `--floor-from` reads).
    fn highest(&self) -> Epoch {
        let fences = self.fences.values().copied();
        let values = self.values.values().map(|(e, _)| *e);
        fences.chain(values).fold(self.floor, Epoch::max)
    }
}

/// The coordinator's last backup (taken at a crash): its counter and leases.
#[derive(Default, Clone)]
struct Backup {
    epoch: Epoch,
    leases: BTreeMap<LockName, Lease>,
}

/// Everything in one simulated run.
pub struct World {
    seed: u64,
    config: SimConfig,
    rng: SplitMix64,
    now: u64,
    mode: Mode,
    net: Network,
    faults: Faults,
    events: u64,
    hash: u64,
    signer: TokenSigner,
    stranger: TokenSigner,
    verifier: TokenVerifier,
    locks: Vec<LockName>,
    coordinator: Coordinator,
    resource: Resource,
    clients: Vec<Client>,
    wakes: BTreeMap<(u64, usize), ()>,
    next_crash: u64,
    /// The coordinator's last backup.
    backup: Backup,
    /// When the resource is next copied, or put back to its copy.
    next_resource_restore: u64,
    /// The resource's copy, waiting to be put back.
    resource_copy: Option<Resource>,
    history: History,
}

const TTL_MS: u64 = 300;
const ANSWER_TIMEOUT_MS: u64 = 400;

impl World {
    /// A world for `seed`.
    pub fn new(seed: u64, config: SimConfig) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mode = if rng.chance(50) {
            Mode::Strict
        } else {
            Mode::Activated
        };
        let signer = TokenSigner::from_secret_bytes(&[11; 32]);
        let stranger = TokenSigner::from_secret_bytes(&[12; 32]);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let locks = (0..config.locks)
            .map(|i| LockName::new(format!("sim/{i}")).expect("valid"))
            .collect();
        let next_crash = rng.range(2_000, 8_000);
        let mut world = Self {
            seed,
            config,
            rng,
            now: 0,
            mode,
            net: Network::default(),
            faults: Faults::default(),
            events: 0,
            hash: 0xcbf2_9ce4_8422_2325,
            signer,
            stranger,
            verifier,
            locks,
            coordinator: Coordinator {
                table: LeaseTable::new(),
                image_epoch: Epoch(0),
                image_leases: BTreeMap::new(),
                high_water: Epoch(0),
            },
            resource: Resource::default(),
            clients: (0..config.clients).map(|_| Client::default()).collect(),
            wakes: BTreeMap::new(),
            next_crash,
            backup: Backup::default(),
            next_resource_restore: 0,
            resource_copy: None,
            history: History::default(),
        };
        // A third of the seeds put the resource back to an older copy (their final reads are
        // the copy's, so the others keep checking the final value).
        world.next_resource_restore = if world.rng.chance(33) {
            world.rng.range(1_000, 5_000)
        } else {
            u64::MAX
        };
        for client in 0..config.clients {
            let at = world.rng.range(0, 50);
            world.wake(client, at);
        }
        world
    }

    /// Runs to the end and checks the history.
    pub fn run(mut self) -> SimReport {
        while let Some(next) = self.next_event_time() {
            if next > self.config.duration_ms {
                break;
            }
            self.now = next;
            self.step();
        }
        self.final_reads();
        let verdict = check(&self.history, self.mode);
        SimReport {
            seed: self.seed,
            mode: self.mode,
            trace_hash: self.hash,
            events: self.events,
            faults: self.faults,
            history: self.history,
            verdict,
        }
    }

    fn next_event_time(&self) -> Option<u64> {
        let wake = self.wakes.keys().next().map(|(at, _)| *at);
        let restore = Some(self.next_resource_restore);
        [wake, self.net.next_time(), Some(self.next_crash), restore]
            .into_iter()
            .flatten()
            .min()
    }

    fn trace(&mut self, what: std::fmt::Arguments<'_>) {
        self.events += 1;
        let text = format!("{} {what}", self.now);
        for byte in text.bytes() {
            self.hash ^= u64::from(byte);
            self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn wake(&mut self, client: usize, at: u64) {
        self.wakes.insert((at, client), ());
    }

    fn step(&mut self) {
        if self.next_crash <= self.now {
            self.crash();
            return;
        }
        if self.next_resource_restore <= self.now {
            self.resource_restore();
            return;
        }
        if let Some(&(at, client)) = self.wakes.keys().next() {
            if at <= self.now {
                self.wakes.remove(&(at, client));
                self.client_wake(client);
                return;
            }
        }
        if let Some((to, message)) = self.net.deliver(self.now, &mut self.faults) {
            self.trace(format_args!("deliver {to:?} {message:?}"));
            match to {
                Node::Coordinator => self.at_coordinator(message),
                Node::Resource => self.at_resource(message),
                Node::Client(client) => self.at_client(client, message),
            }
        }
    }

    fn send(&mut self, to: Node, message: Message) {
        self.net
            .send(self.now, to, message, &mut self.rng, &mut self.faults);
    }

    fn crash(&mut self) {
        self.faults.crashes += 1;
        let lost = self.net.drop_all_to(Node::Coordinator);
        self.trace(format_args!("crash coordinator, {lost} messages lost"));
        self.next_crash = self.now + self.rng.range(3_000, 9_000);
        if !self.config.plant_epoch_reset && self.backup.epoch > Epoch(0) && self.rng.chance(25) {
            self.restore_coordinator();
            return;
        }
        let c = &mut self.coordinator;
        c.table = if self.config.plant_epoch_reset {
            c.image_leases.clear();
            c.image_epoch = Epoch(0);
            LeaseTable::new()
        } else {
            LeaseTable::restore(c.image_epoch, c.image_leases.values().cloned(), self.now)
        };
        // The operator's backup, taken while it was down.
        self.backup = Backup {
            epoch: c.image_epoch,
            leases: c.image_leases.clone(),
        };
    }

    /// The coordinator comes back from its last backup: its directory copied back (the
    /// high-water bound beside it raises the counter; the copy's leases come back), or its
    /// machine lost and `palisade restore --floor-from` the resource (no leases).
    fn restore_coordinator(&mut self) {
        self.faults.restores += 1;
        let copy_back = self.rng.chance(50);
        let backup = self.backup.clone();
        let (epoch, leases) = if self.config.plant_restore_from_backup_only {
            (backup.epoch, backup.leases)
        } else if copy_back {
            (backup.epoch.max(self.coordinator.high_water), backup.leases)
        } else {
            let known = backup.epoch.max(self.resource.highest());
            let (counter, _) = palisade_core::restore::restored_counter(known.0, self.now)
                .expect("simulated epochs are small");
            (Epoch(counter), BTreeMap::new())
        };
        self.trace(format_args!(
            "restore coordinator ({}) from backup {} at {epoch}",
            if copy_back { "copy-back" } else { "lost" },
            backup.epoch
        ));
        let c = &mut self.coordinator;
        c.table = LeaseTable::restore(epoch, leases.values().cloned(), self.now);
        c.image_epoch = epoch;
        c.image_leases = leases;
    }

    /// Copies the resource, or puts it back to its copy and applies the coordinator's floor
    /// (an epoch it issues now: above every token issued before), as `palisade resource
    /// restore` does.
    fn resource_restore(&mut self) {
        self.next_resource_restore = self.now + self.rng.range(2_000, 6_000);
        let Some(copy) = self.resource_copy.take() else {
            self.resource_copy = Some(self.resource.clone());
            self.trace(format_args!("copy resource"));
            return;
        };
        self.faults.resource_restores += 1;
        let floor = self.coordinator.table.last_epoch();
        self.resource = copy;
        if !self.config.plant_resource_restore_without_floor {
            self.resource.floor = self.resource.floor.max(floor);
        }
        self.trace(format_args!("restore resource, floor {floor}"));
    }

    fn client_wake(&mut self, id: usize) {
        let now = self.now;
        if let Some(until) = self.clients[id].waiting_until {
            if now < until {
                self.wake(id, until);
                return;
            }
            // No answer in time: abandon the request (and any ownership it was for).
            self.trace(format_args!("client {id} gives up waiting"));
            self.clients[id].waiting_until = None;
            self.clients[id].owner = None;
        }
        let Some(owner) = self.clients[id].owner.clone() else {
            self.client_acquires(id);
            return;
        };
        // A pause (GC, VM stall, SIGSTOP) — often past the lease's TTL — before acting.
        if self.rng.chance(15) {
            self.faults.pauses += 1;
            let pause = self.rng.range(1, 3 * TTL_MS);
            self.trace(format_args!("client {id} pauses {pause} ms"));
            self.wake(id, now + pause);
            return;
        }
        if self.rng.chance(4) {
            self.send_forged(id, owner.lock);
        }
        if self.mode == Mode::Activated && !owner.activated && !owner.skips_activation {
            let message = Message::Activate {
                client: id,
                lock: owner.lock,
                token: owner.token.clone(),
                forged: false,
                epoch: owner.epoch.0,
                sent: now,
            };
            self.send(Node::Resource, message);
            self.await_answer(id);
        } else if owner.writes_left > 0 {
            self.clients[id].writes += 1;
            let value = format!("c{id}-{}", self.clients[id].writes);
            let message = Message::Write {
                client: id,
                lock: owner.lock,
                token: owner.token.clone(),
                forged: false,
                epoch: owner.epoch.0,
                value,
                sent: now,
            };
            self.send(Node::Resource, message);
            if let Some(owner) = &mut self.clients[id].owner {
                owner.writes_left -= 1;
            }
            self.await_answer(id);
        } else {
            self.send(Node::Coordinator, Message::Release { lease: owner.lease });
            self.clients[id].owner = None;
            let next = now + self.rng.range(1, 100);
            self.wake(id, next);
        }
    }

    /// Client `id`, owning nothing, asks for a lock drawn at random.
    fn client_acquires(&mut self, id: usize) {
        let lock = self.rng.range(0, self.config.locks as u64) as usize;
        self.trace(format_args!("client {id} acquires lock {lock}"));
        let message = Message::Acquire {
            client: id,
            lock,
            ttl_ms: TTL_MS,
            sent: self.now,
        };
        self.send(Node::Coordinator, message);
        self.await_answer(id);
    }

    fn await_answer(&mut self, id: usize) {
        let until = self.now + ANSWER_TIMEOUT_MS;
        self.clients[id].waiting_until = Some(until);
        self.wake(id, until);
    }

    /// A write with an altered token, or one signed by an untrusted key with a huge epoch.
    fn send_forged(&mut self, id: usize, lock: usize) {
        self.faults.forged += 1;
        let name = &self.locks[lock];
        let holder = HolderId::new("mallory").expect("valid");
        let (token, epoch) = if self.rng.chance(50) {
            let epoch = self.coordinator.table.last_epoch().0 + 1;
            let genuine = self
                .signer
                .sign(name, Epoch(epoch), &holder, &Principal::anonymous(), 0);
            (alter_epoch(&genuine), epoch ^ 0x40)
        } else {
            let epoch = u64::MAX / 2;
            (
                self.stranger
                    .sign(name, Epoch(epoch), &holder, &Principal::anonymous(), 0),
                epoch,
            )
        };
        self.trace(format_args!("client {id} sends a forged write"));
        let message = Message::Write {
            client: id,
            lock,
            token,
            forged: true,
            epoch,
            value: format!("forged-{id}"),
            sent: self.now,
        };
        self.send(Node::Resource, message);
    }

    fn at_client(&mut self, id: usize, message: Message) {
        let client = &mut self.clients[id];
        client.waiting_until = None;
        match message {
            Message::Granted {
                lock,
                epoch,
                lease,
                token,
            } => {
                client.owner = Some(Ownership {
                    lock,
                    epoch,
                    lease,
                    token,
                    activated: false,
                    // Derived from the epoch (no draw from the seed's generator), so the
                    // other modes' traces do not change.
                    skips_activation: epoch.0 % 7 == 3,
                    writes_left: 1 + (epoch.0 % 3) as u32,
                });
            }
            Message::Held => client.owner = None,
            Message::Answer { ok } => match (&mut client.owner, ok) {
                (Some(owner), true) => owner.activated = true,
                // Rejected: a newer owner exists; stop working.
                (_, false) => client.owner = None,
                (None, true) => {}
            },
            other => unreachable!("clients receive no {other:?}"),
        }
        let next = self.now + self.rng.range(1, 20);
        self.wake(id, next);
    }

    fn at_coordinator(&mut self, message: Message) {
        let now = self.now;
        self.coordinator.table.expire_due(now);
        match message {
            Message::Acquire {
                client,
                lock,
                ttl_ms,
                sent,
            } => {
                let request = AcquireRequest {
                    lock: self.locks[lock].clone(),
                    holder: HolderId::new(format!("c{client}")).expect("valid"),
                    principal: palisade_core::Principal::anonymous(),
                    ttl_ms,
                    wait_ms: 0,
                    class: LockClass::Critical,
                    request_id: None,
                };
                match self.coordinator.table.acquire(request, now) {
                    Ok(AcquireOutcome::Granted(lease)) => {
                        // Durable before the answer, as in the real engine.
                        self.coordinator.persist();
                        self.history.push(Entry {
                            process: format!("c{client}"),
                            lock: self.locks[lock].to_string(),
                            op: Op::Acquire,
                            invoked: sent,
                            completed: now,
                            outcome: Outcome::Granted {
                                epoch: lease.epoch.0,
                            },
                        });
                        let token = self.signer.sign(
                            &lease.lock,
                            lease.epoch,
                            &lease.holder,
                            &lease.principal,
                            now,
                        );
                        let granted = Message::Granted {
                            lock,
                            epoch: lease.epoch,
                            lease: lease.id,
                            token,
                        };
                        self.send(Node::Client(client), granted);
                    }
                    Ok(AcquireOutcome::Waiting(_)) => unreachable!("the simulation never waits"),
                    Err(_) => self.send(Node::Client(client), Message::Held),
                }
            }
            Message::Release { lease } => {
                let _ = self.coordinator.table.release(lease, None, now);
            }
            other => unreachable!("the coordinator receives no {other:?}"),
        }
        self.coordinator.persist();
    }

    fn at_resource(&mut self, message: Message) {
        match message {
            Message::Activate {
                client,
                lock,
                token,
                forged,
                epoch,
                sent,
            } => {
                let name = self.locks[lock].clone();
                let verified = self.verifier.verify(&token, Some(&name));
                let fence = self.resource.fences.get(&lock).copied().unwrap_or_default();
                let ok = match verified {
                    Ok(claims) if claims.epoch <= self.resource.floor => false,
                    Ok(claims) => match rules::activate(fence, claims.epoch) {
                        Ok(_) => {
                            self.resource.fences.insert(lock, claims.epoch);
                            true
                        }
                        Err(_) => false,
                    },
                    Err(_) => false,
                };
                let op = Op::Activate {
                    epoch,
                    token: token_kind(forged),
                };
                self.record(client, lock, op, sent, ok);
                self.send(Node::Client(client), Message::Answer { ok });
            }
            Message::Write {
                client,
                lock,
                token,
                forged,
                epoch,
                value,
                sent,
            } => {
                let name = self.locks[lock].clone();
                let ok = match self.verifier.verify(&token, Some(&name)) {
                    Ok(claims) => self.apply_write(lock, claims.epoch, &value),
                    Err(_) => false,
                };
                let op = Op::Write {
                    key: "k".into(),
                    epoch,
                    seq: None,
                    value,
                    token: token_kind(forged),
                };
                self.record(client, lock, op, sent, ok);
                self.send(Node::Client(client), Message::Answer { ok });
            }
            other => unreachable!("the resource receives no {other:?}"),
        }
    }

    fn apply_write(&mut self, lock: usize, epoch: Epoch, value: &str) -> bool {
        if epoch <= self.resource.floor {
            return false; // issued before the resource was restored
        }
        let decision = match self.mode {
            Mode::Activated => {
                let fence = self.resource.fences.get(&lock).copied().unwrap_or_default();
                if self.config.plant_unactivated_accepted && epoch > fence {
                    Ok(())
                } else {
                    rules::activated_write(fence, epoch)
                }
            }
            _ => {
                let stored = self.resource.values.get(&lock).map(|(e, _)| *e);
                if self.config.plant_equal_accepted && stored == Some(epoch) {
                    Ok(())
                } else {
                    rules::strict(stored, stored.unwrap_or_default(), epoch)
                }
            }
        };
        if decision.is_ok() {
            self.resource.values.insert(lock, (epoch, value.to_owned()));
        }
        decision.is_ok()
    }

    fn record(&mut self, client: usize, lock: usize, op: Op, sent: u64, ok: bool) {
        let outcome = if ok {
            Outcome::Accepted
        } else {
            Outcome::Rejected {
                reason: "refused".into(),
            }
        };
        self.history.push(Entry {
            process: format!("c{client}"),
            lock: self.locks[lock].to_string(),
            op,
            invoked: sent,
            completed: self.now,
            outcome,
        });
    }

    fn final_reads(&mut self) {
        if self.faults.resource_restores > 0 {
            // A restore loses the writes made after the copy: the final value is the copy's
            // (data loss is what a restore is; fencing is checked on every write above).
            return;
        }
        let at = self.config.duration_ms + 1;
        for lock in 0..self.config.locks {
            let stored = self.resource.values.get(&lock).cloned();
            self.history.push(Entry {
                process: "reader".into(),
                lock: self.locks[lock].to_string(),
                op: Op::Read { key: "k".into() },
                invoked: at,
                completed: at,
                outcome: Outcome::Value {
                    value: stored.as_ref().map(|(_, v)| v.clone()),
                    epoch: stored.map(|(e, _)| e.0),
                },
            });
        }
    }
}

fn token_kind(forged: bool) -> TokenKind {
    if forged {
        TokenKind::Forged
    } else {
        TokenKind::Valid
    }
}
