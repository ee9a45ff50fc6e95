//! Java types and the JSON <-> Hessian mapping the HTTP side needs.
//!
//! JSON -> Hessian is driven by the declared Java type of each parameter (a JSON number sent as `long` must be
//! a Hessian long, `"10"` declared `long` is coerced, a POJO class name makes a map of that class). Hessian ->
//! JSON drops Java class names: objects and typed maps become JSON objects, lists and arrays JSON arrays,
//! `byte[]` base64 (standard alphabet, padded), `java.util.Date` epoch milliseconds (a number),
//! `BigDecimal`/`BigInteger` their decimal text, and integers beyond ±(2^53 - 1) strings, since JavaScript clients
//! cannot hold them as numbers. A non-finite double and a cyclic back-reference become `null`.

use base64::Engine;
use serde_json::{Map as JsonMap, Number, Value as Json};

use crate::hessian::{ClassDef, Value};

/// A Java primitive (or, boxed, its wrapper class).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    Boolean,
    Byte,
    Short,
    Int,
    Long,
    Float,
    Double,
    Char,
}

impl Primitive {
    fn name(self) -> &'static str {
        match self {
            Primitive::Boolean => "boolean",
            Primitive::Byte => "byte",
            Primitive::Short => "short",
            Primitive::Int => "int",
            Primitive::Long => "long",
            Primitive::Float => "float",
            Primitive::Double => "double",
            Primitive::Char => "char",
        }
    }

    fn boxed(self) -> &'static str {
        match self {
            Primitive::Boolean => "java.lang.Boolean",
            Primitive::Byte => "java.lang.Byte",
            Primitive::Short => "java.lang.Short",
            Primitive::Int => "java.lang.Integer",
            Primitive::Long => "java.lang.Long",
            Primitive::Float => "java.lang.Float",
            Primitive::Double => "java.lang.Double",
            Primitive::Char => "java.lang.Character",
        }
    }

    fn descriptor(self) -> char {
        match self {
            Primitive::Boolean => 'Z',
            Primitive::Byte => 'B',
            Primitive::Short => 'S',
            Primitive::Int => 'I',
            Primitive::Long => 'J',
            Primitive::Float => 'F',
            Primitive::Double => 'D',
            Primitive::Char => 'C',
        }
    }

    fn from_descriptor(c: u8) -> Option<Primitive> {
        Some(match c {
            b'Z' => Primitive::Boolean,
            b'B' => Primitive::Byte,
            b'S' => Primitive::Short,
            b'I' => Primitive::Int,
            b'J' => Primitive::Long,
            b'F' => Primitive::Float,
            b'D' => Primitive::Double,
            b'C' => Primitive::Char,
            _ => return None,
        })
    }

    const ALL: [Primitive; 8] = [
        Primitive::Boolean,
        Primitive::Byte,
        Primitive::Short,
        Primitive::Int,
        Primitive::Long,
        Primitive::Float,
        Primitive::Double,
        Primitive::Char,
    ];
}

/// A declared Java parameter type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JavaType {
    /// `int`, `long`, ...: `null` is refused.
    Primitive(Primitive),
    /// `java.lang.Integer`, ...: `null` allowed.
    Boxed(Primitive),
    String,
    /// `java.lang.Object`: the Hessian type is inferred from the JSON value.
    Object,
    /// `java.util.Map` and its classes; the name is kept (a `HashMap`/`Map` goes untyped, like Java writes it).
    Map(String),
    /// `java.util.List`, `Collection`, `Set` and their classes.
    List(String),
    Date,
    BigDecimal,
    BigInteger,
    Array(Box<JavaType>),
    /// Any other class: a POJO, sent as a map of that class (or untyped for a generic call).
    Pojo(String),
}

/// A Java type name, JVM descriptor or JSON value that does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError(msg.into()))
}

