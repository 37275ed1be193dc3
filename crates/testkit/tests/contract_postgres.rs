//! The backend contract on `postgres://`, each check on a fresh server.
kine_testkit::contract_tests!({
    let server = kine_testkit::postgres::PgServer::start();
    (kine_testkit::postgres(&server, "contract"), server)
});
