//! Credentials before bodies: a request that carries a body is authenticated from its headers
//! (and the connection's client certificate) before a byte of its body is read or decoded. An
//! unauthenticated client can otherwise make the server buffer a 64 KiB body (or decode a
//! 64 KiB gRPC message) on each of 1,024 streams of each connection before it learns the answer
//! is 401.
//!
//! Raft traffic is admitted by [`peers_before_bodies`]: a member's certificate, checked from
//! the connection and the headers before the body is read; `GET` and `HEAD` carry no body and
//! are authenticated by their handlers as before.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{header, Method};
use std::sync::Arc;

use palisade_cluster::network::PeerAdmission;
use palisade_listener::PeerCertificates;

use crate::auth::Auth;
use crate::http_error::ApiError;
use crate::tls::CertificatePrincipal;

/// The path prefix of the coordinator's gRPC methods.
pub const COORDINATOR_GRPC: &str = "/palisade.v1.Coordinator/";

/// The path prefix of the cluster peers' gRPC methods.
pub const RAFT_GRPC: &str = "/palisade.v1.Raft/";

/// Wraps `app` so that every request with a body is refused (HTTP 401, or gRPC
/// `UNAUTHENTICATED`) before its body is read when its credentials are missing or unknown.
pub fn credentials_before_bodies(app: Router, auth: Arc<Auth>) -> Router {
    app.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let refused = refusal(&auth, &request);
            async move {
                match refused {
                    Some(refused) => refused,
                    None => next.run(request).await,
                }
            }
        },
    ))
}

/// Wraps `app` so that a Raft request (under [`RAFT_GRPC`]) from anyone but a member that
/// proved who it is is refused (gRPC `UNAUTHENTICATED`) before its body — up to 64 MiB — is
/// read or decoded ([`PeerAdmission`]).
pub fn peers_before_bodies(app: Router, peers: PeerAdmission) -> Router {
    app.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let refused = request
                .uri()
                .path()
                .starts_with(RAFT_GRPC)
                .then(|| {
                    let metadata =
                        tonic::metadata::MetadataMap::from_headers(request.headers().clone());
                    let certificates = request.extensions().get::<PeerCertificates>();
                    peers.admit(request.uri().path(), &metadata, certificates)
                })
                .and_then(Result::err);
            async move {
                match refused {
                    Some(status) => status.into_http::<axum::body::Body>(),
                    None => next.run(request).await,
                }
            }
        },
    ))
}

/// The answer to `request` when it must not be read further, or `None`.
fn refusal(auth: &Auth, request: &Request) -> Option<Response> {
    let path = request.uri().path();
    if path.starts_with(RAFT_GRPC) || matches!(*request.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes());
    let certificate = request.extensions().get::<CertificatePrincipal>();
    let denied = auth.authenticate(authorization, certificate).err()?;
    if path.starts_with(COORDINATOR_GRPC) {
        let status = tonic::Status::unauthenticated(denied.to_string());
        Some(status.into_http::<axum::body::Body>())
    } else {
        Some(ApiError::from(denied).into_response())
    }
}