impl JavaType {
    /// Parses a type as users write it: a Java name (`int`, `java.lang.Long`, `com.x.User`), an array
    /// (`int[]`, `java.lang.String[]`, or `Class.getName()`'s `[I`, `[Ljava.lang.String;`), a JVM descriptor
    /// (`Ljava/lang/String;`), or a short alias: `string`, `integer`, `bool`, `object`, `map`, `list`, `date`.
    pub fn parse(name: &str) -> Result<JavaType, ConvertError> {
        let name = name.trim();
        if name.is_empty() {
            return err("empty Java type name");
        }
        if let Some(elem) = name.strip_suffix("[]") {
            return Ok(JavaType::Array(Box::new(JavaType::parse(elem)?)));
        }
        if name.starts_with('[') || (name.starts_with('L') && name.ends_with(';')) {
            let mut types = parse_descriptors(&name.replace('.', "/"))?;
            if types.len() == 1 {
                return Ok(types.remove(0));
            }
            return err(format!("bad Java type {name:?}"));
        }
        if name
            .chars()
            .any(|c| c.is_whitespace() || c == '/' || c == ';' || c == '[' || c == ']')
        {
            return err(format!("bad Java type {name:?}"));
        }
        for p in Primitive::ALL {
            if name == p.name() {
                return Ok(JavaType::Primitive(p));
            }
            if name == p.boxed() {
                return Ok(JavaType::Boxed(p));
            }
        }
        Ok(match name {
            "java.lang.String" | "string" | "String" => JavaType::String,
            "java.lang.Object" | "object" | "Object" => JavaType::Object,
            "integer" | "Integer" => JavaType::Boxed(Primitive::Int),
            "Long" => JavaType::Boxed(Primitive::Long),
            "bool" | "Boolean" => JavaType::Boxed(Primitive::Boolean),
            "Double" => JavaType::Boxed(Primitive::Double),
            "map" | "java.util.Map" => JavaType::Map("java.util.Map".into()),
            "list" | "java.util.List" => JavaType::List("java.util.List".into()),
            "date" | "java.util.Date" => JavaType::Date,
            "java.math.BigDecimal" => JavaType::BigDecimal,
            "java.math.BigInteger" => JavaType::BigInteger,
            "java.util.HashMap"
            | "java.util.LinkedHashMap"
            | "java.util.TreeMap"
            | "java.util.AbstractMap"
            | "java.util.concurrent.ConcurrentHashMap" => JavaType::Map(name.into()),
            "java.util.ArrayList"
            | "java.util.LinkedList"
            | "java.util.Collection"
            | "java.util.Set"
            | "java.util.HashSet"
            | "java.util.LinkedHashSet"
            | "java.util.TreeSet" => JavaType::List(name.into()),
            _ => JavaType::Pojo(name.into()),
        })
    }

    /// The name `Class.getName()` gives, what a generic `$invoke` lists as parameter types.
    pub fn java_name(&self) -> String {
        match self {
            JavaType::Array(_) => self.descriptor().replace('/', "."),
            _ => self.class_name().to_owned(),
        }
    }

    fn class_name(&self) -> &str {
        match self {
            JavaType::Primitive(p) => p.name(),
            JavaType::Boxed(p) => p.boxed(),
            JavaType::String => "java.lang.String",
            JavaType::Object => "java.lang.Object",
            JavaType::Map(n) | JavaType::List(n) | JavaType::Pojo(n) => n,
            JavaType::Date => "java.util.Date",
            JavaType::BigDecimal => "java.math.BigDecimal",
            JavaType::BigInteger => "java.math.BigInteger",
            JavaType::Array(_) => "java.lang.Object",
        }
    }

    /// The JVM descriptor (`I`, `Ljava/lang/String;`, `[J`), what a Dubbo request names its parameters with.
    pub fn descriptor(&self) -> String {
        match self {
            JavaType::Primitive(p) => p.descriptor().to_string(),
            JavaType::Array(e) => format!("[{}", e.descriptor()),
            _ => format!("L{};", self.class_name().replace('.', "/")),
        }
    }

    /// The Hessian type of an array of this element type (`[int`, `[string`, `[object`, `[com.x.User`).
    fn hessian_array_type(&self) -> String {
        match self {
            JavaType::Primitive(p) => format!("[{}", p.name()),
            JavaType::String => "[string".into(),
            JavaType::Object => "[object".into(),
            JavaType::Date => "[date".into(),
            JavaType::Array(e) => format!("[{}", e.hessian_array_type()),
            other => format!("[{}", other.class_name()),
        }
    }
}

/// The concatenated descriptors of a parameter list (`Ljava/lang/String;J`).
pub fn descriptors(types: &[JavaType]) -> String {
    types.iter().map(JavaType::descriptor).collect()
}

/// Splits a concatenated descriptor list (APISIX `http-dubbo`'s `params_type_desc`, a request body's parameter
/// types) into types.
pub fn parse_descriptors(desc: &str) -> Result<Vec<JavaType>, ConvertError> {
    let b = desc.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let mut dims = 0;
        while i < b.len() && b[i] == b'[' {
            dims += 1;
            i += 1;
        }
        if dims > 255 {
            return err("array descriptor with more than 255 dimensions");
        }
        let mut t = match b.get(i) {
            Some(b'L') => {
                let end = desc[i..]
                    .find(';')
                    .ok_or_else(|| ConvertError(format!("descriptor {desc:?}: missing ';'")))?;
                let name = desc[i + 1..i + end].replace('/', ".");
                if name.is_empty() {
                    return err(format!("descriptor {desc:?}: empty class name"));
                }
                i += end + 1;
                match JavaType::parse(&name)? {
                    JavaType::Primitive(_) => JavaType::Pojo(name),
                    t => t,
                }
            }
            Some(&c) => {
                i += 1;
                match Primitive::from_descriptor(c) {
                    Some(p) => JavaType::Primitive(p),
                    None => {
                        return err(format!("descriptor {desc:?}: unknown type {:?}", c as char))
                    }
                }
            }
            None => return err(format!("descriptor {desc:?}: ends after '['")),
        };
        for _ in 0..dims {
            t = JavaType::Array(Box::new(t));
        }
        out.push(t);
    }
    Ok(out)
}

