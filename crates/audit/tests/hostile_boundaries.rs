//! A boundary that lies, shouts or points elsewhere cannot make the audit hang, eat memory or
//! follow it: it is reported as not answering.

use palisade_audit::observe::{http_client, observe, probe_resource, MAX_ANSWER_BYTES};
use palisade_audit::policy::Boundary;
use palisade_audit::Probe;

/// Serves `app` on a loopback port; its URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn resource(url: &str) -> Boundary {
    Boundary::Resource {
        url: url.to_owned(),
    }
}

#[tokio::test]
async fn redirects_huge_answers_and_non_json_are_reported_not_followed() {
    use axum::routing::get;
    let http = http_client();
    // Elsewhere: a store that would say everything is fine.
    let elsewhere = serve(axum::Router::new().route(
        "/v1/info",
        get(|| async { axum::Json(serde_json::json!({"restore_required": false})) }),
    ))
    .await;
    let target = format!("{elsewhere}/v1/info");
    let redirecting = serve(axum::Router::new().route(
        "/v1/info",
        get(move || {
            let target = target.clone();
            async move { axum::response::Redirect::temporary(&target) }
        }),
    ))
    .await;
    let report = observe(&http, &resource(&redirecting), vec![], &[]).await;
    assert!(!report.reachable, "a redirect was followed: {report:?}");

    let huge = serve(axum::Router::new().route(
        "/v1/info",
        get(|| async { "x".repeat(MAX_ANSWER_BYTES + 1) }),
    ))
    .await;
    let report = observe(&http, &resource(&huge), vec![], &[]).await;
    assert!(!report.reachable);
    assert!(report.error.unwrap().contains("bytes"));

    let garbage = serve(axum::Router::new().route("/v1/info", get(|| async { "<html>" }))).await;
    let report = observe(&http, &resource(&garbage), vec![], &[]).await;
    assert!(!report.reachable);
    assert!(report.error.unwrap().contains("not JSON"));

    // The probe of a store that is not one fails; it is never counted as refused.
    let probe = probe_resource(&http, &garbage, "palisade-probe/audit", (1, "a"), (2, "b")).await;
    assert!(matches!(probe, Probe::Failed { .. }), "{probe:?}");
}

/// A store that lies to the probe (issue 26, item 4): one that refuses only the audit's old
/// fixed lock, one that refuses for the wrong reason, and one without strict mode's lock-wide
/// rule. None may pass. Tokens are opaque to these stores: "old" and "new" stand for an older
/// and a newer epoch.
#[tokio::test]
async fn p5_a_store_that_refuses_only_the_probe_or_for_another_reason_does_not_pass() {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Copy)]
    enum Lie {
        /// Refuses old tokens only under `palisade-probe/`.
        OnlyTheProbeLock,
        /// Refuses old tokens with 409 invalid_token.
        WrongReason,
        /// Refuses old tokens only on keys the new one wrote.
        PerKeyOnly,
        /// Refuses old tokens only on what looked like the probe before: the body `probe`,
        /// a key or a lock name part of 16 hex digits, a `palisade-probe/` lock.
        TheProbesShape,
        /// Does what a strict store does.
        Honest,
    }
    fn probe_shaped(lock: &str, key: &str, body: &str) -> bool {
        let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        body == "probe"
            || hex16(key)
            || lock.starts_with("palisade-probe/")
            || lock.rsplit('/').next().is_some_and(hex16)
    }
    type Written = Arc<Mutex<HashSet<(String, String)>>>;
    async fn store(lie: Lie) -> String {
        let written: Written = Arc::default();
        let app = axum::Router::new()
            .route(
                "/v1/info",
                get(|| async { axum::Json(serde_json::json!({"mode": "strict"})) }),
            )
            .route(
                "/v1/kv/{lock}/{key}",
                put(
                    move |State(written): State<Written>,
                          Path((lock, key)): Path<(String, String)>,
                          headers: HeaderMap,
                          body: String| async move {
                        let token = headers["palisade-token"].to_str().unwrap().to_owned();
                        let mut written = written.lock().unwrap();
                        let lock_written = written.iter().any(|(l, _)| *l == lock);
                        let key_written = written.contains(&(lock.clone(), key.clone()));
                        let refuse = token == "old"
                            && match lie {
                                Lie::OnlyTheProbeLock => lock.starts_with("palisade-probe/"),
                                Lie::TheProbesShape => probe_shaped(&lock, &key, &body),
                                Lie::WrongReason | Lie::Honest => lock_written,
                                Lie::PerKeyOnly => key_written,
                            };
                        if token == "new" {
                            written.insert((lock, key));
                        }
                        let reason = match lie {
                            Lie::WrongReason => "invalid_token",
                            _ => "stale_epoch",
                        };
                        if refuse {
                            (
                                StatusCode::CONFLICT,
                                axum::Json(serde_json::json!({"error": reason, "fence": "2"})),
                            )
                        } else {
                            (StatusCode::OK, axum::Json(serde_json::json!({})))
                        }
                    },
                ),
            )
            .with_state(written);
        serve(app).await
    }
    let http = http_client();
    let lock = palisade_audit::observe::probe_lock(Some("invoice/*"), &[], |_| true);
    for (lie, expected) in [
        (Lie::OnlyTheProbeLock, "accepted"),
        (Lie::TheProbesShape, "accepted"),
        (Lie::WrongReason, "failed"),
        (Lie::PerKeyOnly, "accepted"),
        (Lie::Honest, "refused"),
    ] {
        let url = store(lie).await;
        let probe = probe_resource(&http, &url, &lock, (1, "old"), (2, "new")).await;
        assert_eq!(probe.result(), expected, "{probe:?}");
    }
}

/// The probe's lock is shaped like the boundary's real ones (`invoice/` and digits here),
/// an exact name is probed on itself, and only a name another rule decides falls back to the
/// probe's own prefix.
#[test]
fn p5_the_probes_lock_is_shaped_like_the_boundarys_locks() {
    let recent = ["invoice/2041".to_owned(), "report/77".to_owned()];
    let lock = palisade_audit::observe::probe_lock(Some("invoice/*"), &recent, |_| true);
    let part = lock.strip_prefix("invoice/").expect("the pattern's prefix");
    assert!(
        part.len() >= 8 && part.bytes().all(|b| b.is_ascii_digit()),
        "{lock}"
    );
    // A short real part is extended in its kind, never the real lock itself.
    let short = ["report/1".to_owned()];
    for _ in 0..100 {
        let lock = palisade_audit::observe::probe_lock(Some("report/*"), &short, |_| true);
        let part = lock.strip_prefix("report/").expect("the pattern's prefix");
        assert!(
            part.len() >= 8 && part.bytes().all(|b| b.is_ascii_digit()),
            "{lock}"
        );
    }
    let exact = palisade_audit::observe::probe_lock(Some("nightly-report"), &recent, |_| true);
    assert_eq!(exact, "nightly-report");
    let own = palisade_audit::observe::probe_lock(Some("invoice/*"), &recent, |_| false);
    assert!(own.starts_with("palisade-probe/"), "{own}");
}
