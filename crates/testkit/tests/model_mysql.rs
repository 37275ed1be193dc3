//! Random operation sequences on MySQL (MariaDB) compared with the memory backend.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_matches_the_memory_model() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    for seed in kine_testkit::model::seeds(2) {
        println!("model seed {seed}");
        let backend = kine_testkit::mysql(&server, &format!("model{seed}"));
        kine_testkit::model::run(seed, 1000, backend.clone(), kine_testkit::memory()).await;
        backend.close().await;
    }
}
