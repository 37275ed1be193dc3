//! etcd's Auth: users, roles, tokens and the permission checks of every request.
//!
//! The state ([`state::AuthState`]) is one record in the datastore, changed only by
//! compare-and-swap on its version, so several nodes on one datastore never lose each other's
//! changes. Each node keeps the state it last read and reads it again at least every
//! [`REFRESH`]: a change made on another node (a new password, a deleted user, auth switched
//! on) holds here within that bound, and at once on the node that made it.
//!
//! With auth disabled (the default) every check is one atomic load.

mod check;
pub mod jwt;
pub mod perm;
pub mod state;
mod token;

use crate::backend::Backend;
use crate::error::{AuthError, Error, Result};
use crate::shutdown::Shutdown;
use perm::UserPerms;
use state::{AuthState, Permission};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

pub use state::{PermKind, ROOT};

/// How often a node reads the auth record again.
pub const REFRESH: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct AuthOptions {
    /// etcd's `--bcrypt-cost` (4..=31, default 10).
    pub bcrypt_cost: u32,
    /// etcd's `--auth-token-ttl`: a simple token unused for this long is void (default 300 s).
    pub token_ttl: Duration,
    /// etcd's `--auth-token`: simple tokens or JWTs.
    pub tokens: jwt::TokenKind,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            bcrypt_cost: bcrypt::DEFAULT_COST,
            token_ttl: Duration::from_secs(300),
            tokens: jwt::TokenKind::Simple,
        }
    }
}

/// Who sent a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Auth is disabled: anyone may do anything.
    Anyone,
    /// Auth is enabled and the request carries no credentials.
    Anonymous,
    /// Auth is enabled and the request comes from this user (a valid token, or the common name
    /// of a verified client certificate), as of this auth revision (a JWT's; else the current).
    User(String, u64),
}

/// The state this node last read, with every user's permissions worked out.
struct Known {
    state: AuthState,
    version: Option<u64>,
    perms: HashMap<String, Arc<UserPerms>>,
}

impl Known {
    fn new(state: AuthState, version: Option<u64>) -> Known {
        let perms = state.users.keys().filter_map(|u| Some((u.clone(), Arc::new(UserPerms::of(&state, u)?)))).collect();
        Known { state, version, perms }
    }
}

pub struct Auth {
    backend: Arc<dyn Backend>,
    options: AuthOptions,
    known: RwLock<Arc<Known>>,
    /// Changes this node made: a reload that overlapped one does not install what it read
    /// (it may predate the change).
    changes: AtomicU64,
    enabled: AtomicBool,
    /// Bounds the CPU spent on bcrypt: a flood of Authenticate calls waits here, not in every
    /// core.
    hashing: Semaphore,
    /// Unix milliseconds of each token's last use on this node (the TTL restarts with every use).
    last_use: Mutex<HashMap<String, u64>>,
}

fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

/// A new key to sign simple tokens with (random).
pub fn new_token_key() -> Vec<u8> {
    let mut key = vec![0u8; 32];
    random_bytes(&mut key);
    key
}

/// Cryptographically random bytes.
pub(crate) fn random_bytes(out: &mut [u8]) {
    if let Err(e) = getrandom::fill(out) {
        // No randomness from the OS: nothing secret can be made; refusing to run is safer.
        panic!("the operating system gives no random bytes: {e}");
    }
}

impl Auth {
    pub async fn open(backend: Arc<dyn Backend>, options: AuthOptions) -> Result<Arc<Auth>> {
        let permits = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let auth = Auth {
            backend,
            options,
            known: RwLock::new(Arc::new(Known::new(AuthState::new(Vec::new()), None))),
            changes: AtomicU64::new(0),
            enabled: AtomicBool::new(false),
            hashing: Semaphore::new(permits),
            last_use: Mutex::new(HashMap::new()),
        };
        auth.reload().await?;
        Ok(Arc::new(auth))
    }

