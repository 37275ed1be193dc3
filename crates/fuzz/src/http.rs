//! The metrics listener's HTTP side (`/metrics`, `/health` with its query): the input is the
//! raw bytes a client sends on one connection, served by hyper's HTTP/1 connection with
//! kine-server's handler over an in-memory pipe and a memory store, as kine-rs serves them
//! over TCP. Whatever the bytes, the connection must end (answered or refused) within 10 s.

use kine_core::memory::MemoryBackend;
use kine_core::store::{Store, StoreOptions};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(10);

struct Harness {
    runtime: tokio::runtime::Runtime,
    store: Arc<Store>,
}

static HARNESS: OnceLock<Harness> = OnceLock::new();

fn harness() -> &'static Harness {
    HARNESS.get_or_init(|| {
        crate::abort_on_panic();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = runtime.block_on(async {
            Store::open(Arc::new(MemoryBackend::new()), StoreOptions::default()).await.expect("a memory store")
        });
        Harness { runtime, store }
    })
}

pub fn http(data: &[u8]) {
    http_exchange(data);
}

/// What the server answered on the connection (`http` without the answer).
pub fn http_exchange(data: &[u8]) -> Vec<u8> {
    let h = harness();
    h.runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let store = h.store.clone();
        let served = tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| kine_server::http::handle(store.clone(), req));
            // The client half-closes after its bytes; the server answers what it read before
            // closing (kine-rs's listener has the default, which closes at once on a client's
            // half-close; the parsing and the handler are the same).
            let _ = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(hyper_util::rt::TokioIo::new(server), service)
                .await;
        });
        let exchange = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
            answer
        };
        let answer = tokio::time::timeout(LIMIT, exchange).await.expect("the connection ends within 10 s");
        tokio::time::timeout(LIMIT, served).await.expect("the server side ends within 10 s").unwrap();
        answer
    })
}
