//! Random operation sequences on PostgreSQL compared with the memory backend.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_matches_the_memory_model() {
    let server = kine_testkit::postgres::PgServer::start();
    for seed in kine_testkit::model::seeds(2) {
        println!("model seed {seed}");
        let backend = kine_testkit::postgres(&server, &format!("model{seed}"));
        kine_testkit::model::run(seed, 1000, backend.clone(), kine_testkit::memory()).await;
        backend.close().await;
    }
}