/// How a POJO parameter goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pojo {
    /// A map typed with the class name: the provider's Hessian builds the object (direct calls).
    Typed,
    /// An untyped map: the provider's generic filter realises it (`$invoke`), a `"class"` key included.
    Untyped,
}

/// Converts a JSON value to the Hessian value for a parameter declared `ty`.
pub fn from_json(json: &Json, ty: &JavaType, pojo: Pojo) -> Result<Value, ConvertError> {
    from_json_at(json, ty, pojo, &mut String::new())
}

fn describe(json: &Json) -> String {
    let s = json.to_string();
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

fn from_json_at(
    json: &Json,
    ty: &JavaType,
    pojo: Pojo,
    path: &mut String,
) -> Result<Value, ConvertError> {
    let mismatch = |path: &str, what: &str| {
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" at {path}")
        };
        ConvertError(format!("expected {what}{at}, got {}", describe(json)))
    };
    if json.is_null() {
        return match ty {
            JavaType::Primitive(p) => Err(mismatch(path, p.name())),
            _ => Ok(Value::Null),
        };
    }
    Ok(match ty {
        JavaType::Primitive(p) | JavaType::Boxed(p) => match p {
            Primitive::Boolean => match json {
                Json::Bool(b) => Value::Bool(*b),
                Json::String(s) if s == "true" || s == "false" => Value::Bool(s == "true"),
                _ => return Err(mismatch(path, "boolean")),
            },
            Primitive::Byte | Primitive::Short | Primitive::Int => {
                let (lo, hi) = match p {
                    Primitive::Byte => (i8::MIN as i64, i8::MAX as i64),
                    Primitive::Short => (i16::MIN as i64, i16::MAX as i64),
                    _ => (i32::MIN as i64, i32::MAX as i64),
                };
                match integer(json) {
                    Some(v) if (lo..=hi).contains(&v) => Value::Int(v as i32),
                    _ => return Err(mismatch(path, p.name())),
                }
            }
            Primitive::Long => Value::Long(integer(json).ok_or_else(|| mismatch(path, "long"))?),
            Primitive::Float | Primitive::Double => {
                let v = match json {
                    Json::Number(n) => n.as_f64(),
                    Json::String(s) => s.trim().parse::<f64>().ok().filter(|v| v.is_finite()),
                    _ => None,
                };
                Value::Double(v.ok_or_else(|| mismatch(path, p.name()))?)
            }
            Primitive::Char => match json {
                Json::String(s) if s.encode_utf16().count() == 1 => Value::String(s.clone()),
                _ => return Err(mismatch(path, "char (a one-character string)")),
            },
        },
        JavaType::String => match json {
            Json::String(s) => Value::String(s.clone()),
            Json::Number(n) => Value::String(n.to_string()),
            Json::Bool(b) => Value::String(b.to_string()),
            _ => return Err(mismatch(path, "string")),
        },
        JavaType::Object => infer(json),
        JavaType::Map(class) => match json {
            Json::Object(o) => Value::Map {
                typ: if untyped_map(class) {
                    None
                } else {
                    Some(class.clone())
                },
                entries: o
                    .iter()
                    .map(|(k, v)| (Value::String(k.clone()), infer(v)))
                    .collect(),
            },
            _ => return Err(mismatch(path, "object")),
        },
        JavaType::List(class) => match json {
            Json::Array(a) => Value::List {
                typ: list_type(class),
                items: a.iter().map(infer).collect(),
            },
            _ => return Err(mismatch(path, "array")),
        },
        JavaType::Date => {
            Value::Date(integer(json).ok_or_else(|| mismatch(path, "date (epoch milliseconds)"))?)
        }
        JavaType::BigDecimal | JavaType::BigInteger => {
            let text = match json {
                Json::Number(n) => n.to_string(),
                Json::String(s) => s.trim().to_owned(),
                _ => return Err(mismatch(path, "number")),
            };
            let ok = if *ty == JavaType::BigInteger {
                text.strip_prefix('-')
                    .unwrap_or(&text)
                    .bytes()
                    .all(|c| c.is_ascii_digit())
                    && !text.is_empty()
            } else {
                text.parse::<f64>().is_ok() && !text.contains(['i', 'I', 'n', 'N'])
            };
            if !ok {
                return Err(mismatch(path, "number"));
            }
            Value::object(ty.class_name(), [("value", Value::String(text))])
        }
        JavaType::Array(elem) => {
            if **elem == JavaType::Primitive(Primitive::Byte) {
                return bytes(json)
                    .map(Value::Binary)
                    .ok_or_else(|| mismatch(path, "byte[] (base64 or numbers)"));
            }
            let Json::Array(a) = json else {
                return Err(mismatch(path, "array"));
            };
            let mut items = Vec::with_capacity(a.len());
            for (i, v) in a.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                items.push(from_json_at(v, elem, pojo, path)?);
                path.truncate(len);
            }
            Value::List {
                typ: Some(ty_array(elem)),
                items,
            }
        }
        JavaType::Pojo(class) => {
            let Json::Object(o) = json else {
                return Err(mismatch(path, class));
            };
            match pojo {
                Pojo::Untyped => {
                    Value::map(o.iter().map(|(k, v)| (Value::String(k.clone()), infer(v))))
                }
                Pojo::Typed => Value::Map {
                    typ: Some(
                        o.get("class")
                            .and_then(Json::as_str)
                            .unwrap_or(class)
                            .to_owned(),
                    ),
                    entries: o
                        .iter()
                        .filter(|(k, _)| *k != "class")
                        .map(|(k, v)| (Value::String(k.clone()), infer(v)))
                        .collect(),
                },
            }
        }
    })
}

