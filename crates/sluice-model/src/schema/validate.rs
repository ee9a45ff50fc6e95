//! A small JSON-Schema (draft 4/7 subset) validator: exactly the keywords Sluice's resource schemas and plugin
//! schemas use, with error texts shaped like APISIX's (lua-resty jsonschema) so Admin API clients see the messages
//! they know. Not a general validator: `$ref`, `format` other than ipv4/ipv6, and remote schemas are not supported.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value};

/// Validates `v` against `schema`; the error reads like APISIX's (`property "uri" validation failed: ...`).
pub fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    if let Some(t) = s.get("type") {
        check_type(t, v)?;
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.iter().any(|o| json_eq(o, v)) {
            return Err("matches none of the enum values".into());
        }
    }
    if let Some(c) = s.get("const") {
        if !json_eq(c, v) {
            return Err(format!("value should be {c}"));
        }
    }
    match v {
        Value::Number(_) => number(s, v)?,
        Value::String(text) => string(s, text)?,
        Value::Array(items) => array(s, items)?,
        Value::Object(obj) => object(s, obj)?,
        _ => {}
    }
    combinators(s, v)
}

/// `text` matches the schema pattern `p`. Patterns are compiled once per thread: the schemas use a few dozen, and a
/// bulk load validates them against every resource (compiling per call cost ~60% of checking 3,000 routes).
fn matches(p: &str, text: &str) -> Result<bool, String> {
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<String, regex::Regex>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    CACHE.with(|c| {
        if let Some(re) = c.borrow().get(p) {
            return Ok(re.is_match(text));
        }
        let re = regex::Regex::new(p).map_err(|e| format!("invalid pattern {p:?}: {e}"))?;
        let hit = re.is_match(text);
        let mut c = c.borrow_mut();
        // Schemas come from code and plugins, not from requests; the bound only guards against a surprise.
        if c.len() >= 1024 {
            c.clear();
        }
        c.insert(p.to_owned(), re);
        Ok(hit)
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    let got = type_name(v);
    want == got || (want == "number" && got == "integer")
}

fn check_type(t: &Value, v: &Value) -> Result<(), String> {
    let ok = match t {
        Value::String(want) => type_matches(want, v),
        Value::Array(wants) => wants
            .iter()
            .filter_map(Value::as_str)
            .any(|w| type_matches(w, v)),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    let expected = match t {
        Value::String(w) => w.clone(),
        other => other.to_string(),
    };
    // Lua has one number type, so APISIX's messages say "number" for integers too.
    let got = match type_name(v) {
        "integer" => "number",
        other => other,
    };
    Err(format!("wrong type: expected {expected}, got {got}"))
}

fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn number(s: &Map<String, Value>, v: &Value) -> Result<(), String> {
    let n = v.as_f64().unwrap_or(0.0);
    let bound = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(min) = bound("minimum") {
        if n < min {
            return Err(format!("expected {v} to be at least {min}"));
        }
    }
    if let Some(max) = bound("maximum") {
        if n > max {
            return Err(format!("expected {v} to be at most {max}"));
        }
    }
    if let Some(min) = bound("exclusiveMinimum") {
        if n <= min {
            return Err(format!("expected {v} to be greater than {min}"));
        }
    }
    if let Some(max) = bound("exclusiveMaximum") {
        if n >= max {
            return Err(format!("expected {v} to be smaller than {max}"));
        }
    }
    Ok(())
}

fn string(s: &Map<String, Value>, text: &str) -> Result<(), String> {
    let len = text.chars().count() as u64;
    if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
        if len < min {
            return Err(format!(
                "string too short, expected at least {min}, got {len}"
            ));
        }
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
        if len > max {
            return Err(format!(
                "string too long, expected at most {max}, got {len}"
            ));
        }
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        if !matches(p, text)? {
            return Err(format!("failed to match pattern {p:?} with {text:?}"));
        }
    }
    match s.get("format").and_then(Value::as_str) {
        Some("ipv4") if text.parse::<Ipv4Addr>().is_err() => {
            Err(format!("expected {text:?} to be a valid ipv4 address"))
        }
        Some("ipv6") if text.parse::<Ipv6Addr>().is_err() => {
            Err(format!("expected {text:?} to be a valid ipv6 address"))
        }
        _ => Ok(()),
    }
}

fn array(s: &Map<String, Value>, items: &[Value]) -> Result<(), String> {
    let len = items.len() as u64;
    if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
        if len < min {
            return Err(format!("expect array to have at least {min} items"));
        }
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
        if len > max {
            return Err(format!("expect array to have at most {max} items"));
        }
    }
    if s.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
        for i in 0..items.len() {
            for j in i + 1..items.len() {
                if json_eq(&items[i], &items[j]) {
                    return Err(format!(
                        "expected unique items but items {} and {} are equal",
                        i + 1,
                        j + 1
                    ));
                }
            }
        }
    }
    if let Some(item_schema) = s.get("items") {
        for (i, item) in items.iter().enumerate() {
            validate(item_schema, item)
                .map_err(|e| format!("failed to validate item {}: {e}", i + 1))?;
        }
    }
    Ok(())
}

