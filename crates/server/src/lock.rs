//! etcd's Lock service (v3lock): Lock and Unlock, over the recipe in `kine_core::lock`.

use crate::Context;
use crate::credentials::{require_key, require_recipe};
use crate::error::{status, status_via_client, via_client};
use kine_core::Error;
use kine_proto::v3lockpb as pb;
use tonic::{Request, Response, Status};

pub struct LockService(pub Context);

#[tonic::async_trait]
impl pb::lock_server::Lock for LockService {
    async fn lock(&self, request: Request<pb::LockRequest>) -> Result<Response<pb::LockResponse>, Status> {
        require_recipe(&self.0, &request, &request.get_ref().name, true).map_err(via_client)?;
        let req = request.into_inner();
        let mut shutdown = self.0.shutdown.clone();
        // A Lock can wait for ever; a stopping server ends it (the waiter is withdrawn).
        let held = tokio::select! {
            held = kine_core::lock::lock(&self.0.store, &req.name, req.lease) => held.map_err(status_via_client)?,
            _ = shutdown.wait() => return Err(status(Error::Unavailable("etcdserver: server stopped".into()))),
        };
        Ok(Response::new(pb::LockResponse { header: self.0.headers.at(held.revision), key: held.key }))
    }

    async fn unlock(&self, request: Request<pb::UnlockRequest>) -> Result<Response<pb::UnlockResponse>, Status> {
        require_key(&self.0, &request, &request.get_ref().key).map_err(via_client)?;
        let revision =
            kine_core::lock::unlock(&self.0.store, request.into_inner().key).await.map_err(status_via_client)?;
        Ok(Response::new(pb::UnlockResponse { header: self.0.headers.at(revision) }))
    }
}