fn ty_array(elem: &JavaType) -> String {
    elem.hessian_array_type()
}

fn untyped_map(class: &str) -> bool {
    matches!(
        class,
        "java.util.Map" | "java.util.HashMap" | "java.util.AbstractMap"
    )
}

fn list_type(class: &str) -> Option<String> {
    match class {
        "java.util.List" | "java.util.ArrayList" | "java.util.Collection" => None,
        "java.util.Set" => Some("java.util.HashSet".into()),
        c => Some(c.to_owned()),
    }
}

fn integer(json: &Json) -> Option<i64> {
    match json {
        Json::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                .map(|f| f as i64)
        }),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn bytes(json: &Json) -> Option<Vec<u8>> {
    match json {
        Json::String(s) => base64::engine::general_purpose::STANDARD.decode(s).ok(),
        Json::Array(a) => a
            .iter()
            .map(|v| {
                v.as_i64()
                    .filter(|b| (-128..=255).contains(b))
                    .map(|b| b as u8)
            })
            .collect(),
        _ => None,
    }
}

/// The Hessian value for a JSON value of undeclared type (`java.lang.Object`, map values, list items): integers
/// as int when they fit, else long, other numbers double; arrays untyped lists, objects untyped maps.
pub fn infer(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(v) => match i32::try_from(v) {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Long(v),
            },
            None => Value::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(s.clone()),
        Json::Array(a) => Value::list(a.iter().map(infer)),
        Json::Object(o) => Value::map(o.iter().map(|(k, v)| (Value::String(k.clone()), infer(v)))),
    }
}

/// Largest integer a JSON (JavaScript) number holds exactly.
const MAX_SAFE: i64 = (1 << 53) - 1;

/// Converts a decoded Hessian value to JSON (see the module documentation for the choices).
pub fn to_json(v: &Value) -> Json {
    match v {
        Value::Null | Value::Ref(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Long(l) | Value::Date(l) => {
            if (-MAX_SAFE..=MAX_SAFE).contains(l) {
                Json::from(*l)
            } else {
                Json::String(l.to_string())
            }
        }
        Value::Double(d) => Number::from_f64(*d).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.clone()),
        Value::Binary(b) => Json::String(base64::engine::general_purpose::STANDARD.encode(b)),
        Value::List { items, .. } => Json::Array(items.iter().map(to_json).collect()),
        Value::Map { entries, .. } => {
            let mut m = JsonMap::with_capacity(entries.len());
            for (k, v) in entries {
                m.insert(key_text(k), to_json(v));
            }
            Json::Object(m)
        }
        Value::Object { class, fields } => {
            if let Some(text) = big_number(class, fields) {
                return Json::String(text.to_owned());
            }
            let mut m = JsonMap::with_capacity(fields.len());
            for (name, v) in class.fields.iter().zip(fields) {
                m.insert(name.clone(), to_json(v));
            }
            Json::Object(m)
        }
    }
}

fn big_number<'a>(class: &ClassDef, fields: &'a [Value]) -> Option<&'a str> {
    if class.name != "java.math.BigDecimal" && class.name != "java.math.BigInteger" {
        return None;
    }
    let i = class.fields.iter().position(|f| f == "value")?;
    fields.get(i)?.as_str()
}

fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        other => match to_json(other) {
            Json::String(s) => s,
            j => j.to_string(),
        },
    }
}
