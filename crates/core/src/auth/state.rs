//! etcd's auth store as one value: users, roles, the enabled flag and the auth revision, with
//! etcd's rules for changing them. Pure: no I/O, no hashing (callers hash passwords first).
//!
//! The whole state is one record in the datastore (`Backend::auth_record`), replaced as a whole
//! by compare-and-swap, so every node on the datastore applies the same rules to the same state.

use crate::error::{AuthError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The user and the role that may do everything.
pub const ROOT: &str = "root";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermKind {
    Read,
    Write,
    ReadWrite,
}

impl PermKind {
    /// etcd's `authpb.Permission.Type` numbers.
    pub fn from_i32(n: i32) -> Option<PermKind> {
        match n {
            0 => Some(PermKind::Read),
            1 => Some(PermKind::Write),
            2 => Some(PermKind::ReadWrite),
            _ => None,
        }
    }
    pub fn as_i32(self) -> i32 {
        match self {
            PermKind::Read => 0,
            PermKind::Write => 1,
            PermKind::ReadWrite => 2,
        }
    }
    pub fn reads(self) -> bool {
        self != PermKind::Write
    }
    pub fn writes(self) -> bool {
        self != PermKind::Read
    }
}

/// A permission as etcd stores it: `range_end` empty for one key, `"\0"` for every key from
/// `key` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub kind: PermKind,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bcrypt hash; `None` for a user added with `no_password`.
    pub password: Option<Vec<u8>>,
    pub no_password: bool,
    /// Sorted, as etcd keeps them.
    pub roles: Vec<String>,
    /// Tokens issued at an auth revision below this are void (set on creation and on every
    /// password change).
    pub tokens_since: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// Sorted by key.
    pub perms: Vec<Permission>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    /// etcd's auth revision: 1 in a fresh store, +1 per change.
    pub revision: u64,
    pub enabled: bool,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
    /// The key simple tokens are signed with (random, made with the record).
    pub token_key: Vec<u8>,
    /// Tokens issued at an auth revision below this are void (set by AuthDisable).
    pub tokens_since: u64,
}

