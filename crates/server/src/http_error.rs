//! The HTTP API's error answers: `{"error": CODE, "message", "leader"?}` with a fitting
//! status, and how each failure of the layers below becomes one. The routes of `http.rs` and
//! `console.rs` and the admission layer all answer with it.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use palisade_coordinator::engine::CoordinatorError;
use palisade_core::{InvalidInput, LeaseError};
use serde_json::json;

use crate::auth::Denied;

/// A JSON error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// With `not_leader`: the leader's URL, when known.
    leader: Option<String>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            leader: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code, "message": self.message});
        if let Some(leader) = self.leader {
            body["leader"] = json!(leader);
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Unauthenticated(message) => {
                Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
            }
            denied @ Denied::PermissionDenied { .. } => Self::new(
                StatusCode::FORBIDDEN,
                "permission_denied",
                denied.to_string(),
            ),
        }
    }
}

impl From<InvalidInput> for ApiError {
    fn from(error: InvalidInput) -> Self {
        Self::bad_request(error.0)
    }
}

impl From<CoordinatorError> for ApiError {
    fn from(error: CoordinatorError) -> Self {
        let message = error.to_string();
        let (status, code) = match error {
            CoordinatorError::Lease(LeaseError::InvalidInput(_)) => {
                (StatusCode::BAD_REQUEST, "invalid_argument")
            }
            CoordinatorError::Lease(LeaseError::Held { .. })
            | CoordinatorError::WaitTimedOut { .. } => (StatusCode::CONFLICT, "lock_held"),
            CoordinatorError::Lease(LeaseError::TooManyWaiters { .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_waiters")
            }
            CoordinatorError::Lease(LeaseError::PrincipalLimit { .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "principal_limit")
            }
            CoordinatorError::Lease(LeaseError::UnknownLease(_)) => {
                (StatusCode::NOT_FOUND, "unknown_lease")
            }
            CoordinatorError::Lease(LeaseError::EpochsExhausted { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "epochs_exhausted")
            }
            CoordinatorError::Lease(LeaseError::NotHolder(_))
            | CoordinatorError::LostRight { .. } => (StatusCode::FORBIDDEN, "permission_denied"),
            CoordinatorError::Lease(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
            CoordinatorError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            CoordinatorError::Refused(_) => (StatusCode::CONFLICT, "refused_by_policy"),
            CoordinatorError::NotLeader { leader } => {
                let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", message);
                error.leader = leader.map(|l| l.url);
                return error;
            }
        };
        Self::new(status, code, message)
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "invalid_body"
        };
        Self::new(status, code, rejection.body_text())
    }
}
