use super::*;

fn files(auth: &str, acl: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let auth_path = dir.path().join("auth");
    let acl_path = dir.path().join("acl");
    std::fs::write(&auth_path, auth).unwrap();
    std::fs::write(&acl_path, acl).unwrap();
    (dir, auth_path, acl_path)
}

fn lock(name: &str) -> LockName {
    LockName::new(name).unwrap()
}

fn sample() -> (tempfile::TempDir, Auth) {
    let auth = format!(
        "# principals\norders {}\nops {}\ngrafana {}  # read-only\n",
        hash_secret("s-orders"),
        hash_secret("s-ops"),
        hash_secret("s-grafana")
    );
    let acl = "orders acquire orders/\nops admin *\ngrafana read *\n";
    let (dir, auth_path, acl_path) = files(&auth, acl);
    (dir, Auth::from_files(&auth_path, &acl_path).unwrap())
}

#[test]
fn p2_missing_or_wrong_credentials_are_unauthenticated() {
    let (_dir, auth) = sample();
    assert!(matches!(
        auth.authenticate(None, None),
        Err(Denied::Unauthenticated(_))
    ));
    assert!(matches!(
        auth.authenticate(Some(b"Bearer nope"), None),
        Err(Denied::Unauthenticated(_))
    ));
    assert!(matches!(
        auth.authenticate(Some(b"Basic s-orders"), None),
        Err(Denied::Unauthenticated(_))
    ));
    let caller = auth.authenticate(Some(b"Bearer s-orders"), None).unwrap();
    assert_eq!(caller.principal().as_str(), "orders");
}

/// Issue 26, item 9: `jobs/` grants the locks under jobs/ and nothing that merely starts
/// with the same letters; `=NAME` grants one lock; a rule without a trailing `/` is refused
/// at load, naming the line and the fix.
#[test]
fn p2_acl_rules_match_whole_path_segments() {
    let auth = format!("jobs {}\n", hash_secret("s-jobs"));
    let acl = "jobs acquire jobs/\njobs read report/*\njobs acquire =daily\n";
    let (_dir, auth_path, acl_path) = files(&auth, acl);
    let auth = Auth::from_files(&auth_path, &acl_path).unwrap();
    let jobs = auth.authenticate(Some(b"Bearer s-jobs"), None).unwrap();
    for (name, right, granted) in [
        ("jobs/7", Right::Acquire, true),
        ("jobs/a/b", Right::Acquire, true),
        ("jobs-secret", Right::Read, false),
        ("jobsadmin/x", Right::Read, false),
        ("jobs", Right::Read, false),
        ("report/1", Right::Read, true),
        ("report/1", Right::Acquire, false),
        ("reports/1", Right::Read, false),
        ("daily", Right::Acquire, true),
        ("daily/x", Right::Read, false),
        ("dailyx", Right::Read, false),
    ] {
        assert_eq!(
            jobs.can(right, Some(&lock(name))),
            granted,
            "{name} {right:?}"
        );
    }
    assert!(!jobs.can(Right::Read, None), "no rule covers every lock");
    for (rule, needle) in [
        ("jobs acquire jobs\n", "\"jobs/\""),
        ("jobs acquire jobs*\n", "\"=jobs\""),
        ("jobs acquire jo*bs/\n", "ambiguous"),
        ("jobs acquire report/7\n", "\"=report/7\""),
    ] {
        let (_dir, auth_path, acl_path) = files("", rule);
        let error = Auth::from_files(&auth_path, &acl_path)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("acl:1") && error.contains(needle),
            "{rule}: {error}"
        );
    }
}

#[test]
fn p2_rights_nest_and_follow_prefixes() {
    let (_dir, auth) = sample();
    let orders = auth.authenticate(Some(b"Bearer s-orders"), None).unwrap();
    assert!(orders.can(Right::Acquire, Some(&lock("orders/7"))));
    assert!(orders.can(Right::Read, Some(&lock("orders/7"))));
    assert!(!orders.can(Right::Acquire, Some(&lock("billing/7"))));
    assert!(!orders.can(Right::Admin, None));
    assert_eq!(
        orders.lease_actor(),
        Some(Principal::new("orders").unwrap())
    );
    let grafana = auth.authenticate(Some(b"Bearer s-grafana"), None).unwrap();
    assert!(grafana.can(Right::Read, Some(&lock("billing/7"))));
    assert!(grafana
        .require(Right::Acquire, Some(&lock("orders/7")))
        .is_err());
    let ops = auth.authenticate(Some(b"Bearer s-ops"), None).unwrap();
    assert!(ops.can(Right::Acquire, Some(&lock("anything"))));
    assert_eq!(ops.lease_actor(), None);
}