impl AuthState {
    /// A fresh store: auth off, nobody, revision 1.
    pub fn new(token_key: Vec<u8>) -> AuthState {
        AuthState {
            revision: 1,
            enabled: false,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            token_key,
            tokens_since: 0,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(data: &[u8]) -> Result<AuthState> {
        serde_json::from_slice(data)
            .map_err(|e| anyhow::anyhow!("the datastore's auth record cannot be read: {e}").into())
    }

    fn bump(&mut self) {
        self.revision += 1;
    }

    fn user_mut(&mut self, name: &str) -> Result<&mut User> {
        self.users.get_mut(name).ok_or_else(|| AuthError::UserNotFound.into())
    }

    pub fn user(&self, name: &str) -> Result<&User> {
        self.users.get(name).ok_or_else(|| AuthError::UserNotFound.into())
    }

    pub fn role(&self, name: &str) -> Result<&Role> {
        self.roles.get(name).ok_or_else(|| AuthError::RoleNotFound.into())
    }

    /// AuthEnable: needs user `root` holding role `root`. Spends no revision.
    pub fn enable(&mut self) -> Result<bool> {
        if self.enabled {
            return Ok(false);
        }
        let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
        if !root.roles.iter().any(|r| r == ROOT) {
            return Err(AuthError::RootRoleNotExist.into());
        }
        self.enabled = true;
        Ok(true)
    }

    /// AuthDisable: every token issued so far becomes void.
    pub fn disable(&mut self) -> bool {
        if !self.enabled {
            return false;
        }
        self.enabled = false;
        self.bump();
        self.tokens_since = self.revision;
        true
    }

    /// UserAdd with the password already hashed (`None` with `no_password`).
    pub fn user_add(&mut self, name: &str, password: Option<Vec<u8>>, no_password: bool) -> Result<()> {
        if name.is_empty() {
            return Err(AuthError::UserEmpty.into());
        }
        if self.users.contains_key(name) {
            return Err(AuthError::UserAlreadyExist.into());
        }
        self.bump();
        let password = if no_password { None } else { Some(password.unwrap_or_default()) };
        let user = User { password, no_password, roles: Vec::new(), tokens_since: self.revision };
        self.users.insert(name.to_string(), user);
        Ok(())
    }

    pub fn user_delete(&mut self, name: &str) -> Result<()> {
        if self.enabled && name == ROOT {
            return Err(AuthError::InvalidAuthMgmt.into());
        }
        self.user(name)?;
        self.users.remove(name);
        self.bump();
        Ok(())
    }

    /// UserChangePassword with the new password already hashed. A user without a password
    /// keeps having none. The user's tokens become void.
    pub fn user_change_password(&mut self, name: &str, password: Vec<u8>) -> Result<()> {
        self.user(name)?;
        self.bump();
        let revision = self.revision;
        let user = self.user_mut(name)?;
        if !user.no_password {
            user.password = Some(password);
        }
        user.tokens_since = revision;
        Ok(())
    }

    /// UserGrantRole; granting a role held already changes nothing. Role `root` needs no role
    /// object.
    pub fn user_grant_role(&mut self, name: &str, role: &str) -> Result<bool> {
        self.user(name)?;
        if role != ROOT && !self.roles.contains_key(role) {
            return Err(AuthError::RoleNotFound.into());
        }
        let user = self.user_mut(name)?;
        if user.roles.iter().any(|r| r == role) {
            return Ok(false);
        }
        user.roles.push(role.to_string());
        user.roles.sort();
        self.bump();
        Ok(true)
    }

    pub fn user_revoke_role(&mut self, name: &str, role: &str) -> Result<()> {
        if self.enabled && name == ROOT && role == ROOT {
            return Err(AuthError::InvalidAuthMgmt.into());
        }
        let user = self.user_mut(name)?;
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(AuthError::RoleNotGranted.into());
        }
        self.bump();
        Ok(())
    }

    pub fn role_add(&mut self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(AuthError::RoleEmpty.into());
        }
        if self.roles.contains_key(name) {
            return Err(AuthError::RoleAlreadyExist.into());
        }
        self.roles.insert(name.to_string(), Role::default());
        self.bump();
        Ok(())
    }

    /// RoleDelete: also taken from every user holding it.
    pub fn role_delete(&mut self, name: &str) -> Result<()> {
        if self.enabled && name == ROOT {
            return Err(AuthError::InvalidAuthMgmt.into());
        }
        self.role(name)?;
        self.roles.remove(name);
        for user in self.users.values_mut() {
            user.roles.retain(|r| r != name);
        }
        self.bump();
        Ok(())
    }

