//! A deadline on every gRPC request message, the streaming counterpart of
//! [`crate::bounded_bodies`]'s body timeout. A gRPC request body is a sequence of messages,
//! each a 5-byte prefix (compressed flag, big-endian length) and its bytes. Here:
//! - once a message's first byte has arrived, the whole message must arrive within the
//!   deadline (a client that starts a message and stalls holds a stream, a buffer and a slot of
//!   its connection only that long);
//! - a unary request's (only) message must also *start* within the deadline of the request's
//!   arrival; client-streaming methods (named by the caller) may wait between messages for as
//!   long as they like, since their server decides when a quiet stream ends.
//!
//! Past the deadline the body yields an error: the service sees a broken request, answers with
//! an error status and the stream ends. Sizes are not checked here (tonic's decoding limit
//! does that).

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::Router;
use http_body::Frame;
use tokio::time::{Instant, Sleep};

/// Wraps `router` so that every gRPC request message on a path under `prefix` arrives within
/// `within` of its first byte, and the first message of a request whose path is not in
/// `client_streaming` within `within` of the request. Other requests pass untouched.
pub fn grpc_message_deadlines(
    router: Router,
    within: Duration,
    prefix: &'static str,
    client_streaming: &'static [&'static str],
) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let is_grpc = request.uri().path().starts_with(prefix)
                && request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
            let request = if is_grpc {
                let streaming = client_streaming.contains(&request.uri().path());
                request.map(|body| Body::new(MessageDeadline::new(body, within, !streaming)))
            } else {
                request
            };
            next.run(request)
        },
    ))
}

/// Where a request body stands in its message framing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Framing {
    /// Prefix bytes of the current message seen (0 to 5).
    prefix_seen: usize,
    /// The current message's length, once its prefix is complete.
    prefix: [u8; 5],
    /// Bytes of the current message still to come, once its prefix is complete.
    remaining: u64,
}

impl Framing {
    /// True while a message has started and not ended.
    fn within_message(&self) -> bool {
        self.prefix_seen > 0
    }

    /// Follows `data` through the framing; returns how many messages it completed.
    fn advance(&mut self, mut data: &[u8]) -> usize {
        let mut completed = 0;
        while !data.is_empty() {
            if self.prefix_seen < 5 {
                let take = (5 - self.prefix_seen).min(data.len());
                self.prefix[self.prefix_seen..self.prefix_seen + take]
                    .copy_from_slice(&data[..take]);
                self.prefix_seen += take;
                data = &data[take..];
                if self.prefix_seen == 5 {
                    let length = [
                        self.prefix[1],
                        self.prefix[2],
                        self.prefix[3],
                        self.prefix[4],
                    ];
                    self.remaining = u64::from(u32::from_be_bytes(length));
                }
            } else {
                let take = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.remaining -= take as u64;
                data = &data[take..];
            }
            if self.prefix_seen == 5 && self.remaining == 0 {
                *self = Self::default();
                completed += 1;
            }
        }
        completed
    }
}

/// A request body that fails when a message takes longer than its deadline.
struct MessageDeadline {
    inner: Body,
    within: Duration,
    framing: Framing,
    /// Armed while a message is owed: from a message's first byte until its last, and from the
    /// start of a unary request until its first message.
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl MessageDeadline {
    fn new(inner: Body, within: Duration, first_message_owed: bool) -> Self {
        let deadline =
            first_message_owed.then(|| Box::pin(tokio::time::sleep_until(Instant::now() + within)));
        Self {
            inner,
            within,
            framing: Framing::default(),
            deadline,
            expired: false,
        }
    }

    fn follow(&mut self, data: &Bytes) {
        let was_within = self.framing.within_message();
        let completed = self.framing.advance(data);
        if self.framing.within_message() {
            // A message is under way: it owes its rest within the deadline of its first byte.
            if completed > 0 || !was_within || self.deadline.is_none() {
                self.deadline = Some(Box::pin(tokio::time::sleep_until(
                    Instant::now() + self.within,
                )));
            }
        } else {
            self.deadline = None;
        }
    }
}

impl http_body::Body for MessageDeadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.follow(&data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                self.deadline = None;
                Poll::Ready(other)
            }
            Poll::Pending => {
                let fired = self
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if !fired {
                    return Poll::Pending;
                }
                self.expired = true;
                self.deadline = None;
                let message = format!(
                    "a gRPC request message did not arrive within {:?}",
                    self.within
                );
                Poll::Ready(Some(Err(axum::Error::new(message))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::Framing;

    #[test]
    fn framing_follows_messages_split_anywhere() {
        let mut message = vec![0u8, 0, 0, 0, 3, b'a', b'b', b'c'];
        message.extend_from_slice(&[0, 0, 0, 0, 0]); // an empty message
        for split in 0..=message.len() {
            let mut framing = Framing::default();
            let first = framing.advance(&message[..split]);
            let second = framing.advance(&message[split..]);
            assert_eq!(first + second, 2, "split at {split}");
            assert!(!framing.within_message());
        }
        let mut framing = Framing::default();
        assert_eq!(framing.advance(&message[..6]), 0);
        assert!(framing.within_message());
    }
}