#[test]
fn p2_an_open_coordinator_never_lists_lease_ids() {
    let open = Caller::open();
    assert!(open.can(Right::Admin, None));
    let lease = Lease {
        id: palisade_core::LeaseId(7),
        lock: lock("a"),
        holder: palisade_core::HolderId::new("h").unwrap(),
        principal: Principal::anonymous(),
        epoch: palisade_core::Epoch(1),
        ttl_ms: 100,
        class: palisade_core::LockClass::Critical,
        request_id: None,
        expires_at: 0,
        granted_unix_ms: 0,
        renewed_unix_ms: 0,
    };
    assert!(!open.sees_lease_id(&lease));
    // Renew and release are still checked against the lease's principal.
    assert_eq!(open.lease_actor(), Some(Principal::anonymous()));
}

#[test]
fn limits_have_defaults_a_line_sets_them_and_an_open_coordinator_has_none() {
    let (_dir, auth_path, acl_path) = files(
        &format!(
            "orders {}\nops {}\n",
            hash_secret("s-orders"),
            hash_secret("s-ops")
        ),
        "orders acquire orders/\norders limits leases=2,watches=1\nops admin *\n",
    );
    let auth = Auth::from_files(&auth_path, &acl_path).unwrap();
    let orders = auth.authenticate(Some(b"Bearer s-orders"), None).unwrap();
    let ops = auth.authenticate(Some(b"Bearer s-ops"), None).unwrap();
    assert_eq!(auth.limit(&orders, Limited::Leases), Some(2));
    // A limit the line leaves out keeps its default.
    assert_eq!(auth.limit(&orders, Limited::Waiters), Some(128));
    assert_eq!(auth.limit(&ops, Limited::Leases), Some(10_000));
    let first = auth.admit(&orders, Limited::Watches).unwrap();
    let refused = auth.admit(&orders, Limited::Watches).err().unwrap();
    assert_eq!((refused.what, refused.limit), (Limited::Watches, 1));
    assert!(refused.to_string().contains("orders limits watches=N"));
    // Another principal's slots are its own.
    assert!(auth.admit(&ops, Limited::Watches).unwrap().is_some());
    drop(first);
    assert!(auth.admit(&orders, Limited::Watches).unwrap().is_some());
    let open = Auth::open();
    assert_eq!(open.limit(&Caller::open(), Limited::Leases), None);
    assert!(open
        .admit(&Caller::open(), Limited::Waiters)
        .unwrap()
        .is_none());
}

#[test]
fn the_probe_names_a_principal_that_may_acquire_the_lock_an_admin_last() {
    let (_dir, auth) = sample();
    assert_eq!(
        auth.probe_principal(&lock("orders/x")),
        Some(Principal::new("orders").unwrap())
    );
    // Only the admin may acquire billing/…; grafana may only read.
    assert_eq!(
        auth.probe_principal(&lock("billing/x")),
        Some(Principal::new("ops").unwrap())
    );
    let (_dir, auth_path, acl_path) = files("", "grafana read *\n");
    let nobody = Auth::load(Some(&auth_path), &acl_path).unwrap();
    assert_eq!(nobody.probe_principal(&lock("orders/x")), None);
    assert_eq!(
        Auth::open().probe_principal(&lock("orders/x")),
        Some(Principal::anonymous())
    );
}

