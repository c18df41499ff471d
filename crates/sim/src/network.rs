//! The simulated network: messages with delivery times, delays, drops and reorders.

use std::collections::BTreeMap;

use palisade_core::{Epoch, LeaseId};

use crate::rng::SplitMix64;
use crate::Faults;

/// Who a message is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    Coordinator,
    Resource,
    Client(usize),
}

/// A message in flight.
#[derive(Debug, Clone)]
pub enum Message {
    Acquire {
        client: usize,
        lock: usize,
        ttl_ms: u64,
        sent: u64,
    },
    Release {
        lease: LeaseId,
    },
    Granted {
        lock: usize,
        epoch: Epoch,
        lease: LeaseId,
        token: String,
    },
    Held,
    Activate {
        client: usize,
        lock: usize,
        token: String,
        forged: bool,
        epoch: u64,
        sent: u64,
    },
    Write {
        client: usize,
        lock: usize,
        token: String,
        forged: bool,
        epoch: u64,
        value: String,
        sent: u64,
    },
    Answer {
        ok: bool,
    },
}

/// Messages by delivery time (ties broken by send order, so delivery is deterministic).
#[derive(Debug, Default)]
pub struct Network {
    queue: BTreeMap<(u64, u64), (Node, Message)>,
    sent: u64,
    /// Per destination, the send number of the last delivered message (to count reorders).
    last_delivered: BTreeMap<Node, u64>,
}

impl Network {
    /// Sends `message` to `to` at `now`: usually 1–5 ms, sometimes held 0.2–3 s (a buffering
    /// proxy), sometimes lost.
    pub fn send(
        &mut self,
        now: u64,
        to: Node,
        message: Message,
        rng: &mut SplitMix64,
        faults: &mut Faults,
    ) {
        self.sent += 1;
        if rng.chance(2) {
            faults.drops += 1;
            return;
        }
        let mut latency = rng.range(1, 6);
        if rng.chance(5) {
            faults.delays += 1;
            latency += rng.range(200, 3_000);
        }
        self.queue.insert((now + latency, self.sent), (to, message));
    }

    /// Removes every message for `node` (a crash loses what was in flight to it).
    pub fn drop_all_to(&mut self, node: Node) -> usize {
        let before = self.queue.len();
        self.queue.retain(|_, (to, _)| *to != node);
        before - self.queue.len()
    }

    /// The next delivery time.
    pub fn next_time(&self) -> Option<u64> {
        self.queue.keys().next().map(|(at, _)| *at)
    }

    /// Takes the next message due at or before `now`.
    pub fn deliver(&mut self, now: u64, faults: &mut Faults) -> Option<(Node, Message)> {
        let (&(at, number), _) = self.queue.iter().next()?;
        if at > now {
            return None;
        }
        let (to, message) = self.queue.remove(&(at, number)).expect("present");
        let last = self.last_delivered.entry(to).or_default();
        if number < *last {
            faults.reorders += 1;
        }
        *last = (*last).max(number);
        Some((to, message))
    }
}
