//! The etcd KV service.

use crate::Context;
use crate::convert;
use crate::credentials::caller;
use crate::error::status;
use kine_core::auth::Caller;
use kine_core::{Error, validate};
use kine_proto::etcdserverpb as pb;
use prost::Message;
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct KvService(pub Context);

impl KvService {
    /// etcd rejects writes larger than `--max-request-bytes`.
    fn check_size(&self, msg: &impl Message) -> Result<(), Status> {
        if msg.encoded_len() > self.0.config.max_request_bytes {
            return Err(status(Error::RequestTooLarge));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::kv_server::Kv for KvService {
    async fn range(&self, request: Request<pb::RangeRequest>) -> Result<Response<pb::RangeResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let request = request.into_inner();
        let drop_lease = crate::emulation::drops_lease(&request);
        let req = convert::range_request(request).map_err(status)?;
        if who != Caller::Anyone {
            validate::range(&req).map_err(status)?;
            self.0.store.auth().check_read(&who, &req.range).map_err(status)?;
        }
        let r = self.0.store.range(req).await.map_err(status)?;
        let mut response = self.0.headers.range_response(r.value, r.revision);
        if self.0.config.keys_only_without_lease() {
            crate::emulation::range(drop_lease, &mut response.kvs);
        }
        Ok(Response::new(response))
    }

    type RangeStreamStream = Pin<Box<dyn Stream<Item = Result<pb::RangeStreamResponse, Status>> + Send>>;

    async fn range_stream(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let who = caller(&self.0, &request)?;
        let parts = crate::range_stream::serve(&self.0, &who, request.into_inner()).await?;
        Ok(Response::new(Box::pin(parts)))
    }

    async fn put(&self, request: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let req = request.into_inner();
        self.check_size(&req)?;
        let req = convert::put_request(req);
        if who != Caller::Anyone {
            validate::put(&req).map_err(status)?;
            self.0.store.auth().check_put(&who, &req).await.map_err(status)?;
        }
        let r = self.0.store.put(req).await.map_err(|e| status(crate::emulation::lease_first(e)))?;
        Ok(Response::new(self.0.headers.put_response(r.value, r.revision)))
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let req = request.into_inner();
        self.check_size(&req)?;
        let req = convert::delete_request(req);
        if who != Caller::Anyone {
            validate::delete_range(&req).map_err(status)?;
            self.0.store.auth().check_delete(&who, &req).map_err(status)?;
        }
        let r = self.0.store.delete_range(req).await.map_err(status)?;
        Ok(Response::new(self.0.headers.delete_response(r.value, r.revision)))
    }

    async fn txn(&self, request: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let req = request.into_inner();
        self.check_size(&req)?;
        // Only needed to adjust the answer to the version emulated.
        let original = self.0.config.keys_only_without_lease().then(|| req.clone());
        let req = convert::txn_request(req).map_err(status)?;
        if who != Caller::Anyone {
            validate::txn(&req).map_err(status)?;
            self.0.store.auth().check_txn(&who, &req).await.map_err(status)?;
        }
        let lease_first = self.0.config.txn_checks_lease_first();
        let r = self
            .0
            .store
            .txn(req)
            .await
            .map_err(|e| status(if lease_first { crate::emulation::lease_first(e) } else { e }))?;
        let mut response = self.0.headers.txn_response(r.value, r.revision);
        if let Some(original) = original {
            crate::emulation::txn(&original, &mut response);
        }
        Ok(Response::new(response))
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let who = caller(&self.0, &request)?;
        self.0.store.auth().admin(&who).map_err(status)?;
        let req = request.into_inner();
        // Without `physical`, the answer may come before the superseded versions are gone (as
        // in etcd, reads below the revision are refused either way).
        let revision = self.0.store.compact_with(req.revision, req.physical).await.map_err(status)?;
        Ok(Response::new(pb::CompactionResponse { header: self.0.headers.at(revision) }))
    }
}
