//! The gateway's routes, read from the services' `google.api.http` annotations in the
//! descriptors (so they are exactly etcd's, additional bindings such as
//! `/v3/kv/lease/revoke` included). RangeStream has none: it is gRPC only, as in etcd.

use prost_reflect::{DescriptorPool, MessageDescriptor, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// One HTTP path and the gRPC method it calls.
#[derive(Debug)]
pub struct Route {
    /// `/etcdserverpb.KV/Range`
    pub grpc_path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

/// The POST paths of one `google.api.http` rule and of its additional bindings.
fn posts(rule: &prost_reflect::DynamicMessage, out: &mut Vec<String>) {
    if let Some(Value::String(path)) = rule.get_field_by_name("post").as_deref()
        && !path.is_empty()
    {
        out.push(path.clone());
    }
    if let Some(Value::List(more)) = rule.get_field_by_name("additional_bindings").as_deref() {
        for binding in more {
            if let Value::Message(m) = binding {
                posts(m, out);
            }
        }
    }
}

/// Every annotated method of the etcd API, by HTTP path.
pub fn from_descriptors(pool: &DescriptorPool) -> HashMap<String, Arc<Route>> {
    let mut routes = HashMap::new();
    let Some(http) = pool.get_extension_by_name("google.api.http") else { return routes };
    for service in pool.services() {
        for method in service.methods() {
            let options = method.options();
            if !options.has_extension(&http) {
                continue;
            }
            let mut paths = Vec::new();
            if let Value::Message(rule) = options.get_extension(&http).as_ref() {
                posts(rule, &mut paths);
            }
            let route = Arc::new(Route {
                grpc_path: format!("/{}/{}", service.full_name(), method.name()),
                input: method.input(),
                output: method.output(),
                client_streaming: method.is_client_streaming(),
                server_streaming: method.is_server_streaming(),
            });
            for path in paths {
                routes.insert(path, route.clone());
            }
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    #[test]
    fn etcds_routes_are_all_there() {
        let pool = prost_reflect::DescriptorPool::decode(kine_proto::FILE_DESCRIPTOR_SET).unwrap();
        let routes = super::from_descriptors(&pool);
        for (path, grpc) in [
            ("/v3/kv/range", "/etcdserverpb.KV/Range"),
            ("/v3/kv/txn", "/etcdserverpb.KV/Txn"),
            ("/v3/watch", "/etcdserverpb.Watch/Watch"),
            ("/v3/kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"),
            ("/v3/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive"),
            ("/v3/maintenance/snapshot", "/etcdserverpb.Maintenance/Snapshot"),
            ("/v3/auth/user/changepw", "/etcdserverpb.Auth/UserChangePassword"),
            ("/v3/cluster/member/list", "/etcdserverpb.Cluster/MemberList"),
            ("/v3/lock/lock", "/v3lockpb.Lock/Lock"),
            ("/v3/election/observe", "/v3electionpb.Election/Observe"),
        ] {
            assert_eq!(routes.get(path).map(|r| r.grpc_path.as_str()), Some(grpc), "{path}");
        }
        assert!(routes["/v3/watch"].client_streaming && routes["/v3/watch"].server_streaming);
        assert!(!routes.values().any(|r| r.grpc_path.ends_with("/RangeStream")), "RangeStream is gRPC only");
        // KV 5, Watch 1, Lease 5 (+3 bindings), Cluster 5, Maintenance 8, Auth 17, Lock 2, Election 5.
        assert_eq!(routes.len(), 51);
    }
}