fn object(s: &Map<String, Value>, obj: &Map<String, Value>) -> Result<(), String> {
    if let Some(Value::Array(req)) = s.get("required") {
        for name in req.iter().filter_map(Value::as_str) {
            if !obj.contains_key(name) {
                return Err(format!("property {name:?} is required"));
            }
        }
    }
    if let Some(min) = s.get("minProperties").and_then(Value::as_u64) {
        if (obj.len() as u64) < min {
            return Err(format!("expect object to have at least {min} properties"));
        }
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64) {
        if (obj.len() as u64) > max {
            return Err(format!("expect object to have at most {max} properties"));
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    let pattern_props = s.get("patternProperties").and_then(Value::as_object);
    for (name, value) in obj {
        let mut known = false;
        if let Some(p) = props.and_then(|p| p.get(name)) {
            known = true;
            validate(p, value).map_err(|e| format!("property {name:?} validation failed: {e}"))?;
        }
        for (pat, p) in pattern_props.into_iter().flatten() {
            if matches(pat, name)? {
                known = true;
                validate(p, value)
                    .map_err(|e| format!("property {name:?} validation failed: {e}"))?;
            }
        }
        if !known {
            match s.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!("additional properties forbidden, found {name}"))
                }
                Some(extra @ Value::Object(_)) => validate(extra, value)
                    .map_err(|e| format!("property {name:?} validation failed: {e}"))?,
                _ => {}
            }
        }
    }
    if let Some(Value::Object(deps)) = s.get("dependencies") {
        for (name, dep) in deps {
            if !obj.contains_key(name) {
                continue;
            }
            match dep {
                Value::Array(req) => {
                    for r in req.iter().filter_map(Value::as_str) {
                        if !obj.contains_key(r) {
                            return Err(format!("property {r:?} is required when {name:?} is set"));
                        }
                    }
                }
                schema => validate(schema, &Value::Object(obj.clone())).map_err(|e| {
                    format!("failed to validate dependent schema for {name:?}: {e}")
                })?,
            }
        }
    }
    Ok(())
}

fn combinators(s: &Map<String, Value>, v: &Value) -> Result<(), String> {
    if let Some(Value::Array(all)) = s.get("allOf") {
        for sub in all {
            validate(sub, v)?;
        }
    }
    if let Some(Value::Array(any)) = s.get("anyOf") {
        let mut last = None;
        if !any.iter().any(|sub| match validate(sub, v) {
            Ok(()) => true,
            Err(e) => {
                last = Some(e);
                false
            }
        }) {
            let only_required = any.iter().all(|a| {
                a.as_object()
                    .is_some_and(|o| o.len() == 1 && o.contains_key("required"))
            });
            return Err(if only_required {
                let sets: Vec<String> = any.iter().map(|a| a["required"].to_string()).collect();
                format!("object matches none of the required: {}", sets.join(" or "))
            } else {
                format!(
                    "value should match at least one schema, but matches none: {}",
                    last.unwrap_or_default()
                )
            });
        }
    }
    if let Some(Value::Array(one)) = s.get("oneOf") {
        let matched: Vec<usize> = one
            .iter()
            .enumerate()
            .filter(|(_, sub)| validate(sub, v).is_ok())
            .map(|(i, _)| i + 1)
            .collect();
        match matched.as_slice() {
            [_] => {}
            [] => return Err("value should match only one schema, but matches none".into()),
            [a, b, ..] => {
                return Err(format!(
                    "value should match only one schema, but matches both schemas {a} and {b}"
                ))
            }
        }
    }
    if let Some(not) = s.get("not") {
        if validate(not, v).is_ok() {
            return Err(format!("value wasn't supposed to match schema {not}"));
        }
    }
    if let Some(cond) = s.get("if") {
        let branch = if validate(cond, v).is_ok() {
            "then"
        } else {
            "else"
        };
        if let Some(b) = s.get(branch) {
            validate(b, v)?;
        }
    }
    Ok(())
}
