//! The effects ledger (P7): external effects through receivers that cannot be fenced.
//!
//! A payment provider or an email gateway does not understand a fencing token. What Palisade
//! can do is make the *sender* fenced: every attempt at an effect is recorded durably in a
//! [`Ledger`], under the owner's token and through the ledger's fence, **before** it is sent,
//! and carries an idempotency key derived from the operation's identity alone
//! ([`OpId::idempotency_key`]). A stale owner cannot even begin an attempt once a newer owner
//! has begun one under the lock; an attempt whose outcome is unknown is resolved by the
//! receiver's [`Capability`] — retried with the same key (idempotent), looked up after its
//! deadline (lookup), or sent to a person (none) — never silently retried into a duplicate.
//!
//! - [`model`]: identity, states and the rules, with no I/O;
//! - [`ledger`]: the [`Ledger`] trait and [`LocalLedger`], the rules over a [`ledger::Store`];
//!   stores: [`RedbStore`] (embedded) and [`PostgresStore`]; [`HttpLedger`] reaches an
//!   embedded ledger hosted by `palisade resource serve`;
//! - [`receiver`]: the [`Receiver`] trait and the HTTP receiver protocol;
//! - [`runner`]: [`perform`] (an owner's run) and [`reconcile_once`];
//! - the fake receiver with faults (`palisade receiver serve`) is the crate
//!   `palisade-fake-receiver`;
//! - [`conformance`]: the suite every ledger passes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod any;
pub mod conformance;
pub mod http;
pub mod ledger;
pub mod metrics;
pub mod model;
mod postgres;
pub mod receiver;
mod redb_store;
mod redb_writer;
pub mod runner;

pub use any::AnyLedger;
pub use http::{HttpLedger, ADMIN_HEADER};
pub use ledger::{
    Answer, Attempt, Begin, BeginRequest, Ledger, LedgerError, ListFilter, LocalLedger, Stats,
};
pub use model::{Capability, OpId, OpState, Record, SendResult, Settlement, Verdict};
pub use postgres::PostgresStore;
pub use receiver::{HttpReceiver, Receiver, ReceiverError, Status};
pub use redb_store::{RedbStore, WITNESS_INTERVAL};
pub use runner::{perform, reconcile_once, Done, ReconcileReport, RunError, RunOptions, Step};
