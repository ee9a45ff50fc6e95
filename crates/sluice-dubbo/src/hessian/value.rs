//! The Hessian 2 value model.

use std::sync::Arc;

/// A class definition (`C` on the wire): the Java class name and its field names, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClassDef {
    pub name: String,
    pub fields: Vec<String>,
}

impl ClassDef {
    pub fn new(
        name: impl Into<String>,
        fields: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        ClassDef {
            name: name.into(),
            fields: fields.into_iter().map(Into::into).collect(),
        }
    }
}

/// One Hessian 2 value.
///
/// The decoder resolves references (`Q`) by decoding the referenced container again, so a decoded tree holds no
/// shared nodes; a reference to a container that is still being decoded (a cycle, such as a Java exception whose
/// `cause` is itself) becomes [`Value::Ref`] with the container's reference number. The encoder writes `Ref` as
/// `Q`; it never creates references on its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    /// `java.util.Date`: milliseconds since the Unix epoch, UTC.
    Date(i64),
    String(String),
    Binary(Vec<u8>),
    /// A list; `typ` is the Hessian type (`[string`, `java.util.HashSet`, ...) or `None` for an untyped list.
    List {
        typ: Option<String>,
        items: Vec<Value>,
    },
    /// A map in wire order; `typ` is the Java class (a POJO sent as a typed map) or `None` (`H`, a HashMap).
    Map {
        typ: Option<String>,
        entries: Vec<(Value, Value)>,
    },
    /// An object instance: one value per field of its class definition.
    Object {
        class: Arc<ClassDef>,
        fields: Vec<Value>,
    },
    /// A back-reference to an enclosing container (see above).
    Ref(u32),
}

impl Value {
    /// A string value.
    pub fn string(s: impl Into<String>) -> Value {
        Value::String(s.into())
    }

    /// An untyped map (Java `HashMap`).
    pub fn map(entries: impl IntoIterator<Item = (Value, Value)>) -> Value {
        Value::Map {
            typ: None,
            entries: entries.into_iter().collect(),
        }
    }

    /// An untyped map with string keys.
    pub fn string_map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::String(k.into()), v)),
        )
    }

    /// An untyped list (Java `ArrayList`).
    pub fn list(items: impl IntoIterator<Item = Value>) -> Value {
        Value::List {
            typ: None,
            items: items.into_iter().collect(),
        }
    }

    /// An object of a class built from its name and `(field, value)` pairs.
    pub fn object<F: Into<String>>(
        class: impl Into<String>,
        fields: impl IntoIterator<Item = (F, Value)>,
    ) -> Value {
        let (names, values): (Vec<String>, Vec<Value>) =
            fields.into_iter().map(|(f, v)| (f.into(), v)).unzip();
        Value::Object {
            class: Arc::new(ClassDef {
                name: class.into(),
                fields: names,
            }),
            fields: values,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The class name of a typed map or an object.
    pub fn class_name(&self) -> Option<&str> {
        match self {
            Value::Map { typ: Some(t), .. } => Some(t),
            Value::Object { class, .. } => Some(&class.name),
            _ => None,
        }
    }

    /// Looks a field up by name: a map entry with that string key or an object's field.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map { entries, .. } => entries
                .iter()
                .rev() // a repeated key: the last one wins, as in a Java HashMap
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            Value::Object { class, fields } => class
                .fields
                .iter()
                .position(|f| f == key)
                .and_then(|i| fields.get(i)),
            _ => None,
        }
    }

    /// For a Java `Throwable` (what `RESPONSE_WITH_EXCEPTION` carries): its class and `detailMessage`.
    pub fn exception_message(&self) -> Option<(&str, Option<&str>)> {
        let class = self.class_name()?;
        Some((class, self.get("detailMessage").and_then(Value::as_str)))
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Long(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Double(v)
    }
}
