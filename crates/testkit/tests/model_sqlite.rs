//! Random operation sequences on SQLite compared with the memory backend.

#[tokio::test]
async fn sqlite_matches_the_memory_model() {
    for seed in kine_testkit::model::seeds(4) {
        println!("model seed {seed}");
        let dir = kine_testkit::TempDir::new("model");
        kine_testkit::model::run(seed, 1000, kine_testkit::sqlite(dir.path()), kine_testkit::memory()).await;
    }
}
