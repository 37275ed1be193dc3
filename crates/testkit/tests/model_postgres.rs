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

/// The same with every statement sent unnamed (pgx's parameter for PgBouncer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_unnamed_statements_matches_the_memory_model() {
    let server = kine_testkit::postgres::PgServer::start();
    let seed = kine_testkit::model::seeds(1)[0];
    println!("model seed {seed}");
    let backend = kine_testkit::postgres_at(format!("{}&default_query_exec_mode=simple_protocol", server.url("model")));
    kine_testkit::model::run(seed, 1000, backend.clone(), kine_testkit::memory()).await;
    backend.close().await;
}
