//! The backend contract on `mysql://` (MariaDB), each check on a fresh database.
kine_testkit::contract_tests!({
    let server = kine_testkit::mysql::MariaDbServer::start();
    (kine_testkit::mysql(&server, "contract"), server)
});
