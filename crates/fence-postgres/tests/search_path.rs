//! P2/P5: the adapter's own statements resolve PostgreSQL's operators whatever a DBA puts in
//! the writer role's search_path. `ALTER ROLE … SET search_path = shadowops, pg_catalog, public`
//! with a shadow `<` and `<=` on bigint in `shadowops` turned the adapter's
//! `… WHERE epoch < EXCLUDED.epoch` around, and a stale write to `palisade_kv` was accepted
//! (Palisade's own tables have no raise trigger). The pool's sessions now put Palisade's schema
//! and then `pg_catalog` first (`PINNED_SESSION`).

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, FencedResource, Outcome, Rejection, Verifier, Write};
use palisade_fence_postgres::PostgresFence;

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn p2_a_writer_roles_shadow_operators_do_not_turn_the_adapters_comparison_around() {
    let base = common::postgres_url();
    let name = format!("shadow_kv_{}", std::process::id());
    let role = format!("{name}_fence");
    let admin = connect(&base).await;
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role} LOGIN"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let url = format!("{prefix}/{name}");
    let signer = TokenSigner::from_secret_bytes(&[31; 32]);
    let verifier = || Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    // The owner applies the migrations; then the DBA's shadow schema and the role's path.
    drop(
        PostgresFence::connect(&url, 1, FenceMode::Strict, verifier())
            .await
            .unwrap(),
    );
    let db = connect(&url).await;
    db.batch_execute(&format!(
        "CREATE SCHEMA shadowops;
         CREATE FUNCTION shadowops.ne(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE
             AS 'SELECT $1 <> $2';
         CREATE OPERATOR shadowops.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = shadowops.ne);
         CREATE OPERATOR shadowops.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = shadowops.ne);
         GRANT USAGE ON SCHEMA shadowops TO PUBLIC;
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role};
         ALTER ROLE {role} IN DATABASE {name} SET search_path = shadowops, pg_catalog, public;"
    ))
    .await
    .unwrap();
    let as_role = url.replacen("://postgres@", &format!("://{role}@"), 1);
    let fence = PostgresFence::connect(&as_role, 1, FenceMode::Strict, verifier())
        .await
        .unwrap()
        .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
    let lock = LockName::new("shadow/kv").unwrap();
    let token = |epoch| {
        signer.sign(
            &lock,
            Epoch(epoch),
            &HolderId::new("w").unwrap(),
            &Principal::anonymous(),
            0,
        )
    };
    let write = |token: &str| {
        let token = token.to_owned();
        let (fence, lock) = (fence.clone(), lock.clone());
        async move {
            let write = Write {
                lock: &lock,
                key: "k",
                token: &token,
                seq: None,
                value: b"v",
            };
            fence.write(write).await.unwrap()
        }
    };
    assert!(matches!(write(&token(9)).await, Outcome::Accepted { .. }));
    let stale = write(&token(5)).await;
    assert!(
        matches!(stale, Outcome::Rejected(Rejection::StaleEpoch { .. })),
        "{stale:?}"
    );
    drop(fence);
    drop(db);
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("DROP ROLE IF EXISTS {role}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
}
