//! The etcd Maintenance service.

use crate::Context;
use crate::credentials::{require_admin, require_user};
use crate::error::{status, unsupported};
use kine_proto::etcdserverpb as pb;
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct MaintenanceService(pub Context);

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    async fn alarm(&self, request: Request<pb::AlarmRequest>) -> Result<Response<pb::AlarmResponse>, Status> {
        use kine_core::alarm::{Alarm, AlarmKind};
        use pb::alarm_request::AlarmAction;
        // etcd: reading alarms is for any user, changing them for admins.
        if request.get_ref().action == AlarmAction::Get as i32 {
            require_user(&self.0, &request)?;
        } else {
            require_admin(&self.0, &request)?;
        }
        let req = request.into_inner();
        let kind = match pb::AlarmType::try_from(req.alarm) {
            Ok(pb::AlarmType::None) => None,
            Ok(pb::AlarmType::Nospace) => Some(AlarmKind::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(AlarmKind::Corrupt),
            Err(_) => return Err(Status::invalid_argument(format!("etcdserver: unknown alarm type {}", req.alarm))),
        };
        let alarms = self.0.store.alarms();
        let changed = match (AlarmAction::try_from(req.action), kind) {
            (Ok(AlarmAction::Get), kind) => alarms.list(kind),
            // As etcd: activating or deactivating "no alarm" does nothing.
            (Ok(AlarmAction::Activate | AlarmAction::Deactivate), None) => Vec::new(),
            (Ok(AlarmAction::Activate), Some(kind)) => vec![alarms.activate(Alarm { member_id: req.member_id, kind })],
            (Ok(AlarmAction::Deactivate), Some(kind)) => {
                alarms.deactivate(Alarm { member_id: req.member_id, kind }).into_iter().collect()
            }
            (Err(_), _) => {
                return Err(Status::invalid_argument(format!("etcdserver: unknown alarm action {}", req.action)));
            }
        };
        let alarms = changed
            .into_iter()
            .map(|a| pb::AlarmMember {
                member_id: a.member_id,
                alarm: match a.kind {
                    AlarmKind::NoSpace => pb::AlarmType::Nospace,
                    AlarmKind::Corrupt => pb::AlarmType::Corrupt,
                } as i32,
            })
            .collect();
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::AlarmResponse { header: self.0.headers.at(revision), alarms }))
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        require_user(&self.0, &request)?;
        let (db, revision) = self.0.store.status().await.map_err(status)?;
        let member = self.0.headers.member_id;
        // A copy reports itself as a learner; its origin leads (etcd names the leader's id).
        let learner = self.0.store.backend().role().is_learner();
        let leader = if learner { self.0.headers.cluster_id } else { member };
        Ok(Response::new(pb::StatusResponse {
            header: self.0.headers.at(revision),
            version: self.0.config.emulated_version.clone(),
            db_size: db.db_size,
            leader,
            raft_index: revision as u64,
            raft_term: 0,
            raft_applied_index: revision as u64,
            errors: Vec::new(),
            db_size_in_use: db.db_size_in_use,
            is_learner: learner,
            storage_version: self.0.config.storage_version(),
            db_size_quota: 0,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        require_admin(&self.0, &request)?;
        self.0.store.defragment().await.map_err(status)?;
        let revision = self.0.store.current_revision().await.map_err(status)?;
        Ok(Response::new(pb::DefragmentResponse { header: self.0.headers.at(revision) }))
    }

    async fn hash(&self, request: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        require_admin(&self.0, &request)?;
        let (hash, revision) = self.0.store.hash().await.map_err(status)?;
        Ok(Response::new(pb::HashResponse { header: self.0.headers.at(revision), hash }))
    }

    async fn hash_kv(&self, request: Request<pb::HashKvRequest>) -> Result<Response<pb::HashKvResponse>, Status> {
        require_admin(&self.0, &request)?;
        let h = self.0.store.hash_kv(request.into_inner().revision).await.map_err(status)?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.0.headers.at(h.revision),
            hash: h.hash,
            compact_revision: h.compact_revision,
            hash_revision: h.hash_revision,
        }))
    }

    type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

    async fn snapshot(&self, request: Request<pb::SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        require_admin(&self.0, &request)?;
        let rx = crate::snapshot::stream(&self.0).await?;
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        require_admin(&self.0, &request)?;
        Err(unsupported("Maintenance.MoveLeader"))
    }

    async fn downgrade(
        &self,
        request: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        require_admin(&self.0, &request)?;
        Err(unsupported("Maintenance.Downgrade"))
    }
}
