//! The etcd Auth service: users, roles, permissions, tokens. The rules live in
//! `kine_core::auth`; this maps requests and checks who may call what (etcd 3.7: every RPC but
//! Authenticate and AuthStatus is for admins, UserGet also for the user itself, RoleGet also for
//! holders of the role).

use crate::Context;
use crate::credentials::caller;
use crate::error::status;
use kine_core::Error;
use kine_core::auth::state::Permission;
use kine_core::auth::{Auth, PermKind};
use kine_proto::authpb;
use kine_proto::etcdserverpb as pb;
use tonic::{Request, Response, Status};

pub struct AuthService(pub Context);

impl AuthService {
    /// The request of a caller who must be an admin, and the auth store.
    fn admin<T>(&self, request: Request<T>) -> Result<(T, &Auth), Status> {
        let who = caller(&self.0, &request)?;
        let auth = self.0.store.auth();
        auth.admin(&who).map_err(status)?;
        Ok((request.into_inner(), auth))
    }

    async fn header(&self) -> Result<Option<pb::ResponseHeader>, Status> {
        Ok(self.0.headers.at(self.0.store.current_revision().await.map_err(status)?))
    }
}

fn to_core(perm: authpb::Permission) -> Result<Permission, Status> {
    let kind = PermKind::from_i32(perm.perm_type).ok_or_else(|| {
        status(Error::InvalidArgument(format!("etcdserver: unknown permission type {}", perm.perm_type)))
    })?;
    Ok(Permission { kind, key: perm.key, range_end: perm.range_end })
}

fn to_pb(perm: Permission) -> authpb::Permission {
    authpb::Permission { perm_type: perm.kind.as_i32(), key: perm.key, range_end: perm.range_end }
}

#[tonic::async_trait]
impl pb::auth_server::Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let (_r, a) = self.admin(request)?;
        a.enable().await.map_err(status)?;
        Ok(Response::new(pb::AuthEnableResponse { header: self.header().await? }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let (_r, a) = self.admin(request)?;
        a.disable().await.map_err(status)?;
        Ok(Response::new(pb::AuthDisableResponse { header: self.header().await? }))
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.user_add(&r.name, &r.password, r.options.is_some_and(|o| o.no_password)).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserAddResponse { header: self.header().await? }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.user_delete(&r.name).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header: self.header().await? }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.user_change_password(&r.name, &r.password, &r.hashed_password).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header: self.header().await? }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.user_grant_role(&r.user, &r.role).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header: self.header().await? }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.user_revoke_role(&r.name, &r.role).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header: self.header().await? }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.role_add(&r.name).await.map_err(status)?;
        Ok(Response::new(pb::AuthRoleAddResponse { header: self.header().await? }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.role_delete(&r.role).await.map_err(status)?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header: self.header().await? }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let (r, a) = self.admin(request)?;
        a.role_revoke_permission(&r.role, &r.key, &r.range_end).await.map_err(status)?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse { header: self.header().await? }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let (r, _) = self.admin(request)?;
        let perm = r.perm.map(to_core).transpose()?;
        self.0.store.auth().role_grant_permission(&r.name, perm).await.map_err(status)?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse { header: self.header().await? }))
    }

    async fn auth_status(
        &self,
        request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        // etcd 3.7 lets anyone ask (a bad token still fails); 3.5 and 3.6 only admins.
        let who = caller(&self.0, &request)?;
        if self.0.config.version() < crate::EtcdVersion(3, 7, 0) {
            self.0.store.auth().admin(&who).map_err(status)?;
        }
        let (enabled, auth_revision) = self.0.store.auth().status().await.map_err(status)?;
        Ok(Response::new(pb::AuthStatusResponse { header: self.header().await?, enabled, auth_revision }))
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        // The request's own token, if any, plays no part.
        let r = request.into_inner();
        let token = self.0.store.auth().authenticate(&r.name, &r.password).await.map_err(status)?;
        Ok(Response::new(pb::AuthenticateResponse { header: self.header().await?, token }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let roles = self.0.store.auth().user_get(&who, &request.get_ref().name).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserGetResponse { header: self.header().await?, roles }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let who = caller(&self.0, &request)?;
        let perms = self.0.store.auth().role_get(&who, &request.get_ref().role).await.map_err(status)?;
        let perm = perms.into_iter().map(to_pb).collect();
        Ok(Response::new(pb::AuthRoleGetResponse { header: self.header().await?, perm }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        self.admin(request)?;
        let users = self.0.store.auth().user_list().await.map_err(status)?;
        Ok(Response::new(pb::AuthUserListResponse { header: self.header().await?, users }))
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        self.admin(request)?;
        let roles = self.0.store.auth().role_list().await.map_err(status)?;
        Ok(Response::new(pb::AuthRoleListResponse { header: self.header().await?, roles }))
    }
}
