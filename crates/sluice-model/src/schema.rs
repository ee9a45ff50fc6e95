//! JSON schemas of every Admin API resource: the one source of truth that Admin writes are validated against and
//! that `GET /apisix/admin/schema/{resource}` serves. Field names, bounds and the cross-field rules (uri or uris,
//! host or hosts, nodes or service discovery, ...) follow APISIX 3.x `apisix/schema_def.lua`, written afresh here.
//! Plugin schemas are not here: each plugin owns its own.

mod validate;

use serde_json::{json, Value};

pub use validate::validate;

/// Ids: a string of `[a-zA-Z0-9-_.]`, 1..64 chars, or a positive integer.
pub fn id_schema() -> Value {
    json!({"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9\\-_.]+$"},
        {"type": "integer", "minimum": 1}
    ]})
}

const HOST_PATTERN: &str = "^\\*$|^\\*?[0-9a-zA-Z\\-._\\[\\]:]+$";
const IPV4_CIDR: &str = "^((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])/([12]?[0-9]|3[0-2])$";
const IPV6_CIDR: &str =
    "^([a-fA-F0-9]{0,4}:){1,8}(:[a-fA-F0-9]{0,4}){0,8}([a-fA-F0-9]{0,4})?/[0-9]{1,3}$";

fn host() -> Value {
    json!({"type": "string", "pattern": HOST_PATTERN})
}

fn remote_addr() -> Value {
    json!({"type": "string", "anyOf": [
        {"format": "ipv4"}, {"pattern": IPV4_CIDR}, {"format": "ipv6"}, {"pattern": IPV6_CIDR}
    ]})
}

fn labels() -> Value {
    json!({"type": "object", "patternProperties": {
        ".*": {"type": "string", "pattern": "^\\S+$", "minLength": 1, "maxLength": 256}
    }})
}

fn name() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 256})
}

fn desc() -> Value {
    json!({"type": "string", "maxLength": 256})
}

fn timeout() -> Value {
    let secs = json!({"type": "number", "exclusiveMinimum": 0});
    json!({"type": "object", "properties": {"connect": secs, "send": secs, "read": secs},
           "required": ["connect", "send", "read"]})
}

/// Metadata properties every resource carries (id, name, desc, labels, timestamps).
fn meta() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("id".into(), id_schema());
    m.insert("name".into(), name());
    m.insert("desc".into(), desc());
    m.insert("labels".into(), labels());
    m.insert("create_time".into(), json!({"type": "integer"}));
    m.insert("update_time".into(), json!({"type": "integer"}));
    m
}

fn with_meta(props: Value) -> Value {
    let mut m = meta();
    if let Value::Object(p) = props {
        m.extend(p);
    }
    Value::Object(m)
}

fn plugins() -> Value {
    json!({"type": "object"})
}

fn pem() -> Value {
    json!({"type": "string", "minLength": 128, "maxLength": 65536})
}

pub fn upstream() -> Value {
    let weight = json!({"type": "integer", "minimum": 0});
    json!({
        "type": "object",
        "properties": with_meta(json!({
            "nodes": {"anyOf": [
                {"type": "object", "patternProperties": {".*": weight}},
                {"type": "array", "items": {"type": "object", "properties": {
                    "host": host(),
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "weight": weight,
                    "priority": {"type": "integer", "default": 0},
                    "metadata": {"type": "object"}
                }, "required": ["host", "weight"]}}
            ]},
            "retries": {"type": "integer", "minimum": 0},
            "retry_timeout": {"type": "number", "minimum": 0},
            "timeout": timeout(),
            "tls": {"type": "object", "properties": {
                "client_cert_id": id_schema(), "client_cert": pem(), "client_key": pem(),
                "verify": {"type": "boolean", "default": false}
            }, "dependencies": {
                // Inline cert and key together, or an `ssls` id: never both (APISIX's upstream tls schema).
                "client_cert": {"required": ["client_key"], "not": {"required": ["client_cert_id"]}},
                "client_key": {"required": ["client_cert"], "not": {"required": ["client_cert_id"]}},
                "client_cert_id": {"not": {"anyOf": [{"required": ["client_cert"]}, {"required": ["client_key"]}]}}
            }},
            "keepalive_pool": {"type": "object", "properties": {
                "size": {"type": "integer", "default": 320, "minimum": 1},
                "idle_timeout": {"type": "number", "default": 60, "minimum": 0},
                "requests": {"type": "integer", "default": 1000, "minimum": 1}
            }},
            "type": {"type": "string", "default": "roundrobin"},
            "checks": {"type": "object"},
            "hash_on": {"type": "string", "default": "vars",
                        "enum": ["vars", "header", "cookie", "consumer", "vars_combinations"]},
            "key": {"type": "string"},
            // h2c/h2: Sluice's HTTP/2 upstreams (prior knowledge / TLS with ALPN h2), not in APISIX.
            "scheme": {"default": "http",
                       "enum": ["grpc", "grpcs", "http", "https", "tcp", "tls", "udp", "kafka", "h2c", "h2"]},
            "discovery_type": {"type": "string"},
            "discovery_args": {"type": "object"},
            "pass_host": {"type": "string", "enum": ["pass", "node", "rewrite"], "default": "pass"},
            "upstream_host": host(),
            "service_name": {"type": "string", "minLength": 1, "maxLength": 256}
        })),
        "oneOf": [{"required": ["nodes"]}, {"required": ["service_name", "discovery_type"]}],
        "additionalProperties": false
    })
}

