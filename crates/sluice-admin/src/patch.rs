//! PATCH semantics as APISIX applies them: a body merged into the stored value (objects merge recursively, `null`
//! deletes a field, arrays and scalars replace), or, with a sub path (`/routes/1/upstream/nodes`), the body
//! replacing just that part.

use serde_json::{Map, Value};

/// JSON merge-patch (RFC 7396 shape, which is what APISIX's `core.table.merge` amounts to for JSON input).
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Replaces the value at `sub_path` (`a/b/c`); every parent must already be an object.
pub(crate) fn set_sub_path(target: &mut Value, sub_path: &str, v: Value) -> Result<(), String> {
    let parts: Vec<&str> = sub_path.split('/').filter(|s| !s.is_empty()).collect();
    let Some((last, parents)) = parts.split_last() else {
        *target = v;
        return Ok(());
    };
    let mut node = target;
    for p in parents {
        node = node
            .get_mut(*p)
            .filter(|n| n.is_object())
            .ok_or_else(|| format!("invalid sub path: {sub_path}"))?;
    }
    let obj = node
        .as_object_mut()
        .ok_or_else(|| format!("invalid sub path: {sub_path}"))?;
    if v.is_null() {
        obj.remove(*last);
    } else {
        obj.insert((*last).to_owned(), v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_deletes_nulls_and_replaces_arrays() {
        let mut v = json!({"a": {"x": 1, "y": 2}, "l": [1, 2], "k": 1});
        merge(
            &mut v,
            &json!({"a": {"x": null, "z": 3}, "l": [3], "k": null}),
        );
        assert_eq!(v, json!({"a": {"y": 2, "z": 3}, "l": [3]}));
    }

    #[test]
    fn sub_path_replaces_only_that_part() {
        let mut v = json!({"upstream": {"nodes": {"a:1": 1}, "type": "roundrobin"}});
        set_sub_path(&mut v, "upstream/nodes", json!({"b:2": 1})).unwrap();
        assert_eq!(
            v["upstream"],
            json!({"nodes": {"b:2": 1}, "type": "roundrobin"})
        );
        assert!(set_sub_path(&mut v, "missing/x", json!(1)).is_err());
    }
}
