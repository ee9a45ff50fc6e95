//! A small JSON-Schema (draft 4/7 subset) validator: exactly the keywords Sluice's resource schemas and plugin
//! schemas use, with error texts shaped like APISIX's (lua-resty jsonschema) so Admin API clients see the messages
//! they know. Not a general validator: `$ref`, `format` other than ipv4/ipv6, and remote schemas are not supported.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value};

/// Validates `v` against `schema`; the error reads like APISIX's (`property "uri" validation failed: ...`).
pub fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    check(schema, v, false)
}

/// The message of a failed check, written only when someone will read it: `quiet` checks (the branches of
/// `oneOf`, `anyOf`, `not` and `if`, whose own messages do not quote them) fail with an empty one. Formatting
/// the discarded messages (one of them quotes a whole schema) was half of a bulk load's validation time.
fn say(quiet: bool, msg: impl FnOnce() -> String) -> String {
    if quiet {
        String::new()
    } else {
        msg()
    }
}

fn check(schema: &Value, v: &Value, q: bool) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    let s = Kw::of(s);
    if let Some(t) = s.type_ {
        check_type(t, v, q)?;
    }
    if let Some(Value::Array(options)) = s.enum_ {
        if !options.iter().any(|o| json_eq(o, v)) {
            return Err("matches none of the enum values".into());
        }
    }
    if let Some(c) = s.const_ {
        if !json_eq(c, v) {
            return Err(say(q, || format!("value should be {c}")));
        }
    }
    match v {
        Value::Number(_) => number(&s, v, q)?,
        Value::String(text) => string(&s, text, q)?,
        Value::Array(items) => array(&s, items, q)?,
        Value::Object(obj) => object(&s, obj, q)?,
        _ => {}
    }
    combinators(&s, v, q)
}

/// The keywords of one schema object, found in one pass over its few keys: looking each of the ~30 keywords up
/// by name was most of a bulk load's validation time (100k routes: ~60 schema objects each).
#[derive(Default)]
struct Kw<'a> {
    type_: Option<&'a Value>,
    enum_: Option<&'a Value>,
    const_: Option<&'a Value>,
    minimum: Option<&'a Value>,
    maximum: Option<&'a Value>,
    exclusive_minimum: Option<&'a Value>,
    exclusive_maximum: Option<&'a Value>,
    min_length: Option<&'a Value>,
    max_length: Option<&'a Value>,
    pattern: Option<&'a Value>,
    format: Option<&'a Value>,
    min_items: Option<&'a Value>,
    max_items: Option<&'a Value>,
    unique_items: Option<&'a Value>,
    items: Option<&'a Value>,
    required: Option<&'a Value>,
    min_properties: Option<&'a Value>,
    max_properties: Option<&'a Value>,
    properties: Option<&'a Value>,
    pattern_properties: Option<&'a Value>,
    additional_properties: Option<&'a Value>,
    dependencies: Option<&'a Value>,
    all_of: Option<&'a Value>,
    any_of: Option<&'a Value>,
    one_of: Option<&'a Value>,
    not: Option<&'a Value>,
    if_: Option<&'a Value>,
    then: Option<&'a Value>,
    else_: Option<&'a Value>,
}

