//! A held lease: its token, a background keepalive, and a conservative view of its validity.

use std::time::Duration;

use palisade_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Client, ClientError, Grant};

/// Renewals per TTL: the keepalive renews every third of the TTL, so two renewals in a row can
/// fail before the lease is lost.
const RENEWALS_PER_TTL: u32 = 3;
/// After a failed renewal the next try comes this many times sooner than the usual interval.
const RETRY_SPEEDUP: u32 = 4;

/// What the holder may believe about its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Held until `valid_until` (the send time of the last confirmed renewal plus the TTL),
    /// unless a renewal confirms a later time before then.
    Held {
        /// When the holder must stop believing it holds the lease.
        valid_until: Instant,
    },
    /// Lost: the coordinator refused a renewal, or no renewal was confirmed in time.
    Lost {
        /// Why.
        reason: String,
    },
    /// Released by its holder.
    Released,
}

/// A lease held by this process. Dropping it releases the lease on a best-effort basis.
pub struct LeaseHandle {
    client: Client,
    grant: Grant,
    state: watch::Receiver<LeaseState>,
    /// Dropping this sender stops the keepalive task.
    stop_keepalive: Option<oneshot::Sender<()>>,
    released: bool,
}

impl LeaseHandle {
    pub(crate) fn start(client: Client, grant: Grant, sent: Instant) -> Self {
        let ttl = Duration::from_millis(grant.ttl_ms);
        let valid_until = sent + ttl;
        let (state_sender, state) = watch::channel(LeaseState::Held { valid_until });
        let (stop_keepalive, stop) = oneshot::channel();
        let keepalive = Keepalive {
            client: client.clone(),
            lease_id: grant.lease_id.clone(),
            ttl,
            valid_until,
            state: state_sender,
            stream: None,
        };
        tokio::spawn(keepalive.run(stop));
        Self {
            client,
            grant,
            state,
            stop_keepalive: Some(stop_keepalive),
            released: false,
        }
    }

    /// The grant: lock, epoch, lease id, token.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The signed token to present to resources.
    pub fn token(&self) -> &str {
        &self.grant.token
    }

    /// The ownership epoch.
    pub fn epoch(&self) -> u64 {
        self.grant.epoch
    }

    /// The lease id.
    pub fn lease_id(&self) -> &str {
        &self.grant.lease_id
    }

    /// The holder's current view of the lease.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// True while the lease is held and its conservative validity has not run out. A `true`
    /// here does not make a later write safe: only the resource's fence does.
    pub fn is_valid(&self) -> bool {
        matches!(*self.state.borrow(), LeaseState::Held { valid_until } if Instant::now() < valid_until)
    }

    /// Resolves when the lease must be considered lost, with the reason.
    pub async fn lost(&mut self) -> String {
        loop {
            let current = self.state.borrow_and_update().clone();
            let valid_until = match current {
                LeaseState::Held { valid_until } => valid_until,
                LeaseState::Lost { reason } => return reason,
                LeaseState::Released => return "released by its holder".into(),
            };
            tokio::select! {
                () = tokio::time::sleep_until(valid_until) => {
                    if self.state() == (LeaseState::Held { valid_until }) {
                        return "no renewal was confirmed before the lease's validity ended".into();
                    }
                }
                changed = self.state.changed() => {
                    if changed.is_err() && self.state() == (LeaseState::Held { valid_until }) {
                        // The keepalive stopped without a verdict: wait out the validity.
                        tokio::time::sleep_until(valid_until).await;
                        return "the keepalive stopped".into();
                    }
                }
            }
        }
    }

    /// Resolves `margin` before the lease's validity ends, unless a confirmed renewal moved
    /// that end first, or when the lease is lost or released; with why, and the instant past
    /// which nobody may act on the lease: the validity's end, or now for a lease the
    /// coordinator refused or that was released (another owner may hold the lock already).
    /// What a supervisor waits on that must have its work stopped before the lock can change
    /// hands (`palisade lock run`).
    pub async fn ending(&mut self, margin: Duration) -> (String, Instant) {
        loop {
            let current = self.state.borrow_and_update().clone();
            let valid_until = match current {
                LeaseState::Held { valid_until } => valid_until,
                LeaseState::Lost { reason } => return (reason, Instant::now()),
                LeaseState::Released => return ("released by its holder".into(), Instant::now()),
            };
            let stop_at = valid_until.checked_sub(margin).unwrap_or(valid_until);
            tokio::select! {
                () = tokio::time::sleep_until(stop_at) => {
                    if self.state() == (LeaseState::Held { valid_until }) {
                        return (
                            format!(
                                "no renewal was confirmed {margin:?} before the lease's validity \
                                 ends"
                            ),
                            valid_until,
                        );
                    }
                }
                changed = self.state.changed() => {
                    if changed.is_err() && self.state() == (LeaseState::Held { valid_until }) {
                        tokio::time::sleep_until(stop_at).await;
                        return ("the keepalive stopped".into(), valid_until);
                    }
                }
            }
        }
    }

