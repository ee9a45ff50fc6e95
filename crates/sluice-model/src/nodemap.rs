//! [`NodeMap`]: `nodes` in APISIX's map form (`{"host:port": weight}`), stored compactly.
//!
//! A `serde_json::Map` is a `BTreeMap`, whose every node holds room for eleven entries: ~650 bytes for the usual
//! one-node upstream, paid by every route with an inline upstream (issue 16: route scale). This keeps the entries
//! in one boxed slice sorted by address instead, with the `BTreeMap`'s behaviour where it shows: iteration and
//! serialization in key order, and a repeated key keeps the last value written.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// `host:port` -> weight (kept as written: an invalid weight is reported when the nodes are listed, not parsed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMap(Box<[(String, Value)]>);

impl NodeMap {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&String, &Value)> + '_ {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn get(&self, addr: &str) -> Option<&Value> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(addr))
            .ok()
            .map(|i| &self.0[i].1)
    }
}

impl FromIterator<(String, Value)> for NodeMap {
    /// Sorted by key; of repeated keys the last one stays (as `BTreeMap::insert`).
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut v: Vec<(String, Value)> = iter.into_iter().collect();
        // Stable, so equal keys keep their order and the last written can be kept.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, Value)> = Vec::with_capacity(v.len());
        for e in v {
            match out.last_mut() {
                Some(last) if last.0 == e.0 => last.1 = e.1,
                _ => out.push(e),
            }
        }
        NodeMap(out.into_boxed_slice())
    }
}

impl From<Map<String, Value>> for NodeMap {
    fn from(m: Map<String, Value>) -> Self {
        m.into_iter().collect()
    }
}

impl Serialize for NodeMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for NodeMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of node address to weight")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<NodeMap, A::Error> {
                let mut v = Vec::with_capacity(a.size_hint().unwrap_or(1).min(64));
                while let Some(e) = a.next_entry::<String, Value>()? {
                    v.push(e);
                }
                Ok(v.into_iter().collect())
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Nodes;
    use serde_json::json;

    #[test]
    fn reads_back_as_the_btreemap_did_sorted_and_last_repeat_wins() {
        // Repeated keys cannot be written with `json!`; parse them from text.
        let text = r#"{"b:2": 2, "a:1": 1, "c:3": 3, "a:1": 7}"#;
        let m: NodeMap = serde_json::from_str(text).unwrap();
        let old: Map<String, Value> = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            serde_json::to_string(&old).unwrap()
        );
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("a:1"), Some(&json!(7)));
        assert_eq!(m.get("z:1"), None);
        assert_eq!(NodeMap::from(old), m);
    }

    #[test]
    fn nodes_take_either_form_and_a_bad_weight_still_fails_listing() {
        let map: Nodes = serde_json::from_value(json!({"127.0.0.1:80": 1})).unwrap();
        assert!(matches!(&map, Nodes::Map(m) if m.len() == 1));
        let list: Nodes =
            serde_json::from_value(json!([{"host": "127.0.0.1", "port": 80, "weight": 1}]))
                .unwrap();
        assert_eq!(map.to_list().unwrap(), list.to_list().unwrap());
        let bad: Nodes = serde_json::from_value(json!({"127.0.0.1:80": "x"})).unwrap();
        assert_eq!(
            bad.to_list().unwrap_err(),
            "invalid weight for node 127.0.0.1:80: \"x\""
        );
        assert_eq!(
            serde_json::to_value(&bad).unwrap(),
            json!({"127.0.0.1:80": "x"})
        );
    }
}
