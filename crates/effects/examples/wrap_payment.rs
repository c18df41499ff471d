//! Wrapping a payment provider's call with the effects ledger (docs/effects.md).
//!
//! `Payments` is an adapter for a provider that honours idempotency keys (as Stripe does):
//! the application declares `Capability::Idempotent` because that is true of the provider.
//! `charge_invoice` is what the owner of lock `invoice/{id}` calls: the ledger records the
//! attempt under the owner's token before anything is sent, and resolves an unknown outcome
//! by retrying with the same key.
//!
//! Run against a reference store's embedded ledger and a fake receiver:
//! `cargo run -p palisade-effects --example wrap_payment -- LEDGER_URL RECEIVER_URL TOKEN`.

use std::time::Duration;

use palisade_core::LockName;
use palisade_effects::{
    perform, Attempt, Capability, Done, HttpLedger, Ledger, OpId, Receiver, ReceiverError,
    RunError, RunOptions, SendResult, Status,
};

/// The provider's adapter: here the receiver HTTP protocol of `palisade receiver serve`; for
/// a real provider, its SDK call with `attempt.key` as the idempotency key.
struct Payments {
    inner: palisade_effects::HttpReceiver,
}

impl Receiver for Payments {
    fn name(&self) -> &str {
        "payments"
    }

    fn capability(&self) -> Capability {
        Capability::Idempotent
    }

    async fn send(&self, attempt: &Attempt) -> SendResult {
        // Map the provider's answers: success → Performed (with its charge id), a decline →
        // Refused, a timeout or a 5xx → Ambiguous. Never retry here: the ledger decides.
        self.inner.send(attempt).await
    }

    async fn status(&self, key: &str) -> Result<Status, ReceiverError> {
        self.inner.status(key).await
    }

    async fn compensate(&self, key: &str) -> Result<String, ReceiverError> {
        self.inner.compensate(key).await
    }
}

/// Charges invoice `invoice` once, whoever owns its lock and however often this is retried.
async fn charge_invoice<L: Ledger>(
    ledger: &L,
    payments: &Payments,
    token: &str,
    invoice: u64,
    cents: u64,
) -> Result<Option<String>, RunError> {
    let lock = LockName::new(format!("invoice/{invoice}")).expect("a valid lock name");
    let id = OpId::new(lock, "charge").expect("a valid operation id");
    let payload = format!("{{\"amount\":{cents},\"currency\":\"eur\"}}");
    let options = RunOptions::default();
    match perform(
        ledger,
        payments,
        token,
        &id,
        payload.as_bytes(),
        &options,
        |_, _| {},
    )
    .await?
    {
        Done::Performed(record) => Ok(record.reference),
        Done::Failed(record) => {
            eprintln!("declined: {}", record.detail.unwrap_or_default());
            Ok(None)
        }
        // A person or the reconciler finishes these; the charge is never sent twice.
        Done::Review(record) | Done::InDoubt(record) => {
            eprintln!(
                "{} is {}; see `palisade effects show {}`",
                record.id, record.state, record.id
            );
            Ok(None)
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ledger_url, receiver_url, token] = args.as_slice() else {
        anyhow::bail!("usage: wrap_payment LEDGER_URL RECEIVER_URL TOKEN");
    };
    let ledger = HttpLedger::new(ledger_url, None)?;
    let payments = Payments {
        inner: palisade_effects::HttpReceiver::new(
            "payments",
            Capability::Idempotent,
            receiver_url,
            Duration::from_secs(5),
        )?,
    };
    let charge = charge_invoice(&ledger, &payments, token, 7, 1_000).await?;
    println!("charge: {charge:?}");
    Ok(())
}
