//! The one place where kine-rs errors become gRPC statuses, with etcd's codes and exact texts
//! (etcd's clients recognise errors by their message).

use kine_core::Error;
use kine_core::error::AuthError;
use tonic::{Code, Status};

/// etcd's gRPC code and message for an error.
pub fn code_and_message(e: &Error) -> (Code, String) {
    let etcd = |code, text: &str| (code, text.to_string());
    match e {
        Error::Compacted { .. } => etcd(Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"),
        Error::FutureRevision => etcd(Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"),
        Error::EmptyKey => etcd(Code::InvalidArgument, "etcdserver: key is not provided"),
        // etcd 3.6's order; a Txn emulating 3.7 answers LeaseNotFound instead (`kv.rs`).
        Error::KeyNotFound | Error::KeyAndLeaseNotFound => etcd(Code::InvalidArgument, "etcdserver: key not found"),
        Error::ValueProvided => etcd(Code::InvalidArgument, "etcdserver: value is provided"),
        Error::LeaseProvided => etcd(Code::InvalidArgument, "etcdserver: lease is provided"),
        Error::InvalidSortOption => etcd(Code::InvalidArgument, "etcdserver: invalid sort option"),
        Error::TooManyOps => etcd(Code::InvalidArgument, "etcdserver: too many operations in txn request"),
        Error::DuplicateKey => etcd(Code::InvalidArgument, "etcdserver: duplicate key given in txn request"),
        Error::LeaseNotFound => etcd(Code::NotFound, "etcdserver: requested lease not found"),
        Error::LeaseExists => etcd(Code::FailedPrecondition, "etcdserver: lease already exists"),
        Error::LeaseTtlTooLarge => etcd(Code::OutOfRange, "etcdserver: too large lease TTL"),
        Error::RequestTooLarge => etcd(Code::InvalidArgument, "etcdserver: request is too large"),
        Error::NoSpace => etcd(Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"),
        // gRPC's own refusal of a message above the server's send limit, as etcd's clients see
        // it (the size is what had been read when kine-rs stopped reading: a lower bound).
        Error::ResponseTooLarge { size, max } => {
            (Code::ResourceExhausted, format!("grpc: trying to send message larger than max ({size} vs. {max})"))
        }
        Error::Corrupt => etcd(Code::DataLoss, "etcdserver: corrupt cluster"),
        Error::ReadOnly(why) => (Code::FailedPrecondition, format!("etcdserver: rpc not supported for learner: {why}")),
        Error::NotLearner => etcd(Code::FailedPrecondition, "etcdserver: can only promote a learner member"),
        Error::MemberNotFound => etcd(Code::NotFound, "etcdserver: member not found"),
        // etcd's client library's own error (`status_via_client`).
        Error::SessionExpired => (Code::Unknown, "mutex: session is expired".to_string()),
        Error::NotLeader => (Code::Unknown, "election: not leader".to_string()),
        Error::NoLeader => (Code::Unknown, "election: no leader".to_string()),
        Error::Auth(e) => auth_code_and_message(*e),
        Error::Unsupported(what) => (Code::Unimplemented, what.clone()),
        Error::InvalidArgument(what) => (Code::InvalidArgument, what.clone()),
        Error::Unavailable(what) => (Code::Unavailable, what.clone()),
        Error::TimedOut => etcd(Code::Unavailable, "etcdserver: request timed out"),
        Error::Backend(err) => (Code::Unknown, format!("{err:#}")),
    }
}

fn auth_code_and_message(e: AuthError) -> (Code, String) {
    use AuthError::*;
    let (code, text) = match e {
        RootUserNotExist => (Code::FailedPrecondition, "etcdserver: root user does not exist"),
        RootRoleNotExist => (Code::FailedPrecondition, "etcdserver: root user does not have root role"),
        UserAlreadyExist => (Code::FailedPrecondition, "etcdserver: user name already exists"),
        UserEmpty => (Code::InvalidArgument, "etcdserver: user name is empty"),
        UserNotFound => (Code::FailedPrecondition, "etcdserver: user name not found"),
        RoleAlreadyExist => (Code::FailedPrecondition, "etcdserver: role name already exists"),
        RoleNotFound => (Code::FailedPrecondition, "etcdserver: role name not found"),
        RoleEmpty => (Code::InvalidArgument, "etcdserver: role name is empty"),
        AuthFailed => (Code::InvalidArgument, "etcdserver: authentication failed, invalid user ID or password"),
        PermissionNotGiven => (Code::InvalidArgument, "etcdserver: permission not given"),
        PermissionDenied => (Code::PermissionDenied, "etcdserver: permission denied"),
        RoleNotGranted => (Code::FailedPrecondition, "etcdserver: role is not granted to the user"),
        PermissionNotGranted => (Code::FailedPrecondition, "etcdserver: permission is not granted to the role"),
        AuthNotEnabled => (Code::FailedPrecondition, "etcdserver: authentication is not enabled"),
        InvalidAuthToken => (Code::Unauthenticated, "etcdserver: invalid auth token"),
        InvalidAuthMgmt => (Code::InvalidArgument, "etcdserver: invalid auth management"),
        AuthOldRevision => (Code::InvalidArgument, "etcdserver: revision of auth store is old"),
        // etcd has no gRPC error for these and sends its internal text as Unknown.
        VerifyOnly => (Code::Unknown, "auth: token signing attempted with verify-only key"),
        NoPasswordUser => (Code::Unknown, "auth: authentication failed, password was given for no password user"),
    };
    (code, text.to_string())
}

pub fn status(e: Error) -> Status {
    let (code, message) = code_and_message(&e);
    if code == Code::Unknown && !matches!(e, Error::Auth(_)) {
        // A human should look at backend failures.
        tracing::error!(error = %message, "request failed in the backend");
    }
    Status::new(code, message)
}

/// An error of the Lock service: etcd serves it through its own client library, whose errors
/// are not gRPC statuses, so callers get every error as Unknown with etcd's text (checked
/// against etcd 3.7: a missing lease is `Unknown: etcdserver: requested lease not found`).
pub fn status_via_client(e: Error) -> Status {
    via_client(status(e))
}

/// A status as the Lock and Election services pass it on: Unknown, with the text kept.
pub fn via_client(s: Status) -> Status {
    Status::new(Code::Unknown, s.message())
}

/// Shorthand for an unsupported RPC or field.
pub fn unsupported(what: &str) -> Status {
    status(Error::Unsupported(format!("{what} is not supported by kine-rs")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_codes_and_texts() {
        let table: Vec<(Error, Code, &str)> = vec![
            (
                Error::Compacted { compact_revision: 3 },
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (Error::FutureRevision, Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"),
            (Error::EmptyKey, Code::InvalidArgument, "etcdserver: key is not provided"),
            (Error::KeyNotFound, Code::InvalidArgument, "etcdserver: key not found"),
            (Error::ValueProvided, Code::InvalidArgument, "etcdserver: value is provided"),
            (Error::LeaseProvided, Code::InvalidArgument, "etcdserver: lease is provided"),
            (Error::InvalidSortOption, Code::InvalidArgument, "etcdserver: invalid sort option"),
            (Error::TooManyOps, Code::InvalidArgument, "etcdserver: too many operations in txn request"),
            (Error::DuplicateKey, Code::InvalidArgument, "etcdserver: duplicate key given in txn request"),
            (Error::LeaseNotFound, Code::NotFound, "etcdserver: requested lease not found"),
            (Error::LeaseExists, Code::FailedPrecondition, "etcdserver: lease already exists"),
            (Error::LeaseTtlTooLarge, Code::OutOfRange, "etcdserver: too large lease TTL"),
            (Error::RequestTooLarge, Code::InvalidArgument, "etcdserver: request is too large"),
            (Error::NotLearner, Code::FailedPrecondition, "etcdserver: can only promote a learner member"),
            (Error::MemberNotFound, Code::NotFound, "etcdserver: member not found"),
            (Error::SessionExpired, Code::Unknown, "mutex: session is expired"),
            (Error::NotLeader, Code::Unknown, "election: not leader"),
            (Error::NoLeader, Code::Unknown, "election: no leader"),
            (
                Error::ReadOnly("a copy of X".into()),
                Code::FailedPrecondition,
                "etcdserver: rpc not supported for learner: a copy of X",
            ),
        ];
        for (err, code, text) in table {
            let s = status(err);
            assert_eq!((s.code(), s.message()), (code, text));
        }
        // The Lock service keeps the text and answers Unknown, as etcd's does.
        let s = status_via_client(Error::LeaseNotFound);
        assert_eq!((s.code(), s.message()), (Code::Unknown, "etcdserver: requested lease not found"));
    }
}
