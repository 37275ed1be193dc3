//! Protobuf ↔ JSON as etcd's gateway writes and reads it (protojson with proto field names,
//! 64-bit integers as strings, bytes in base64, enums by name, default values left out;
//! unknown fields ignored on input, numbers or strings accepted for integers).

use prost::Message;
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};

fn serialize_options() -> SerializeOptions {
    SerializeOptions::new().use_proto_field_name(true).skip_default_fields(true).stringify_64_bit_integers(true)
}

fn deserialize_options() -> DeserializeOptions {
    DeserializeOptions::new().deny_unknown_fields(false)
}

/// The protobuf encoding of one JSON value read as `desc`.
fn from_value(desc: &MessageDescriptor, value: serde_json::Value) -> Result<Vec<u8>, String> {
    let message = DynamicMessage::deserialize_with_options(desc.clone(), value, &deserialize_options())
        .map_err(|e| e.to_string())?;
    Ok(message.encode_to_vec())
}

/// A unary request: the body's first JSON value (an empty body is an empty request; what
/// follows the first value is ignored, as etcd's gateway does).
pub fn request(desc: &MessageDescriptor, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    match values.next() {
        None => Ok(Vec::new()),
        Some(Ok(value)) => from_value(desc, value),
        Some(Err(e)) => Err(e.to_string()),
    }
}

/// A streamed request: every JSON value of the body, in order. A malformed value ends the
/// list (etcd's gateway stops reading there).
pub fn requests(desc: &MessageDescriptor, body: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for value in serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>() {
        match value {
            Ok(v) => out.push(from_value(desc, v)?),
            Err(e) if out.is_empty() => return Err(e.to_string()),
            Err(_) => break,
        }
    }
    Ok(out)
}

/// A response message as JSON.
pub fn response(desc: &MessageDescriptor, proto: &[u8]) -> Result<Vec<u8>, String> {
    let message = DynamicMessage::decode(desc.clone(), proto).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(proto.len() * 2 + 16);
    let mut serializer = serde_json::Serializer::new(&mut out);
    message.serialize_with_options(&mut serializer, &serialize_options()).map_err(|e| e.to_string())?;
    Ok(out)
}

/// etcd's error body: `{"code":N,"message":"…"}`.
pub fn error(code: i32, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "code": code, "message": message })).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kine_proto::etcdserverpb as pb;

    fn pool() -> prost_reflect::DescriptorPool {
        prost_reflect::DescriptorPool::decode(kine_proto::FILE_DESCRIPTOR_SET).unwrap()
    }

    #[test]
    fn etcds_shapes() {
        let pool = pool();
        let range = pool.get_message_by_name("etcdserverpb.RangeRequest").unwrap();
        // APISIX's form: numbers for integers and enums, every field sent, escaped slashes.
        let body =
            br#"{"key":"L2E=","range_end":"L2I=","limit":0,"revision":"5","sort_order":0,"serializable":false,"x":1}"#;
        let req = pb::RangeRequest::decode(request(&range, body).unwrap().as_slice()).unwrap();
        assert_eq!((req.key.as_slice(), req.range_end.as_slice(), req.revision), (&b"/a"[..], &b"/b"[..], 5));
        assert_eq!(request(&range, b"").unwrap(), Vec::<u8>::new());
        assert!(request(&range, b"{\"limit\":\"abc\"}").is_err());
        assert!(request(&range, b"x").is_err());
        let resp = pool.get_message_by_name("etcdserverpb.RangeResponse").unwrap();
        let msg = pb::RangeResponse {
            header: Some(pb::ResponseHeader { cluster_id: 1, member_id: 2, revision: 3, raft_term: 0 }),
            kvs: vec![kine_proto::mvccpb::KeyValue {
                key: b"foo".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                version: 2,
                value: b"bar".to_vec(),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        let json = String::from_utf8(response(&resp, &msg.encode_to_vec()).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"header":{"cluster_id":"1","member_id":"2","revision":"3"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"YmFy"}],"count":"1"}"#
        );
        let watch = pool.get_message_by_name("etcdserverpb.WatchRequest").unwrap();
        let two = requests(&watch, br#"{"create_request":{"key":"YQ=="}} {"progress_request":{}}"#).unwrap();
        assert_eq!(two.len(), 2);
    }
}
