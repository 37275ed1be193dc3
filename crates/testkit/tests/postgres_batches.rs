//! The PostgreSQL writer commits the requests queued together in one transaction. A request
//! that fails in the database aborts that transaction: the batch runs again, each request in a
//! savepoint, and only the failing request fails. Here the database itself refuses one key (a
//! trigger), the way a constraint or a storage limit would.

use kine_testkit::contract::{prefix, put_req, store};
use kine_testkit::postgres::PgServer;

const POISON: &str = "poison/key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_failing_in_the_database_fails_alone_in_its_batch() {
    let server = PgServer::start();
    let backend = kine_testkit::postgres(&server, "batches");
    let s = store(backend.clone()).await;
    server.sql("postgres", "ALTER SYSTEM SET log_statement = 'all'");
    server.sql("postgres", "SELECT pg_reload_conf()");
    server.sql(
        "batches",
        &format!(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.key = convert_to('{POISON}', 'UTF8') THEN RAISE EXCEPTION 'refused by the test'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON kv FOR EACH ROW EXECUTE FUNCTION refuse_poison();"
        ),
    );
    for round in 0..10 {
        let before = backend.revisions().await.expect("revisions").current;
        let mut tasks = Vec::new();
        for i in 0..48 {
            let s = s.clone();
            let key = if i == 24 { POISON.to_string() } else { format!("k/{round}/{i}") };
            tasks.push(tokio::spawn(async move { (key.clone(), s.put(put_req(&key, "v")).await) }));
        }
        let mut revisions = Vec::new();
        for task in tasks {
            let (key, result) = task.await.expect("put task");
            match result {
                Ok(r) => {
                    assert_ne!(key, POISON, "the refused key was acknowledged");
                    revisions.push(r.revision);
                }
                Err(e) => {
                    assert_eq!(key, POISON, "{key} failed with the refused key: {e}");
                    assert!(format!("{e:?}").contains("refused by the test"), "{e:?}");
                }
            }
        }
        revisions.sort_unstable();
        let expected: Vec<i64> = (before + 1..=before + 47).collect();
        assert_eq!(revisions, expected, "round {round}: 47 puts at gap-free revisions");
        let listed = s.range(kine_core::request::RangeRequest::new(prefix(&format!("k/{round}/")))).await.unwrap();
        assert_eq!(listed.value.count, 47, "round {round}: every acknowledged put is stored");
    }
    // Savepoints are used only when a batch runs again: one per request then. More than one
    // per round means the refused request shared its transaction with others (48 concurrent
    // requests on one writer thread batch together), which this test is about.
    let savepoints = server.log().matches("statement: SAVEPOINT op").count();
    assert!(savepoints > 10, "batches with the refused request held {savepoints} requests in 10 rounds");
    backend.close().await;
}
