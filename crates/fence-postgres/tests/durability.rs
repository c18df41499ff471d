//! The adapter's connections keep what they acknowledge (issue 26, item 5; P5, P8): a role,
//! database or server that turned `synchronous_commit` off does not reach Palisade's pool,
//! and a stronger choice (`remote_apply`) is kept.

use palisade_fence_postgres::durable_pool;

fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
        "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a throwaway \
         PostgreSQL on loopback and sets it",
    )
}

async fn setting(url: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn p8_a_role_with_synchronous_commit_off_commits_durably_through_the_pool() {
    let url = postgres_url();
    let id = std::process::id();
    let (off, strong) = (format!("sync_off_{id}"), format!("sync_apply_{id}"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {off}; DROP ROLE IF EXISTS {strong};
             CREATE ROLE {off} LOGIN; ALTER ROLE {off} SET synchronous_commit = off;
             CREATE ROLE {strong} LOGIN; ALTER ROLE {strong} SET synchronous_commit = remote_apply;"
        ))
        .await
        .unwrap();
    let as_role =
        |role: &str| url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert!(
        as_role(&off).contains(&off),
        "the test URL names the postgres user: {url}"
    );

    // A plain connection as that role commits without waiting for the WAL flush …
    assert_eq!(setting(&as_role(&off)).await, "off");
    // … the pool's connections do wait, and a stronger setting is left alone.
    for (role, expected) in [(&off, "on"), (&strong, "remote_apply")] {
        let pool = durable_pool(&as_role(role), 2).unwrap();
        for _ in 0..2 {
            let pooled = pool.get().await.unwrap();
            let shown: String = pooled
                .query_one("SHOW synchronous_commit", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(shown, expected, "{role}");
        }
    }
    client
        .batch_execute(&format!("DROP ROLE {off}; DROP ROLE {strong};"))
        .await
        .unwrap();
}
