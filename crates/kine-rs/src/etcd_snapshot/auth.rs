//! Users, roles and the auth switch in etcd's buckets: `auth` holds `authEnabled` (one byte)
//! and `authRevision` (u64 big-endian); `authUsers` name → authpb.User (the bcrypt hash as
//! etcd stores it); `authRoles` name → authpb.Role.

use kine_core::auth::state::{AuthState, PermKind, Permission, Role, User};
use kine_nats_embed::bolt::{Batch, Entry};
use kine_proto::authpb;
use prost::Message;

pub(crate) const AUTH: &[u8] = b"auth";
pub(crate) const USERS: &[u8] = b"authUsers";
pub(crate) const ROLES: &[u8] = b"authRoles";

pub(crate) fn write(batch: &mut Batch, auth: &AuthState) {
    batch.put(AUTH, b"authEnabled", &[u8::from(auth.enabled)]);
    batch.put(AUTH, b"authRevision", &auth.revision.to_be_bytes());
    for (name, user) in &auth.users {
        let pb = authpb::User {
            name: name.as_bytes().to_vec(),
            password: user.password.clone().unwrap_or_default(),
            roles: user.roles.clone(),
            options: Some(authpb::UserAddOptions { no_password: user.no_password }),
        };
        batch.put(USERS, name.as_bytes(), &pb.encode_to_vec());
    }
    for (name, role) in &auth.roles {
        let key_permission = role
            .perms
            .iter()
            .map(|p| authpb::Permission {
                perm_type: p.kind.as_i32(),
                key: p.key.clone(),
                range_end: p.range_end.clone(),
            })
            .collect();
        batch.put(
            ROLES,
            name.as_bytes(),
            &authpb::Role { name: name.as_bytes().to_vec(), key_permission }.encode_to_vec(),
        );
    }
}

/// The auth state of an etcd snapshot's buckets; `None` when it has no user, no role and auth
/// off (nothing to restore). Tokens of the old store are void in the new one.
pub(crate) fn read(auth: &[Entry], users: &[Entry], roles: &[Entry]) -> Result<Option<AuthState>, String> {
    let mut state = AuthState::new(kine_core::auth::new_token_key());
    for (k, v) in auth {
        match k.as_slice() {
            b"authEnabled" => state.enabled = v.as_slice() == [1],
            b"authRevision" => {
                state.revision =
                    u64::from_be_bytes(v.as_slice().try_into().map_err(|_| "auth/authRevision is malformed")?)
            }
            _ => {}
        }
    }
    for (k, v) in users {
        let pb = authpb::User::decode(v.as_slice()).map_err(|e| format!("authUsers: not a User: {e}"))?;
        let name = String::from_utf8(k.clone()).map_err(|_| "authUsers: a user name is not UTF-8")?;
        let no_password = pb.options.is_some_and(|o| o.no_password);
        let password = (!pb.password.is_empty()).then_some(pb.password);
        let mut roles = pb.roles;
        roles.sort();
        state.users.insert(name, User { password, no_password, roles, tokens_since: 0 });
    }
    for (k, v) in roles {
        let pb = authpb::Role::decode(v.as_slice()).map_err(|e| format!("authRoles: not a Role: {e}"))?;
        let name = String::from_utf8(k.clone()).map_err(|_| "authRoles: a role name is not UTF-8")?;
        let mut perms = Vec::new();
        for p in pb.key_permission {
            let kind = PermKind::from_i32(p.perm_type)
                .ok_or_else(|| format!("authRoles: role {name}: permission type {}", p.perm_type))?;
            perms.push(Permission { kind, key: p.key, range_end: p.range_end });
        }
        perms.sort_by(|a, b| a.key.cmp(&b.key));
        state.roles.insert(name, Role { perms });
    }
    if state.users.is_empty() && state.roles.is_empty() && !state.enabled {
        return Ok(None);
    }
    state.tokens_since = state.revision;
    Ok(Some(state))
}
