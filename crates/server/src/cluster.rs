//! The etcd Cluster service: the members are the kine-rs nodes serving the datastore
//! (`kine_core::members`; a node is a learner while it serves a read-only copy, which
//! MemberPromote turns into the primary).

use crate::Context;
use crate::credentials::{require_admin, require_user};
use crate::error::{status, unsupported};
use kine_proto::etcdserverpb as pb;
use tonic::{Request, Response, Status};

pub struct ClusterService(pub Context);

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(&self, r: Request<pb::MemberAddRequest>) -> Result<Response<pb::MemberAddResponse>, Status> {
        require_admin(&self.0, &r)?;
        Err(unsupported("Cluster.MemberAdd"))
    }
    async fn member_remove(
        &self,
        r: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        require_admin(&self.0, &r)?;
        Err(unsupported("Cluster.MemberRemove"))
    }
    async fn member_update(
        &self,
        r: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        require_admin(&self.0, &r)?;
        Err(unsupported("Cluster.MemberUpdate"))
    }
    /// A read-only copy (a learner) becomes the writable primary (docs/nats.md, "Promotion").
    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        require_admin(&self.0, &request)?;
        let promotion = self.0.store.promote(request.into_inner().id).await.map_err(status)?;
        tracing::info!(
            revision = promotion.revision,
            origin_fenced = promotion.origin_fenced,
            "promoted: this node now serves reads and writes"
        );
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.0.headers.at(revision),
            members: self.members().await?,
        }))
    }
    async fn member_list(&self, r: Request<pb::MemberListRequest>) -> Result<Response<pb::MemberListResponse>, Status> {
        require_user(&self.0, &r)?;
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::MemberListResponse {
            header: self.0.headers.at(revision),
            members: self.members().await?,
        }))
    }
}

impl ClusterService {
    /// Every node serving this datastore (each a learner while it serves a read-only copy).
    async fn members(&self) -> Result<Vec<pb::Member>, Status> {
        let members = self.0.store.members().list().await.map_err(status)?;
        Ok(members
            .into_iter()
            .map(|m| pb::Member {
                id: m.id,
                name: m.name,
                peer_ur_ls: Vec::new(),
                client_ur_ls: m.client_urls,
                is_learner: m.learner,
            })
            .collect())
    }
}