#[test]
fn bad_files_name_the_line_and_a_failed_reload_keeps_the_policy() {
    for (auth, acl, needle) in [
        ("orders\n", "", "auth:1"),
        ("orders md5:00\n", "", "auth:1"),
        ("a b c\n", "", "auth:1"),
        ("", "orders write orders/\n", "acl:1"),
        ("", "\n\nops admin orders/\n", "acl:3"),
        ("", "orders acquire bad%prefix\n", "acl:1"),
        ("", "orders limits waiters=0\n", "acl:1"),
        ("", "orders limits sockets=3\n", "acl:1"),
        ("", "orders limits leases=100001\n", "acl:1"),
        ("", "orders limits waiters\n", "acl:1"),
        (
            "",
            "orders limits waiters=2\norders limits watches=2\n",
            "acl:2",
        ),
    ] {
        let (_dir, auth_path, acl_path) = files(auth, acl);
        let error = Auth::from_files(&auth_path, &acl_path).unwrap_err();
        assert!(error.to_string().contains(needle), "{error}");
    }
    let (dir, auth) = sample();
    std::fs::write(dir.path().join("acl"), "orders everything *\n").unwrap();
    assert!(auth.reload().is_err());
    assert!(auth
        .authenticate(Some(b"Bearer s-orders"), None)
        .unwrap()
        .can(Right::Acquire, Some(&lock("orders/1"))));
    std::fs::write(dir.path().join("acl"), "orders read *\n").unwrap();
    let orders = auth.authenticate(Some(b"Bearer s-orders"), None).unwrap();
    assert!(auth.is_current(&orders));
    assert_eq!(auth.reload().unwrap(), (3, 1));
    assert!(!auth
        .authenticate(Some(b"Bearer s-orders"), None)
        .unwrap()
        .can(Right::Acquire, Some(&lock("orders/1"))));
}

#[test]
fn p2_a_principal_removed_by_a_reload_is_no_longer_current() {
    let (dir, auth) = sample();
    let ops = auth.authenticate(Some(b"Bearer s-ops"), None).unwrap();
    assert!(auth.is_current(&ops));
    let remaining = format!("orders {}\n", hash_secret("s-orders"));
    std::fs::write(dir.path().join("auth"), remaining).unwrap();
    auth.reload().unwrap();
    assert!(!auth.is_current(&ops));
    assert!(auth.authenticate(Some(b"Bearer s-ops"), None).is_err());
    assert!(Auth::open().is_current(&Caller::open()));
}

#[test]
fn p2_a_client_certificate_authenticates_its_principal_and_a_bearer_wins_over_it() {
    let (dir, auth) = sample();
    let cert = |name: &str| CertificatePrincipal(Principal::new(name).unwrap());
    // Certificates need no auth-file line: the client CA vouches for the name.
    let by_cert = auth.authenticate(None, Some(&cert("grafana"))).unwrap();
    assert_eq!(by_cert.principal().as_str(), "grafana");
    assert!(by_cert.can(Right::Read, Some(&lock("x"))));
    assert!(!by_cert.can(Right::Acquire, Some(&lock("x"))));
    // A certified name the ACL does not know has no right at all.
    let stranger = auth.authenticate(None, Some(&cert("stranger"))).unwrap();
    assert!(!stranger.can(Right::Read, Some(&lock("x"))));
    // A bearer on a certified connection is the caller; a wrong one is not excused.
    let ops = auth
        .authenticate(Some(b"Bearer s-ops"), Some(&cert("grafana")))
        .unwrap();
    assert_eq!(ops.principal().as_str(), "ops");
    assert!(auth
        .authenticate(Some(b"Bearer nope"), Some(&cert("grafana")))
        .is_err());
    // Removed from the ACL: its streams stop.
    assert!(auth.is_current(&by_cert));
    std::fs::write(dir.path().join("acl"), "orders read *\n").unwrap();
    auth.reload().unwrap();
    assert!(!auth.is_current(&by_cert));
    // An open coordinator ignores certificates as it ignores bearers.
    let open = Auth::open()
        .authenticate(None, Some(&cert("grafana")))
        .unwrap();
    assert_eq!(open.principal(), &Principal::anonymous());
}

#[test]
fn certificates_only_needs_no_auth_file() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl");
    std::fs::write(&acl, "orders acquire orders/\n").unwrap();
    let auth = Auth::load(None, &acl).unwrap();
    assert!(auth.is_enabled());
    assert!(auth.authenticate(Some(b"Bearer anything"), None).is_err());
    assert!(auth.authenticate(None, None).is_err());
    assert_eq!(auth.reload().unwrap(), (0, 1));
}

#[test]
fn two_secrets_may_name_one_principal_during_rotation() {
    let auth = format!(
        "orders {}\norders {}\n",
        hash_secret("old"),
        hash_secret("new")
    );
    let (_dir, auth_path, acl_path) = files(&auth, "orders read *\n");
    let auth = Auth::from_files(&auth_path, &acl_path).unwrap();
    assert!(auth.authenticate(Some(b"Bearer old"), None).is_ok());
    assert!(auth.authenticate(Some(b"Bearer new"), None).is_ok());
}