    /// Stops the keepalive and releases the lease.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.stop_keepalive.take();
        self.released = true;
        self.client.release(&self.grant.lease_id).await
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.stop_keepalive.take();
        if self.released {
            return;
        }
        // Best effort: without a runtime (or if the coordinator is unreachable) the lease
        // simply expires after its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let lease_id = self.grant.lease_id.clone();
            runtime.spawn(async move {
                if let Err(error) = client.release(&lease_id).await {
                    tracing::debug!(%error, "release on drop failed");
                }
            });
        }
    }
}

/// The background renewal loop of one lease.
struct Keepalive {
    client: Client,
    lease_id: String,
    ttl: Duration,
    valid_until: Instant,
    state: watch::Sender<LeaseState>,
    /// The open keepalive stream: where to send renewals and where their answers come from.
    stream: Option<(
        mpsc::Sender<pb::RenewRequest>,
        tonic::Streaming<pb::RenewResponse>,
    )>,
}

impl Keepalive {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let interval = self.ttl / RENEWALS_PER_TTL;
        // The first renewal comes a third of the TTL into the validity, which began when the
        // acquire was sent: after a long wait for the lock (or a failover), at once.
        let mut delay =
            (self.valid_until - (self.ttl - interval)).saturating_duration_since(Instant::now());
        loop {
            tokio::select! {
                _ = &mut stop => return,
                () = tokio::time::sleep(delay) => {}
            }
            let sent = Instant::now();
            if sent >= self.valid_until {
                self.lose("no renewal was confirmed before the lease's validity ended".into());
                return;
            }
            let outcome = tokio::select! {
                _ = &mut stop => return,
                outcome = tokio::time::timeout_at(self.valid_until, self.renew()) => outcome,
            };
            match &outcome {
                Ok(Ok(())) => self.client.count(crate::Event::Renewed),
                _ => self.client.count(crate::Event::RenewalFailed),
            }
            match outcome {
                Ok(Ok(())) => {
                    self.valid_until = sent + self.ttl;
                    let _ = self.state.send(LeaseState::Held {
                        valid_until: self.valid_until,
                    });
                    delay = interval;
                }
                // Final answers: the lease is gone, or this client may not keep it.
                Ok(Err(
                    ClientError::UnknownLease(reason)
                    | ClientError::PermissionDenied(reason)
                    | ClientError::Unauthenticated(reason),
                )) => {
                    self.lose(reason);
                    return;
                }
                Ok(Err(error)) => {
                    tracing::debug!(%error, "renewal failed; retrying");
                    self.stream = None;
                    delay = interval / RETRY_SPEEDUP;
                }
                Err(_) => {
                    self.lose("no renewal was confirmed before the lease's validity ended".into());
                    return;
                }
            }
        }
    }

    fn lose(&self, reason: String) {
        self.client.count(crate::Event::LeaseLost);
        let _ = self.state.send(LeaseState::Lost { reason });
    }

    /// One renewal over the keepalive stream; when the stream fails (its node died or no
    /// longer leads), one unary renewal, which finds the leader among the client's endpoints,
    /// and the next renewal opens a stream to wherever that one went.
    async fn renew(&mut self) -> Result<(), ClientError> {
        match self.renew_on_stream().await {
            Ok(()) => Ok(()),
            Err(
                error @ (ClientError::UnknownLease(_)
                | ClientError::PermissionDenied(_)
                | ClientError::Unauthenticated(_)),
            ) => Err(error),
            Err(error) => {
                tracing::debug!(%error, "keepalive stream failed");
                self.stream = None;
                self.client
                    .renew_uncounted(&self.lease_id)
                    .await
                    .map(|_| ())
            }
        }
    }

    /// One renewal over the keepalive stream, opening the stream first when needed.
    async fn renew_on_stream(&mut self) -> Result<(), ClientError> {
        if self.stream.is_none() {
            let (sender, receiver) = mpsc::channel(1);
            let responses = self
                .client
                .grpc()
                .keepalive(ReceiverStream::new(receiver))
                .await?
                .into_inner();
            self.stream = Some((sender, responses));
        }
        let (sender, responses) = self.stream.as_mut().expect("opened above");
        let request = pb::RenewRequest {
            lease_id: self.lease_id.clone(),
        };
        if sender.send(request).await.is_err() {
            return Err(ClientError::Unavailable("keepalive stream closed".into()));
        }
        match responses.message().await? {
            Some(_) => Ok(()),
            None => Err(ClientError::Unavailable("keepalive stream closed".into())),
        }
    }
}