pub fn route() -> Value {
    let one_or_none = |a: &str, b: &str| {
        json!({"oneOf": [
            {"not": {"anyOf": [{"required": [a]}, {"required": [b]}]}},
            {"required": [a]}, {"required": [b]}
        ]})
    };
    let mut any = Vec::new();
    for u in ["uri", "uris"] {
        for other in ["plugins", "upstream", "upstream_id", "service_id", "script"] {
            any.push(json!({"required": [other, u]}));
        }
    }
    json!({
        "type": "object",
        "properties": with_meta(json!({
            "uri": {"type": "string", "minLength": 1, "maxLength": 4096},
            "uris": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": true},
            "priority": {"type": "integer", "default": 0},
            "methods": {"type": "array", "uniqueItems": true, "items": {"type": "string", "enum":
                ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "PURGE"]}},
            "host": host(),
            "hosts": {"type": "array", "items": host(), "minItems": 1, "uniqueItems": true},
            "remote_addr": remote_addr(),
            "remote_addrs": {"type": "array", "items": remote_addr(), "minItems": 1, "uniqueItems": true},
            "timeout": timeout(),
            "vars": {"type": "array"},
            "filter_func": {"type": "string", "minLength": 10, "pattern": "^function"},
            "script": {"type": "string", "minLength": 10, "maxLength": 102400},
            "script_id": id_schema(),
            "plugins": plugins(),
            "plugin_config_id": id_schema(),
            "upstream": upstream(),
            "service_id": id_schema(),
            "upstream_id": id_schema(),
            "enable_websocket": {"type": "boolean"},
            "status": {"type": "integer", "enum": [1, 0], "default": 1}
        })),
        "allOf": [
            {"oneOf": [{"required": ["uri"]}, {"required": ["uris"]}]},
            one_or_none("host", "hosts"),
            one_or_none("remote_addr", "remote_addrs")
        ],
        "anyOf": any,
        "not": {"anyOf": [{"required": ["script", "plugins"]}, {"required": ["script", "plugin_config_id"]}]},
        "additionalProperties": false
    })
}

/// APISIX's `stream_route`: L4 matching fields, an upstream (inline, by id or through a service), stream plugins
/// and an xRPC `protocol` (accepted here; the data plane refuses it).
pub fn stream_route() -> Value {
    json!({
        "type": "object",
        "properties": with_meta(json!({
            "remote_addr": remote_addr(),
            "server_addr": remote_addr(),
            "server_port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "sni": host(),
            "upstream": upstream(),
            "upstream_id": id_schema(),
            "service_id": id_schema(),
            "plugins": plugins(),
            "protocol": {"type": "object", "properties": {
                "name": {"type": "string"},
                "superior_id": id_schema(),
                "conf": {"type": "object"},
                "logger": {"type": "array", "items": {"properties": {
                    "name": {"type": "string"}, "filter": {"type": "array"}, "conf": {"type": "object"}
                }, "dependencies": {"name": ["conf"]}, "additionalProperties": false}}
            }, "required": ["name"]}
        })),
        "additionalProperties": false
    })
}

