//! The one error type of kine-rs. Its variants are exactly what a client must tell apart;
//! `kine-server` maps each to etcd's gRPC code and message text in one place.

use crate::types::Revision;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("required revision has been compacted (compacted at {compact_revision})")]
    Compacted { compact_revision: Revision },
    #[error("required revision is a future revision")]
    FutureRevision,
    #[error("key is not provided")]
    EmptyKey,
    #[error("key not found")]
    KeyNotFound,
    /// A put in a Txn with `ignore_value` or `ignore_lease` on a missing key that also names a
    /// missing lease: etcd 3.6 answers [`Error::KeyNotFound`], etcd 3.7 [`Error::LeaseNotFound`]
    /// (it checks the lease first); the server answers as the version it emulates.
    #[error("key not found, and the requested lease not found")]
    KeyAndLeaseNotFound,
    #[error("value is provided")]
    ValueProvided,
    #[error("lease is provided")]
    LeaseProvided,
    #[error("invalid sort option")]
    InvalidSortOption,
    #[error("too many operations in txn request")]
    TooManyOps,
    #[error("duplicate key given in txn request")]
    DuplicateKey,
    #[error("requested lease not found")]
    LeaseNotFound,
    #[error("lease already exists")]
    LeaseExists,
    #[error("too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("request is too large")]
    RequestTooLarge,
    /// A Range (or a Txn's) whose response would exceed `--max-response-bytes`; `size` is what
    /// had been read when the read stopped (the whole response is at least that).
    #[error("response of more than {size} bytes is larger than the limit of {max}")]
    ResponseTooLarge { size: usize, max: usize },
    /// The datastore has no room for the write (disk or configured size full); raises NOSPACE.
    #[error("database space exceeded")]
    NoSpace,
    /// A CORRUPT alarm is active: writes are refused until it is deactivated.
    #[error("corrupt cluster")]
    Corrupt,
    /// A write on a node that serves a read-only copy (an etcd learner); the text says why and
    /// names the origin.
    #[error("rpc not supported for learner: {0}")]
    ReadOnly(String),
    /// MemberPromote of a member that is not a learner (not a copy, or promoted already).
    #[error("can only promote a learner member")]
    NotLearner,
    #[error("member not found")]
    MemberNotFound,
    /// A Lock request whose own key (and so its lease) was gone by the time it got the lock.
    #[error("mutex: session is expired")]
    SessionExpired,
    /// Proclaim by a candidate that no longer leads (its key is gone or was re-created).
    #[error("election: not leader")]
    NotLeader,
    /// Leader of an election nobody campaigns in.
    #[error("election: no leader")]
    NoLeader,
    /// An error of etcd's auth store (users, roles, tokens, permissions).
    #[error("{0}")]
    Auth(#[from] AuthError),
    /// A request field or RPC kine-rs does not support; the text names it.
    #[error("{0}")]
    Unsupported(String),
    /// A malformed request the etcd API has no dedicated error for; the text says what is wrong.
    #[error("{0}")]
    InvalidArgument(String),
    /// The datastore cannot be reached right now, or the server is stopping.
    #[error("{0}")]
    Unavailable(String),
    /// The datastore did not answer within the request timeout; the outcome of a write is
    /// unknown (etcd's "request timed out").
    #[error("request timed out")]
    TimedOut,
    /// Anything else that went wrong in a backend.
    #[error(transparent)]
    Backend(#[from] anyhow::Error),
}

/// etcd's auth errors, one per error etcd's clients tell apart (their texts are in the gRPC
/// layer's mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("root user does not exist")]
    RootUserNotExist,
    #[error("root user does not have root role")]
    RootRoleNotExist,
    #[error("user name already exists")]
    UserAlreadyExist,
    #[error("user name is empty")]
    UserEmpty,
    #[error("user name not found")]
    UserNotFound,
    #[error("role name already exists")]
    RoleAlreadyExist,
    #[error("role name not found")]
    RoleNotFound,
    #[error("role name is empty")]
    RoleEmpty,
    #[error("authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("permission not given")]
    PermissionNotGiven,
    #[error("permission denied")]
    PermissionDenied,
    #[error("role is not granted to the user")]
    RoleNotGranted,
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    #[error("authentication is not enabled")]
    AuthNotEnabled,
    #[error("invalid auth token")]
    InvalidAuthToken,
    #[error("invalid auth management")]
    InvalidAuthMgmt,
    #[error("revision of auth store is old")]
    AuthOldRevision,
    /// Authenticate on a node whose JWT key can only verify.
    #[error("token signing attempted with verify-only key")]
    VerifyOnly,
    /// A password given for a user added without one.
    #[error("authentication failed, password was given for no password user")]
    NoPasswordUser,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
