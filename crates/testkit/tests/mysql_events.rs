//! The MySQL events query finds a resumed watch's previous versions for many keys in batches: a
//! window whose first changes touch 2,100 keys asks for their versions before the window in
//! three statements (of at most 1,000 keys each), and every event carries the right one. A
//! catch-up in consecutive windows looks each key up once, in its first window.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_versions_before_a_window_come_in_batches_of_keys() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let backend = kine_testkit::mysql(&server, "events");
    let mut feed = backend.subscribe();
    kine_testkit::contract::mid_history_write(backend.clone(), 2100).await;
    // The feed's own lookups for the writes are done before the log starts.
    let last = 2 + 3 * 2100 + 1;
    loop {
        match feed.recv().await {
            Ok(r) if r.revision == last => break,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(e) => panic!("feed: {e}"),
        }
    }
    server.root_sql("SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1");
    kine_testkit::contract::mid_history_check(backend, 2100).await;
    let lookups = server.root_sql(
        "SELECT COUNT(*) FROM mysql.general_log WHERE command_type = 'Execute' AND argument LIKE '%MAX(m.mod_revision)%'",
    );
    // The window starts halfway through the second versions: every key's first change in it
    // (a second version, or a third for the keys whose second is before the window) has its
    // previous version before the window.
    assert_eq!(lookups.trim(), "3", "previous-version statements for 2,100 keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_in_windows_looks_up_each_keys_previous_version_once() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let backend = kine_testkit::mysql(&server, "windows");
    let keys = 300;
    kine_testkit::contract::mid_history_write(backend.clone(), keys).await;
    // Version v of key i is at revision 2 + (v - 1) * keys + i; from the second round on every
    // change has a previous version.
    let (first, last) = (1 + keys, 1 + 3 * keys);
    let range = kine_testkit::contract::prefix("mid/");
    let whole = backend.events(&range, first, last).await.unwrap();
    server.root_sql("SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1");
    let mut joined = Vec::new();
    for after in (first..last).step_by(100) {
        joined.extend(backend.events(&range, after, (after + 100).min(last)).await.unwrap());
    }
    let lookups = server.root_sql(
        "SELECT COUNT(*) FROM mysql.general_log WHERE command_type = 'Execute' AND argument LIKE '%MAX(m.mod_revision)%'",
    );
    assert_eq!(joined, whole);
    // The first three windows meet each key for the first time; the next three know them all.
    assert_eq!(lookups.trim(), "3", "previous-version statements for 6 windows of 100 keys");
}