pub fn service() -> Value {
    json!({
        "type": "object",
        "properties": with_meta(json!({
            "plugins": plugins(),
            "upstream": upstream(),
            "upstream_id": id_schema(),
            "script": {"type": "string", "minLength": 10, "maxLength": 102400},
            "enable_websocket": {"type": "boolean"},
            "hosts": {"type": "array", "items": host(), "minItems": 1, "uniqueItems": true}
        })),
        "additionalProperties": false
    })
}

pub fn consumer() -> Value {
    let mut props = meta();
    props.remove("name");
    props.insert(
        "username".into(),
        json!({"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[a-zA-Z0-9_\\-]+$"}),
    );
    props.insert("group_id".into(), id_schema());
    props.insert("plugins".into(), plugins());
    json!({"type": "object", "properties": props, "required": ["username"], "additionalProperties": false})
}

pub fn credential() -> Value {
    // At most one auth plugin per credential (APISIX's `maxProperties = 1`).
    json!({"type": "object",
           "properties": with_meta(json!({"plugins": {"type": "object", "maxProperties": 1}})),
           "additionalProperties": false})
}

pub fn ssl() -> Value {
    let sni = json!({"type": "string", "pattern": HOST_PATTERN});
    let mut props = meta();
    props.remove("name");
    if let Value::Object(p) = json!({
        "type": {"type": "string", "default": "server", "enum": ["server", "client"]},
        "cert": pem(), "key": pem(),
        "sni": sni,
        "snis": {"type": "array", "items": sni, "minItems": 1},
        "certs": {"type": "array", "items": pem()},
        "keys": {"type": "array", "items": pem()},
        "client": {"type": "object", "properties": {
            "ca": pem(), "depth": {"type": "integer", "minimum": 0, "default": 1},
            "skip_mtls_uri_regex": {"type": "array", "minItems": 1, "uniqueItems": true,
                                    "items": {"type": "string"}}
        }, "required": ["ca"]},
        "status": {"type": "integer", "enum": [1, 0], "default": 1},
        "ssl_protocols": {"type": "array", "maxItems": 3, "uniqueItems": true,
                          "items": {"enum": ["TLSv1.1", "TLSv1.2", "TLSv1.3"]}}
    }) {
        props.extend(p);
    }
    json!({
        "type": "object", "properties": props,
        "if": {"properties": {"type": {"enum": ["server"]}}},
        "then": {"oneOf": [{"required": ["sni", "key", "cert"]}, {"required": ["snis", "key", "cert"]}]},
        "else": {"required": ["key", "cert"]},
        "additionalProperties": false
    })
}

pub fn global_rule() -> Value {
    json!({"type": "object", "properties": with_meta(json!({"plugins": plugins()})),
           "required": ["id", "plugins"], "additionalProperties": false})
}

pub fn plugin_config() -> Value {
    let mut s = global_rule();
    s["properties"]["name"] = json!({"type": "string"});
    s
}

pub fn consumer_group() -> Value {
    global_rule()
}

pub fn proto() -> Value {
    json!({"type": "object", "properties": with_meta(json!({
        "content": {"type": "string", "minLength": 1, "maxLength": 1048576}
    })), "required": ["content"], "additionalProperties": false})
}

pub fn secret() -> Value {
    // Secret managers (vault, aws, gcp) each have their own fields; only the metadata is checked here.
    // The id is `{manager}/{id}` (e.g. `vault/1`), so it is not an ordinary id.
    json!({"type": "object", "properties": with_meta(json!({"id": {"type": "string"}})), "minProperties": 1})
}

pub fn plugin_metadata() -> Value {
    // Each plugin owns its metadata schema; the catalog checks it.
    json!({"type": "object", "properties": {"id": {"type": "string"}}})
}

/// The schema of a resource by its Admin API name (`routes`, `route`, `ssls`, `ssl`, ...).
pub fn resource_schema(name: &str) -> Option<Value> {
    Some(match name.trim_end_matches('s') {
        "route" => route(),
        "stream_route" => stream_route(),
        "service" => service(),
        "upstream" => upstream(),
        "consumer" => consumer(),
        "credential" => credential(),
        "ssl" => ssl(),
        "global_rule" => global_rule(),
        "plugin_config" => plugin_config(),
        "consumer_group" => consumer_group(),
        "proto" => proto(),
        "secret" => secret(),
        "plugin_metadata" => plugin_metadata(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
