//! The etcd Maintenance service.

use crate::Context;
use crate::error::{status, unsupported};
use kine_proto::etcdserverpb as pb;
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct MaintenanceService(pub Context);

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    async fn alarm(&self, request: Request<pb::AlarmRequest>) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        let req = request.into_inner();
        match AlarmAction::try_from(req.action) {
            // There are never alarms: nothing to list, nothing to deactivate.
            Ok(AlarmAction::Get) | Ok(AlarmAction::Deactivate) => {
                let revision = self.0.store.current_revision().await.map_err(status)?;
                Ok(Response::new(pb::AlarmResponse { header: self.0.headers.at(revision), alarms: Vec::new() }))
            }
            Ok(AlarmAction::Activate) => Err(unsupported("Maintenance.Alarm ACTIVATE")),
            Err(_) => Err(Status::invalid_argument(format!("etcdserver: unknown alarm action {}", req.action))),
        }
    }

    async fn status(&self, _request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let (db, revision) = self.0.store.status().await.map_err(status)?;
        let member = self.0.headers.member_id;
        Ok(Response::new(pb::StatusResponse {
            header: self.0.headers.at(revision),
            version: self.0.config.emulated_version.clone(),
            db_size: db.db_size,
            leader: member,
            raft_index: revision as u64,
            raft_term: 0,
            raft_applied_index: revision as u64,
            errors: Vec::new(),
            db_size_in_use: db.db_size_in_use,
            is_learner: false,
            storage_version: String::new(),
            db_size_quota: 0,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        _request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.0.store.defragment().await.map_err(status)?;
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::DefragmentResponse { header: self.0.headers.at(revision) }))
    }

    async fn hash(&self, _request: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        Err(unsupported("Maintenance.Hash"))
    }

    async fn hash_kv(&self, _request: Request<pb::HashKvRequest>) -> Result<Response<pb::HashKvResponse>, Status> {
        Err(unsupported("Maintenance.HashKV"))
    }

    type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

    async fn snapshot(&self, _request: Request<pb::SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(unsupported("Maintenance.Snapshot"))
    }

    async fn move_leader(
        &self,
        _request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        Err(unsupported("Maintenance.MoveLeader"))
    }

    async fn downgrade(
        &self,
        _request: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(unsupported("Maintenance.Downgrade"))
    }
}
