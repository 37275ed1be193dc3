//! Keys whose NATS subject is longer than the servers' protocol line allows: refused up front
//! with InvalidArgument naming the limit, on an external nats-server and on the embedded one,
//! while another client's writes go on untouched (publishing such a subject would get the
//! connection closed, "maximum control line exceeded", failing every request in flight). Keys
//! up to the limit work end to end (stored, read, watched).

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::nats::NatsServer;
use std::time::{Duration, Instant};

async fn long_keys(server: &Server) {
    let mut c = server.client().await;
    // Another client writes all along.
    let other = {
        let mut o = server.client().await;
        tokio::spawn(async move {
            let mut failed = 0;
            for i in 0..400 {
                if o.put(format!("/small/{i}"), "v", None).await.is_err() {
                    failed += 1;
                }
            }
            failed
        })
    };
    let mut w = c.watch("/long/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    w.message().await.unwrap();
    // Letters and digits: a key's bytes are its subject's. 3,000 fits, 4,096 does not.
    let fits = format!("/long/{}", "a".repeat(3000));
    let rev = c.put(fits.as_str(), "v", None).await.unwrap().header().unwrap().revision();
    assert_eq!(c.get(fits.as_str(), None).await.unwrap().kvs()[0].mod_revision(), rev);
    let event = tokio::time::timeout(Duration::from_secs(5), w.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(event.events()[0].kv().unwrap().key(), fits.as_bytes());
    for (what, key) in [
        ("4,096 bytes", format!("/long/{}", "a".repeat(4090))),
        ("100 KB", format!("/long/{}", "b".repeat(100_000))),
        // Other bytes are encoded (base64url): 2,900 bytes make a subject of about 3,900.
        ("2,900 bytes encoded", format!("/long/{}", "\u{e9}".repeat(1450))),
    ] {
        let started = Instant::now();
        let e = c.put(key.as_str(), "v", None).await.unwrap_err();
        let Error::GRpcStatus(s) = e else { panic!("{what}: {e:?}") };
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{what}: {}", s.message());
        assert!(
            s.message().contains("the NATS datastore takes subjects of at most 3580 bytes"),
            "{what}: {}",
            s.message()
        );
        assert!(started.elapsed() < Duration::from_secs(1), "{what}: {:?}", started.elapsed());
        // Also inside a Txn, and with a delete of such a key (an existing one: nothing else is
        // published for a key that does not exist).
        let txn = Txn::new().and_then([TxnOp::put("/long/ok", "v", None), TxnOp::put(key.as_str(), "v", None)]);
        let Error::GRpcStatus(s) = c.txn(txn).await.unwrap_err() else { panic!() };
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{what}");
    }
    // Nothing of the refused Txns was written; the connection was never lost.
    assert!(c.get("/long/ok", None).await.unwrap().kvs().is_empty());
    assert_eq!(other.await.unwrap(), 0, "another client's writes failed");
    assert_eq!(server.log().matches("NATS connection (re)established").count(), 1, "{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_refused_on_an_external_server() {
    let nats = NatsServer::start();
    let server = Server::start(&["--endpoint", &format!("{}?noEmbed", nats.url())]);
    long_keys(&server).await;
}

#[cfg(feature = "embedded-nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_refused_on_the_embedded_server() {
    let dir = TempDir::new("keys");
    let server = Server::start(&["--endpoint", &format!("nats://?dataDir={}", dir.path().join("nats").display())]);
    long_keys(&server).await;
}
