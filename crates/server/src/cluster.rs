//! The etcd Cluster service: this node is the only member.

use crate::Context;
use crate::error::{status, unsupported};
use kine_proto::etcdserverpb as pb;
use tonic::{Request, Response, Status};

pub struct ClusterService(pub Context);

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(&self, _r: Request<pb::MemberAddRequest>) -> Result<Response<pb::MemberAddResponse>, Status> {
        Err(unsupported("Cluster.MemberAdd"))
    }
    async fn member_remove(
        &self,
        _r: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        Err(unsupported("Cluster.MemberRemove"))
    }
    async fn member_update(
        &self,
        _r: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        Err(unsupported("Cluster.MemberUpdate"))
    }
    async fn member_promote(
        &self,
        _r: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        Err(unsupported("Cluster.MemberPromote"))
    }
    async fn member_list(
        &self,
        _r: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let revision = self.0.store.current_revision().await.map_err(status)?;
        let me = pb::Member {
            id: self.0.headers.member_id,
            name: "kine-rs".into(),
            peer_ur_ls: Vec::new(),
            client_ur_ls: self.0.config.client_urls.clone(),
            is_learner: false,
        };
        Ok(Response::new(pb::MemberListResponse { header: self.0.headers.at(revision), members: vec![me] }))
    }
}
