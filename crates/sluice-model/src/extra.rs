//! Resource types added for the Admin API's remaining collections (APISIX 3.x): consumer credentials, consumer
//! groups, plugin metadata, protos and secrets. Like the core types they keep APISIX's field names and leave
//! plugin configurations as JSON; they are data only.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Id, Plugins};

/// A consumer's credential (`/apisix/consumers/{username}/credentials/{id}`): auth-plugin settings held apart
/// from the consumer so they can rotate independently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Credential {
    pub id: Id,
    /// The owning consumer's username (from the key, not the body).
    pub consumer: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub plugins: Plugins,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsumerGroup {
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    pub plugins: Plugins,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
}

/// Node-wide settings of one plugin (`/apisix/plugin_metadata/{plugin name}`); the plugin owns the schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PluginMetadata {
    /// The plugin name.
    #[serde(default)]
    pub id: Id,
    #[serde(flatten)]
    pub conf: Map<String, Value>,
}

/// A protobuf definition for grpc-transcode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Proto {
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    pub content: String,
}

/// A secret manager's settings (`/apisix/secrets/{manager}/{id}`, e.g. `vault/1`); fields depend on the manager.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Secret {
    /// `{manager}/{id}`.
    #[serde(default)]
    pub id: Id,
    #[serde(flatten)]
    pub conf: Map<String, Value>,
}