    fn known(&self) -> Arc<Known> {
        self.known.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn install(&self, known: Known) -> Arc<Known> {
        let known = Arc::new(known);
        let was = self.enabled.swap(known.state.enabled, Ordering::SeqCst);
        if was != known.state.enabled {
            tracing::info!(enabled = known.state.enabled, revision = known.state.revision, "auth switched");
        }
        *self.known.write().unwrap_or_else(|p| p.into_inner()) = known.clone();
        known
    }

    /// Reads the record again if it changed.
    async fn reload(&self) -> Result<Arc<Known>> {
        let changes = self.changes.load(Ordering::SeqCst);
        let record = self.backend.auth_record().await?;
        let known = self.known();
        let version = record.as_ref().map(|r| r.version);
        if version == known.version && version.is_some() {
            return Ok(known);
        }
        let state = match record {
            Some(r) => AuthState::decode(&r.data)?,
            None => AuthState::new(Vec::new()),
        };
        if self.changes.load(Ordering::SeqCst) != changes {
            return Ok(self.known());
        }
        Ok(self.install(Known::new(state, version)))
    }

    /// Keeps this node's view of the record at most [`REFRESH`] old, and forgets tokens unused
    /// for longer than the TTL.
    pub fn spawn_refresh(self: Arc<Self>, shutdown: Shutdown) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut stop = shutdown;
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.wait() => return,
                    _ = tokio::time::sleep(REFRESH) => {}
                }
                match self.reload().await {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!("auth record readable again");
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "cannot read the auth record; keeping the last one read");
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the auth record"),
                }
                let oldest = now_millis().saturating_sub(self.options.token_ttl.as_millis() as u64);
                self.last_use.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, used| *used >= oldest);
            }
        })
    }

    /// Applies `change` to the newest record and stores it, retrying while other nodes change it
    /// meanwhile. `change` returns its answer and whether it changed anything.
    async fn change<T>(&self, change: impl Fn(&mut AuthState) -> Result<(T, bool)>) -> Result<T> {
        if let Some(refusal) = self.backend.role().refusal() {
            return Err(refusal);
        }
        for _ in 0..100 {
            let record = self.backend.auth_record().await?;
            let version = record.as_ref().map(|r| r.version);
            let mut state = match &record {
                Some(r) => AuthState::decode(&r.data)?,
                None => AuthState::new(new_token_key()),
            };
            let (answer, changed) = change(&mut state)?;
            if !changed {
                self.install(Known::new(state, version));
                return Ok(answer);
            }
            if self.backend.auth_replace(version, state.encode()).await? {
                // The next reload reads the new version back; until then this state is newest.
                self.changes.fetch_add(1, Ordering::SeqCst);
                self.install(Known::new(state, None));
                return Ok(answer);
            }
        }
        Err(Error::Unavailable("etcdserver: too many concurrent auth changes; try again".into()))
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Who a request comes from: its token if it carries one, else the common name of its
    /// verified client certificate (when client-certificate auth is on).
    pub fn identify(&self, token: Option<&str>, common_name: Option<&str>) -> Result<Caller> {
        if !self.enabled() {
            return Ok(Caller::Anyone);
        }
        let known = self.known();
        let state = &known.state;
        let Some(token) = token else {
            return Ok(common_name.map_or(Caller::Anonymous, |cn| Caller::User(cn.to_string(), state.revision)));
        };
        let invalid = || Error::Auth(AuthError::InvalidAuthToken);
        if let jwt::TokenKind::Jwt(jwt) = &self.options.tokens {
            // No state: a JWT holds until it expires; a change of the auth state makes it old.
            let (user, revision) = jwt.verify(token).ok_or_else(invalid)?;
            return Ok(Caller::User(user, revision));
        }
        let claims = token::verify(&state.token_key, token).ok_or_else(invalid)?;
        let user = state.users.get(&claims.user).ok_or_else(invalid)?;
        if claims.revision < user.tokens_since || claims.revision < state.tokens_since {
            return Err(invalid());
        }
        let now = now_millis();
        let mut last_use = self.last_use.lock().unwrap_or_else(|p| p.into_inner());
        let since = last_use.get(token).copied().unwrap_or(claims.issued).max(claims.issued);
        if now >= since.saturating_add(self.options.token_ttl.as_millis() as u64) {
            last_use.remove(token);
            return Err(invalid());
        }
        last_use.insert(token.to_string(), now);
        Ok(Caller::User(claims.user, state.revision))
    }

    /// etcd's admin check: the caller holds role `root`.
    pub fn admin(&self, caller: &Caller) -> Result<()> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::Anonymous => Err(AuthError::UserEmpty.into()),
            Caller::User(name, _) => match self.known().perms.get(name) {
                None => Err(AuthError::UserNotFound.into()),
                Some(p) if p.is_root() => Ok(()),
                Some(_) => Err(AuthError::PermissionDenied.into()),
            },
        }
    }

    pub fn is_admin(&self, caller: &Caller) -> bool {
        self.admin(caller).is_ok()
    }

    /// Any authenticated user (etcd's `requireAuthInfo`).
    pub fn authenticated(&self, caller: &Caller) -> Result<()> {
        match caller {
            Caller::Anonymous => Err(AuthError::UserEmpty.into()),
            _ => Ok(()),
        }
    }

    /// May the caller do `kind` on every key of `range`?
    pub fn permitted(&self, caller: &Caller, kind: PermKind, range: &crate::KeyRange) -> Result<()> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::Anonymous => Err(AuthError::UserEmpty.into()),
            Caller::User(name, revision) => {
                let known = self.known();
                // etcd: a token from before the last change of users, roles or permissions.
                if *revision < known.state.revision {
                    return Err(AuthError::AuthOldRevision.into());
                }
                match known.perms.get(name) {
                    Some(p) if p.allows(kind, range) => Ok(()),
                    _ => Err(AuthError::PermissionDenied.into()),
                }
            }
        }
    }

    // The Auth service.

    /// AuthStatus: whether auth is enabled, and the auth revision.
    pub async fn status(&self) -> Result<(bool, u64)> {
        let known = self.reload().await?;
        Ok((known.state.enabled, known.state.revision))
    }

    pub async fn enable(&self) -> Result<()> {
        self.change(|s| Ok(((), s.enable()?))).await
    }

    pub async fn disable(&self) -> Result<()> {
        self.change(|s| Ok(((), s.disable()))).await
    }

    /// Authenticate: a token for a user's name and password.
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String> {
        let known = self.reload().await?;
        let state = &known.state;
        if !state.enabled {
            return Err(AuthError::AuthNotEnabled.into());
        }
        let user = state.users.get(name).ok_or(AuthError::AuthFailed)?;
        if user.no_password {
            return Err(AuthError::NoPasswordUser.into());
        }
        let hash = String::from_utf8(user.password.clone().unwrap_or_default()).unwrap_or_default();
        if !self.verify_password(password, hash).await {
            return Err(AuthError::AuthFailed.into());
        }
        if let jwt::TokenKind::Jwt(jwt) = &self.options.tokens {
            let now = now_millis() / 1000;
            return jwt.sign(name, state.revision, now).ok_or_else(|| AuthError::VerifyOnly.into());
        }
        let claims = token::Claims { user: name.to_string(), revision: state.revision, issued: now_millis() };
        Ok(token::issue(&state.token_key, &claims))
    }

    async fn verify_password(&self, password: &str, hash: String) -> bool {
        let Ok(_permit) = self.hashing.acquire().await else { return false };
        let password = password.to_string();
        tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false)).await.unwrap_or(false)
    }

    async fn hash_password(&self, password: &str) -> Result<Vec<u8>> {
        let _permit =
            self.hashing.acquire().await.map_err(|_| Error::Unavailable("etcdserver: server stopped".into()))?;
        let (password, cost) = (password.to_string(), self.options.bcrypt_cost);
        // `$2a$`, as etcd writes it.
        let hash = tokio::task::spawn_blocking(move || {
            bcrypt::hash_with_result(password, cost).map(|h| h.format_for_version(bcrypt::Version::TwoA))
        })
        .await
        .map_err(|e| anyhow::anyhow!("hashing a password: {e}"))?
        .map_err(|e| anyhow::anyhow!("hashing a password: {e}"))?;
        Ok(hash.into_bytes())
    }

    /// UserAdd: the password is hashed here (a hash sent by the client is not used, as in etcd).
    pub async fn user_add(&self, name: &str, password: &str, no_password: bool) -> Result<()> {
        let hash = if no_password { None } else { Some(self.hash_password(password).await?) };
        self.change(|s| Ok(((), s.user_add(name, hash.clone(), no_password).map(|_| true)?))).await
    }

    /// UserChangePassword: `password` is hashed here; when empty, `hashed` (the base64 of a
    /// bcrypt hash) is stored as given.
    pub async fn user_change_password(&self, name: &str, password: &str, hashed: &str) -> Result<()> {
        let hash = if password.is_empty() {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(hashed).map_err(|_| AuthError::NoPasswordUser)?
        } else {
            self.hash_password(password).await?
        };
        self.change(|s| Ok(((), s.user_change_password(name, hash.clone()).map(|_| true)?))).await
    }

    pub async fn user_delete(&self, name: &str) -> Result<()> {
        self.change(|s| Ok(((), s.user_delete(name).map(|_| true)?))).await
    }

    pub async fn user_grant_role(&self, name: &str, role: &str) -> Result<()> {
        self.change(|s| Ok(((), s.user_grant_role(name, role)?))).await
    }

    pub async fn user_revoke_role(&self, name: &str, role: &str) -> Result<()> {
        self.change(|s| Ok(((), s.user_revoke_role(name, role).map(|_| true)?))).await
    }

    pub async fn role_add(&self, name: &str) -> Result<()> {
        self.change(|s| Ok(((), s.role_add(name).map(|_| true)?))).await
    }

    pub async fn role_delete(&self, name: &str) -> Result<()> {
        self.change(|s| Ok(((), s.role_delete(name).map(|_| true)?))).await
    }

    pub async fn role_grant_permission(&self, name: &str, perm: Option<Permission>) -> Result<()> {
        self.change(|s| Ok(((), s.role_grant_permission(name, perm.clone()).map(|_| true)?))).await
    }

    pub async fn role_revoke_permission(&self, name: &str, key: &[u8], range_end: &[u8]) -> Result<()> {
        self.change(|s| Ok(((), s.role_revoke_permission(name, key, range_end).map(|_| true)?))).await
    }

    /// UserGet: the user's roles. Its caller must be an admin or the user.
    pub async fn user_get(&self, caller: &Caller, name: &str) -> Result<Vec<String>> {
        if !matches!(caller, Caller::User(me, _) if me == name) {
            self.admin(caller)?;
        }
        Ok(self.reload().await?.state.user(name)?.roles.clone())
    }

    /// RoleGet: the role's permissions. Its caller must be an admin or hold the role.
    pub async fn role_get(&self, caller: &Caller, role: &str) -> Result<Vec<Permission>> {
        let known = self.reload().await?;
        let holds = matches!(caller, Caller::User(me, _) if known.state.users.get(me).is_some_and(|u| u.roles.iter().any(|r| r == role)));
        if !holds {
            self.admin(caller)?;
        }
        known.state.role_permissions(role)
    }

    pub async fn user_list(&self) -> Result<Vec<String>> {
        Ok(self.reload().await?.state.users.keys().cloned().collect())
    }

    pub async fn role_list(&self) -> Result<Vec<String>> {
        Ok(self.reload().await?.state.roles.keys().cloned().collect())
    }
}