impl<'a> Kw<'a> {
    fn of(s: &'a Map<String, Value>) -> Kw<'a> {
        let mut k = Kw::default();
        for (name, v) in s {
            let slot = match name.as_str() {
                "type" => &mut k.type_,
                "enum" => &mut k.enum_,
                "const" => &mut k.const_,
                "minimum" => &mut k.minimum,
                "maximum" => &mut k.maximum,
                "exclusiveMinimum" => &mut k.exclusive_minimum,
                "exclusiveMaximum" => &mut k.exclusive_maximum,
                "minLength" => &mut k.min_length,
                "maxLength" => &mut k.max_length,
                "pattern" => &mut k.pattern,
                "format" => &mut k.format,
                "minItems" => &mut k.min_items,
                "maxItems" => &mut k.max_items,
                "uniqueItems" => &mut k.unique_items,
                "items" => &mut k.items,
                "required" => &mut k.required,
                "minProperties" => &mut k.min_properties,
                "maxProperties" => &mut k.max_properties,
                "properties" => &mut k.properties,
                "patternProperties" => &mut k.pattern_properties,
                "additionalProperties" => &mut k.additional_properties,
                "dependencies" => &mut k.dependencies,
                "allOf" => &mut k.all_of,
                "anyOf" => &mut k.any_of,
                "oneOf" => &mut k.one_of,
                "not" => &mut k.not,
                "if" => &mut k.if_,
                "then" => &mut k.then,
                "else" => &mut k.else_,
                _ => continue,
            };
            *slot = Some(v);
        }
        k
    }
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

fn check_type(t: &Value, v: &Value, q: bool) -> Result<(), String> {
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
    if q {
        return Err(String::new());
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
    Err(say(q, || {
        format!("wrong type: expected {expected}, got {got}")
    }))
}

fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn number(s: &Kw, v: &Value, q: bool) -> Result<(), String> {
    let n = v.as_f64().unwrap_or(0.0);
    let bound = |k: Option<&Value>| k.and_then(Value::as_f64);
    if let Some(min) = bound(s.minimum) {
        if n < min {
            return Err(say(q, || format!("expected {v} to be at least {min}")));
        }
    }
    if let Some(max) = bound(s.maximum) {
        if n > max {
            return Err(say(q, || format!("expected {v} to be at most {max}")));
        }
    }
    if let Some(min) = bound(s.exclusive_minimum) {
        if n <= min {
            return Err(say(q, || format!("expected {v} to be greater than {min}")));
        }
    }
    if let Some(max) = bound(s.exclusive_maximum) {
        if n >= max {
            return Err(say(q, || format!("expected {v} to be smaller than {max}")));
        }
    }
    Ok(())
}

fn string(s: &Kw, text: &str, q: bool) -> Result<(), String> {
    let len = text.chars().count() as u64;
    if let Some(min) = s.min_length.and_then(Value::as_u64) {
        if len < min {
            return Err(say(q, || {
                format!("string too short, expected at least {min}, got {len}")
            }));
        }
    }
    if let Some(max) = s.max_length.and_then(Value::as_u64) {
        if len > max {
            return Err(say(q, || {
                format!("string too long, expected at most {max}, got {len}")
            }));
        }
    }
    if let Some(p) = s.pattern.and_then(Value::as_str) {
        if !matches(p, text)? {
            return Err(say(q, || {
                format!("failed to match pattern {p:?} with {text:?}")
            }));
        }
    }
    match s.format.and_then(Value::as_str) {
        Some("ipv4") if text.parse::<Ipv4Addr>().is_err() => Err(say(q, || {
            format!("expected {text:?} to be a valid ipv4 address")
        })),
        Some("ipv6") if text.parse::<Ipv6Addr>().is_err() => Err(say(q, || {
            format!("expected {text:?} to be a valid ipv6 address")
        })),
        _ => Ok(()),
    }
}

fn array(s: &Kw, items: &[Value], q: bool) -> Result<(), String> {
    let len = items.len() as u64;
    if let Some(min) = s.min_items.and_then(Value::as_u64) {
        if len < min {
            return Err(say(q, || {
                format!("expect array to have at least {min} items")
            }));
        }
    }
    if let Some(max) = s.max_items.and_then(Value::as_u64) {
        if len > max {
            return Err(say(q, || {
                format!("expect array to have at most {max} items")
            }));
        }
    }
    if s.unique_items.and_then(Value::as_bool) == Some(true) {
        for i in 0..items.len() {
            for j in i + 1..items.len() {
                if json_eq(&items[i], &items[j]) {
                    return Err(say(q, || {
                        format!(
                            "expected unique items but items {} and {} are equal",
                            i + 1,
                            j + 1
                        )
                    }));
                }
            }
        }
    }
    if let Some(item_schema) = s.items {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, q)
                .map_err(|e| say(q, || format!("failed to validate item {}: {e}", i + 1)))?;
        }
    }
    Ok(())
}

fn object(s: &Kw, obj: &Map<String, Value>, q: bool) -> Result<(), String> {
    if let Some(Value::Array(req)) = s.required {
        for name in req.iter().filter_map(Value::as_str) {
            if !obj.contains_key(name) {
                return Err(say(q, || format!("property {name:?} is required")));
            }
        }
    }
    if let Some(min) = s.min_properties.and_then(Value::as_u64) {
        if (obj.len() as u64) < min {
            return Err(say(q, || {
                format!("expect object to have at least {min} properties")
            }));
        }
    }
    if let Some(max) = s.max_properties.and_then(Value::as_u64) {
        if (obj.len() as u64) > max {
            return Err(say(q, || {
                format!("expect object to have at most {max} properties")
            }));
        }
    }
    let props = s.properties.and_then(Value::as_object);
    let pattern_props = s.pattern_properties.and_then(Value::as_object);
    for (name, value) in obj {
        let mut known = false;
        if let Some(p) = props.and_then(|p| p.get(name)) {
            known = true;
            check(p, value, q)
                .map_err(|e| say(q, || format!("property {name:?} validation failed: {e}")))?;
        }
        for (pat, p) in pattern_props.into_iter().flatten() {
            if matches(pat, name)? {
                known = true;
                check(p, value, q)
                    .map_err(|e| say(q, || format!("property {name:?} validation failed: {e}")))?;
            }
        }
        if !known {
            match s.additional_properties {
                Some(Value::Bool(false)) => {
                    return Err(say(q, || {
                        format!("additional properties forbidden, found {name}")
                    }))
                }
                Some(extra @ Value::Object(_)) => check(extra, value, q)
                    .map_err(|e| say(q, || format!("property {name:?} validation failed: {e}")))?,
                _ => {}
            }
        }
    }
    if let Some(Value::Object(deps)) = s.dependencies {
        for (name, dep) in deps {
            if !obj.contains_key(name) {
                continue;
            }
            match dep {
                Value::Array(req) => {
                    for r in req.iter().filter_map(Value::as_str) {
                        if !obj.contains_key(r) {
                            return Err(say(q, || {
                                format!("property {r:?} is required when {name:?} is set")
                            }));
                        }
                    }
                }
                schema => check(schema, &Value::Object(obj.clone()), q).map_err(|e| {
                    say(q, || {
                        format!("failed to validate dependent schema for {name:?}: {e}")
                    })
                })?,
            }
        }
    }
    Ok(())
}

fn combinators(s: &Kw, v: &Value, q: bool) -> Result<(), String> {
    if let Some(Value::Array(all)) = s.all_of {
        for sub in all {
            check(sub, v, q)?;
        }
    }
    if let Some(Value::Array(any)) = s.any_of {
        if !any.iter().any(|sub| check(sub, v, true).is_ok()) {
            if q {
                return Err(String::new());
            }
            let only_required = any.iter().all(|a| {
                a.as_object()
                    .is_some_and(|o| o.len() == 1 && o.contains_key("required"))
            });
            return Err(if only_required {
                let sets: Vec<String> = any.iter().map(|a| a["required"].to_string()).collect();
                format!("object matches none of the required: {}", sets.join(" or "))
            } else {
                // The last branch's own message, checked again now that it is shown.
                let last = any
                    .last()
                    .and_then(|sub| check(sub, v, false).err())
                    .unwrap_or_default();
                format!("value should match at least one schema, but matches none: {last}")
            });
        }
    }
    if let Some(Value::Array(one)) = s.one_of {
        let matched: Vec<usize> = one
            .iter()
            .enumerate()
            .filter(|(_, sub)| check(sub, v, true).is_ok())
            .map(|(i, _)| i + 1)
            // Two matches already fail, and name the schemas the message shows.
            .take(2)
            .collect();
        match matched.as_slice() {
            [_] => {}
            [] => return Err("value should match only one schema, but matches none".into()),
            [a, b, ..] => {
                return Err(say(q, || {
                    format!(
                        "value should match only one schema, but matches both schemas {a} and {b}"
                    )
                }))
            }
        }
    }
    if let Some(not) = s.not {
        if check(not, v, true).is_ok() {
            return Err(say(q, || {
                format!("value wasn't supposed to match schema {not}")
            }));
        }
    }
    if let Some(cond) = s.if_ {
        let branch = if check(cond, v, true).is_ok() {
            s.then
        } else {
            s.else_
        };
        if let Some(b) = branch {
            check(b, v, q)?;
        }
    }
    Ok(())
}
