//! What the object-storage tests share: a store on a folder of the test server's `kine` bucket.

use kine_objstore::{ObjectStore, S3Config, S3Store, StaticKeys};
use kine_testkit::s3::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::sync::Arc;

pub async fn store(server: &S3Server, folder: &str) -> Arc<dyn ObjectStore> {
    let config = S3Config {
        bucket: "kine".into(),
        folder: folder.into(),
        endpoint: Some(server.endpoint()),
        region: REGION.into(),
        keys: Some(StaticKeys::new(ACCESS_KEY, SECRET_KEY)),
        ca_bundle: None,
    };
    Arc::new(S3Store::connect(&config).await.unwrap())
}
