//! etcd's Election service (v3election): Campaign, Proclaim, Leader, Observe, Resign, over the
//! recipe in `kine_core::election`. Errors reach clients as etcd's do (`status_via_client`).

use crate::Context;
use crate::convert;
use crate::credentials::{require_key, require_recipe};
use crate::error::{status, status_via_client, via_client};
use kine_core::Error;
use kine_core::election::{self, LeaderKey};
use kine_proto::v3electionpb as pb;
use std::pin::Pin;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

pub struct ElectionService(pub Context);

fn stopped() -> Status {
    status(Error::Unavailable("etcdserver: server stopped".into()))
}

/// etcd's answer to a Proclaim or Resign without a leader.
fn leader_of(leader: Option<pb::LeaderKey>) -> Result<LeaderKey, Status> {
    let l =
        leader.ok_or_else(|| status_via_client(Error::InvalidArgument("\"leader\" field must be provided".into())))?;
    Ok(LeaderKey { name: l.name, key: l.key, rev: l.rev, lease: l.lease })
}

#[tonic::async_trait]
impl pb::election_server::Election for ElectionService {
    async fn campaign(&self, request: Request<pb::CampaignRequest>) -> Result<Response<pb::CampaignResponse>, Status> {
        require_recipe(&self.0, &request, &request.get_ref().name, true).map_err(via_client)?;
        let req = request.into_inner();
        let mut shutdown = self.0.shutdown.clone();
        // A campaign can wait for ever; a stopping server ends it (the candidate resigns).
        let (leader, revision) = tokio::select! {
            won = election::campaign(&self.0.store, &req.name, req.lease, req.value) => won.map_err(status_via_client)?,
            _ = shutdown.wait() => return Err(stopped()),
        };
        Ok(Response::new(pb::CampaignResponse {
            header: self.0.headers.at(revision),
            leader: Some(pb::LeaderKey { name: leader.name, key: leader.key, rev: leader.rev, lease: leader.lease }),
        }))
    }

    async fn proclaim(&self, request: Request<pb::ProclaimRequest>) -> Result<Response<pb::ProclaimResponse>, Status> {
        let key = request.get_ref().leader.as_ref().map(|l| l.key.clone()).unwrap_or_default();
        require_key(&self.0, &request, &key).map_err(via_client)?;
        let req = request.into_inner();
        let leader = leader_of(req.leader)?;
        let revision = election::proclaim(&self.0.store, &leader, req.value).await.map_err(status_via_client)?;
        Ok(Response::new(pb::ProclaimResponse { header: self.0.headers.at(revision) }))
    }

    async fn leader(&self, request: Request<pb::LeaderRequest>) -> Result<Response<pb::LeaderResponse>, Status> {
        require_recipe(&self.0, &request, &request.get_ref().name, false).map_err(via_client)?;
        let (kv, revision) =
            election::leader(&self.0.store, &request.into_inner().name).await.map_err(status_via_client)?;
        Ok(Response::new(pb::LeaderResponse { header: self.0.headers.at(revision), kv: Some(convert::kv(kv)) }))
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send>>;

    async fn observe(&self, request: Request<pb::LeaderRequest>) -> Result<Response<Self::ObserveStream>, Status> {
        require_recipe(&self.0, &request, &request.get_ref().name, false).map_err(via_client)?;
        let name = request.into_inner().name;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let store = self.0.store.clone();
        let mut shutdown = self.0.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = election::observe(&store, &name, tx.clone()) => {}
                // The client went away: stop following, even if the leader never changes again.
                _ = tx.closed() => {}
                _ = shutdown.wait() => { let _ = tx.send(Err(Error::Unavailable("etcdserver: server stopped".into()))).await; }
            }
        });
        let headers = self.0.headers;
        let stream = ReceiverStream::new(rx).map(move |item| match item {
            Ok((kv, revision)) => Ok(pb::LeaderResponse { header: headers.at(revision), kv: Some(convert::kv(kv)) }),
            Err(e) => Err(status_via_client(e)),
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(&self, request: Request<pb::ResignRequest>) -> Result<Response<pb::ResignResponse>, Status> {
        let key = request.get_ref().leader.as_ref().map(|l| l.key.clone()).unwrap_or_default();
        require_key(&self.0, &request, &key).map_err(via_client)?;
        let leader = leader_of(request.into_inner().leader)?;
        let revision = election::resign(&self.0.store, &leader).await.map_err(status_via_client)?;
        Ok(Response::new(pb::ResignResponse { header: self.0.headers.at(revision) }))
    }
}
