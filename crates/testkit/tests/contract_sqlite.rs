//! The backend contract on `sqlite://`.
kine_testkit::contract_tests!({
    let dir = kine_testkit::TempDir::new("contract");
    (kine_testkit::sqlite(dir.path()), dir)
});
