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