    /// RoleGrantPermission: a permission on the same key and range end only changes its kind.
    pub fn role_grant_permission(&mut self, name: &str, perm: Option<Permission>) -> Result<()> {
        let perm = perm.ok_or(AuthError::PermissionNotGiven)?;
        if !valid_permission_range(&perm.key, &perm.range_end) {
            return Err(AuthError::InvalidAuthMgmt.into());
        }
        let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
        match role.perms.iter_mut().find(|p| p.key == perm.key && p.range_end == perm.range_end) {
            Some(existing) => existing.kind = perm.kind,
            None => {
                role.perms.push(perm);
                role.perms.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        self.bump();
        Ok(())
    }

    /// RoleRevokePermission: removes the permissions on exactly this key and range end.
    pub fn role_revoke_permission(&mut self, name: &str, key: &[u8], range_end: &[u8]) -> Result<()> {
        let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
        let before = role.perms.len();
        role.perms.retain(|p| !(p.key == key && p.range_end == range_end));
        if role.perms.len() == before {
            return Err(AuthError::PermissionNotGranted.into());
        }
        self.bump();
        Ok(())
    }

    /// What RoleGet answers: role `root` has every key (etcd 3.6 and later).
    pub fn role_permissions(&self, name: &str) -> Result<Vec<Permission>> {
        let role = self.role(name)?;
        if name == ROOT {
            return Ok(vec![Permission { kind: PermKind::ReadWrite, key: Vec::new(), range_end: vec![0] }]);
        }
        Ok(role.perms.clone())
    }
}

/// etcd's rule: a key is needed; a range end is empty (one key), `"\0"` (from the key on), or
/// above the key.
fn valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    fn auth_err(r: Result<impl std::fmt::Debug>) -> AuthError {
        match r {
            Err(Error::Auth(e)) => e,
            other => panic!("expected an auth error, got {other:?}"),
        }
    }

    fn perm(kind: PermKind, key: &str, end: &str) -> Option<Permission> {
        Some(Permission { kind, key: key.into(), range_end: end.into() })
    }

    #[test]
    fn revisions_move_as_etcds() {
        let mut s = AuthState::new(vec![1]);
        assert_eq!(s.revision, 1);
        s.user_add("root", Some(b"h".to_vec()), false).unwrap();
        assert_eq!(auth_err(s.enable()), AuthError::RootRoleNotExist);
        assert!(s.user_grant_role("root", "root").unwrap());
        assert!(!s.user_grant_role("root", "root").unwrap(), "granted twice");
        assert_eq!(s.revision, 3);
        assert!(s.enable().unwrap());
        assert_eq!(s.revision, 3, "AuthEnable spends no revision");
        assert_eq!(auth_err(s.user_delete("root")), AuthError::InvalidAuthMgmt);
        assert_eq!(auth_err(s.user_revoke_role("root", "root")), AuthError::InvalidAuthMgmt);
        assert_eq!(auth_err(s.role_delete("root")), AuthError::InvalidAuthMgmt);
        assert!(s.disable());
        assert_eq!((s.revision, s.tokens_since), (4, 4));
    }

    #[test]
    fn roles_and_permissions() {
        let mut s = AuthState::new(vec![1]);
        assert_eq!(auth_err(s.role_add("")), AuthError::RoleEmpty);
        s.role_add("r").unwrap();
        assert_eq!(auth_err(s.role_add("r")), AuthError::RoleAlreadyExist);
        assert_eq!(auth_err(s.role_grant_permission("r", None)), AuthError::PermissionNotGiven);
        assert_eq!(auth_err(s.role_grant_permission("r", perm(PermKind::Read, "", ""))), AuthError::InvalidAuthMgmt);
        assert_eq!(auth_err(s.role_grant_permission("r", perm(PermKind::Read, "b", "a"))), AuthError::InvalidAuthMgmt);
        assert_eq!(auth_err(s.role_grant_permission("x", perm(PermKind::Read, "a", ""))), AuthError::RoleNotFound);
        s.role_grant_permission("r", perm(PermKind::Read, "k", "")).unwrap();
        s.role_grant_permission("r", perm(PermKind::Write, "a", "\0")).unwrap();
        s.role_grant_permission("r", perm(PermKind::ReadWrite, "k", "")).unwrap();
        let perms = s.role_permissions("r").unwrap();
        assert_eq!(
            perms.iter().map(|p| (p.kind, p.key.clone())).collect::<Vec<_>>(),
            [(PermKind::Write, b"a".to_vec()), (PermKind::ReadWrite, b"k".to_vec())]
        );
        assert_eq!(auth_err(s.role_revoke_permission("r", b"k", b"l")), AuthError::PermissionNotGranted);
        s.role_revoke_permission("r", b"k", b"").unwrap();
        s.user_add("u", None, true).unwrap();
        assert_eq!(auth_err(s.user_grant_role("u", "nope")), AuthError::RoleNotFound);
        s.user_grant_role("u", "r").unwrap();
        s.role_delete("r").unwrap();
        assert!(s.user("u").unwrap().roles.is_empty(), "a deleted role leaves its users");
        assert_eq!(auth_err(s.user_revoke_role("u", "r")), AuthError::RoleNotGranted);
        s.user_change_password("u", b"new".to_vec()).unwrap();
        assert_eq!(s.user("u").unwrap().password, None, "a user without password keeps none");
        let decoded = AuthState::decode(&s.encode()).unwrap();
        assert_eq!(decoded, s);
    }
}
