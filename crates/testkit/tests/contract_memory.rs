//! The backend contract on `memory://`.
kine_testkit::contract_tests!((kine_testkit::memory(), ()));
