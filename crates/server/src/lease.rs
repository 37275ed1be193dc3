//! The etcd Lease service.

use crate::Context;
use crate::credentials::{Credentials, require_user};
use crate::error::status;
use kine_core::Error;
use kine_core::auth::PermKind;
use kine_proto::etcdserverpb as pb;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub struct LeaseService(pub Context);

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        require_user(&self.0, &request)?;
        let req = request.into_inner();
        let (id, ttl, revision) = self.0.store.lease_grant(req.id, req.ttl).await.map_err(status)?;
        Ok(Response::new(pb::LeaseGrantResponse { header: self.0.headers.at(revision), id, ttl, error: String::new() }))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let who = require_user(&self.0, &request)?;
        let id = request.into_inner().id;
        self.0.store.auth().check_lease_keys(&who, id, PermKind::Write).await.map_err(status)?;
        let revision = self.0.store.lease_revoke(id).await.map_err(status)?;
        Ok(Response::new(pb::LeaseRevokeResponse { header: self.0.headers.at(revision) }))
    }

    type LeaseKeepAliveStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let credentials = Credentials::of(&self.0, &request);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let ctx = self.0.clone();
        let mut shutdown = ctx.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let req = tokio::select! {
                    _ = shutdown.wait() => return,
                    req = inbound.next() => req,
                };
                let Some(Ok(req)) = req else { return };
                if let Err(e) = renew_permitted(&ctx, &credentials, req.id).await {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                // As etcd: an unknown or expired lease answers TTL 0.
                let ttl = match ctx.store.lease_keep_alive(req.id).await {
                    Ok(ttl) => ttl,
                    Err(Error::LeaseNotFound) => 0,
                    Err(e) => {
                        let _ = tx.send(Err(status(e))).await;
                        return;
                    }
                };
                let revision = match ctx.store.current_revision().await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(status(e))).await;
                        return;
                    }
                };
                let resp = pb::LeaseKeepAliveResponse { header: ctx.headers.at(revision), id: req.id, ttl };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let who = require_user(&self.0, &request)?;
        let req = request.into_inner();
        if req.keys {
            self.0.store.auth().check_lease_keys(&who, req.id, PermKind::Read).await.map_err(status)?;
        }
        let ttl = self.0.store.lease_time_to_live(req.id, req.keys).await.map_err(status)?;
        let revision = self.0.store.current_revision().await.map_err(status)?;
        let header = self.0.headers.at(revision);
        Ok(Response::new(match ttl {
            Some(t) => {
                pb::LeaseTimeToLiveResponse { header, id: t.id, ttl: t.ttl, granted_ttl: t.granted_ttl, keys: t.keys }
            }
            // As etcd: a missing lease is TTL -1, not an error.
            None => pb::LeaseTimeToLiveResponse { header, id: req.id, ttl: -1, granted_ttl: 0, keys: Vec::new() },
        }))
    }

    async fn lease_leases(
        &self,
        request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let who = require_user(&self.0, &request)?;
        let ids = self.0.store.lease_list();
        for id in &ids {
            self.0.store.auth().check_lease_keys(&who, *id, PermKind::Read).await.map_err(status)?;
        }
        let leases = ids.into_iter().map(|id| pb::LeaseStatus { id }).collect();
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::LeaseLeasesResponse { header: self.0.headers.at(revision), leases }))
    }
}

/// etcd's check of each renewal: an authenticated caller, with write permission on every key
/// of the lease unless an admin (the stream's token is checked again each time).
async fn renew_permitted(ctx: &Context, credentials: &Credentials, id: i64) -> Result<(), Status> {
    if !ctx.store.auth().enabled() {
        return Ok(());
    }
    let who = credentials.caller(ctx)?;
    ctx.store.auth().check_lease_keys(&who, id, PermKind::Write).await.map_err(status)
}
