//! The MySQL events query finds a resumed watch's previous versions for many keys in batches: a
//! window whose first changes touch 2,100 keys asks for their versions before the window in
//! three statements (of at most 1,000 keys each), and every event carries the right one.

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
