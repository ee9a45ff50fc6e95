//! The lua-resty-expr (v1) rule language used by route `vars` and by plugins.
//!
//! Owns compiling a JSON rule into an [`Expr`] tree (variables parsed to [`Var`], regexes and
//! IP sets compiled once) and evaluating it against a [`MatchRequest`]. Grammar, checked
//! against `lib/resty/expr/v1.lua`:
//! - a rule is an array; `[]` is always true;
//! - `[[..], [..]]` is the AND of its elements; `["AND"|"OR"|"!AND"|"!OR", e1, e2, ..]` is a
//!   logical node (at least two operands) and may nest;
//! - an expression is `[var, op, value]`, `[var, "!", op, value]` (negated) or the legacy
//!   `[var, value]` (meaning `==`); operators are case-insensitive.
//!
//! Operator semantics follow Lua: `==`/`~=` compare numerically when the right side is a JSON
//! number and as strings when it is a string; a `null` right side tests absence. `>`, `>=`,
//! `<`, `<=` are numeric and false when either side is not a number. `~~`/`~*` are unanchored
//! regex searches (Rust `regex` syntax, so PCRE-only features such as look-around are a build
//! error). `in` tests membership in a JSON array of strings; `has` asks
//! [`MatchRequest::var_has`]; `ipmatch` takes an IP/CIDR or an array of them.
//! It deliberately does not implement APISIX's `post_arg_*`/GraphQL variables: those are the
//! caller's [`MatchRequest::var`] business.

use crate::addr::IpSet;
use crate::{MatchRequest, Var};
use regex::{Regex, RegexBuilder};
use serde_json::Value;
use std::net::IpAddr;

/// A compiled rule; evaluating it allocates nothing beyond what `MatchRequest::var` returns.
#[derive(Debug, Clone)]
pub struct Expr {
    root: Option<Node>,
}

#[derive(Debug, Clone)]
enum Node {
    Logic {
        any: bool,
        negate: bool,
        children: Box<[Node]>,
    },
    Cmp {
        var: Var,
        op: Op,
        negate: bool,
    },
}

#[derive(Debug, Clone)]
enum Rhs {
    Str(Box<str>),
    Num(f64),
    Null,
    /// A boolean, array or object: Lua never finds it equal to a string.
    Other,
}

#[derive(Debug, Clone, Copy)]
enum Ord {
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(Rhs),
    Ne(Rhs),
    /// `None` right side: not a number, always false.
    Num(Ord, Option<f64>),
    Regex(Regex),
    In(Box<[Box<str>]>),
    Has(Option<Box<str>>),
    IpMatch(IpSet),
}

const LOGIC_OPS: [&str; 4] = ["AND", "OR", "!AND", "!OR"];
const CMP_OPS: [&str; 11] = [
    "==", "~=", ">", ">=", "<", "<=", "~~", "~*", "in", "has", "ipmatch",
];

impl Expr {
    /// Compiles a rule; the error text follows lua-resty-expr's where it has one.
    pub fn compile(rule: &Value) -> Result<Expr, String> {
        let Value::Array(items) = rule else {
            return Err("rule should be an array".into());
        };
        let Some(first) = items.first() else {
            return Ok(Expr { root: None });
        };
        if let Value::String(s) = first {
            if !is_logic_op(s) {
                return Err("rule should be wrapped inside brackets".into());
            }
        }
        Ok(Expr {
            root: Some(compile_node(items)?),
        })
    }

    /// True when the rule holds for `req` (an empty rule always holds).
    #[inline]
    pub fn eval<R: MatchRequest>(&self, req: &R) -> bool {
        match &self.root {
            None => true,
            Some(n) => eval_node(n, req),
        }
    }
}

fn is_logic_op(s: &str) -> bool {
    LOGIC_OPS.iter().any(|op| op.eq_ignore_ascii_case(s))
}

fn compile_node(items: &[Value]) -> Result<Node, String> {
    let Some(first) = items.first() else {
        return Err("rule too short".into());
    };
    match first {
        Value::Array(_) => {
            let children = items
                .iter()
                .map(|v| match v {
                    Value::Array(a) => compile_node(a),
                    other => Err(format!("invalid expression: {other}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Node::Logic {
                any: false,
                negate: false,
                children: children.into_boxed_slice(),
            })
        }
        Value::String(s) if is_logic_op(s) => {
            if items.len() <= 2 {
                return Err("rule too short".into());
            }
            let upper = s.to_ascii_uppercase();
            let children = items[1..]
                .iter()
                .map(|v| match v {
                    Value::Array(a) => compile_node(a),
                    other => Err(format!("invalid expression: {other}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Node::Logic {
                any: upper.ends_with("OR"),
                negate: upper.starts_with('!'),
                children: children.into_boxed_slice(),
            })
        }
        _ => compile_cmp(items),
    }
}

fn compile_cmp(items: &[Value]) -> Result<Node, String> {
    let (negate, l, op, r) = match items {
        [l, not, op, r] => {
            if not.as_str() != Some("!") {
                return Err("bad 'not' expression".into());
            }
            (true, l, Some(op), Some(r))
        }
        [l, op, r] => (false, l, Some(op), Some(r)),
        [l, op] => (false, l, Some(op), None),
        [l] => (false, l, None, None),
        _ => {
            return Err(format!(
                "invalid expression: {}",
                Value::from(items.to_vec())
            ))
        }
    };
    let Some(var) = l.as_str() else {
        return Err(format!(
            "invalid expression: variable name must be a string, got {l}"
        ));
    };
    let op_name = op.and_then(Value::as_str).map(str::to_ascii_lowercase);
    let known = op_name.as_deref().is_some_and(|o| CMP_OPS.contains(&o));
    // Legacy two-element form `[var, value]` means `==`.
    let (op_name, r) = match (r, known) {
        (None, false) => match op {
            Some(v) => ("==".to_owned(), v),
            None => return Err("invalid expression".into()),
        },
        (None, true) => (op_name.unwrap_or_default(), &Value::Null),
        (Some(r), _) => match op_name {
            Some(o) => (o, r),
            None => return Err("invalid expression: operator must be a string".into()),
        },
    };
    let op = compile_op(&op_name, r)?;
    Ok(Node::Cmp {
        var: Var::parse(var),
        op,
        negate,
    })
}

fn rhs(v: &Value) -> Rhs {
    match v {
        Value::String(s) => Rhs::Str(s.as_str().into()),
        Value::Number(n) => n.as_f64().map_or(Rhs::Other, Rhs::Num),
        Value::Null => Rhs::Null,
        _ => Rhs::Other,
    }
}

fn rhs_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => lua_tonumber(s),
        _ => None,
    }
}

fn compile_op(op: &str, r: &Value) -> Result<Op, String> {
    Ok(match op {
        "==" => Op::Eq(rhs(r)),
        "~=" => Op::Ne(rhs(r)),
        ">" => Op::Num(Ord::Gt, rhs_number(r)),
        ">=" => Op::Num(Ord::Ge, rhs_number(r)),
        "<" => Op::Num(Ord::Lt, rhs_number(r)),
        "<=" => Op::Num(Ord::Le, rhs_number(r)),
        "~~" | "~*" => {
            let Some(src) = r.as_str() else {
                return Err(format!("operator '{op}' needs a regex string, got {r}"));
            };
            let re = RegexBuilder::new(src)
                .case_insensitive(op == "~*")
                .build()
                .map_err(|e| format!("invalid regex {src:?}: {e}"))?;
            Op::Regex(re)
        }
        "in" => {
            let Value::Array(items) = r else {
                return Err(format!("operator 'in' needs an array, got {r}"));
            };
            // Lua compares a string var only with string elements.
            Op::In(
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(Into::into))
                    .collect(),
            )
        }
        "has" => Op::Has(r.as_str().map(Into::into)),
        "ipmatch" => {
            let set = match r {
                Value::String(s) => IpSet::parse([s.as_str()]),
                Value::Array(items) => {
                    let strs = items
                        .iter()
                        .map(|v| {
                            v.as_str()
                                .ok_or_else(|| format!("invalid ipmatch item {v}"))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    IpSet::parse(strs)
                }
                other => Err(format!("operator 'ipmatch' needs IPs/CIDRs, got {other}")),
            }?;
            Op::IpMatch(set)
        }
        other => return Err(format!("invalid operator '{other}'")),
    })
}

/// Lua's `tonumber` on a string: decimal (with fraction/exponent) or `0x` hex, surrounding
/// whitespace allowed; `inf`/`nan` words are not numbers.
pub(crate) fn lua_tonumber(s: &str) -> Option<f64> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()? as f64
    } else {
        let ok = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
            && body
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_digit() || b == b'.');
        if !ok {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn eval_node<R: MatchRequest>(node: &Node, req: &R) -> bool {
    match node {
        Node::Logic {
            any,
            negate,
            children,
        } => {
            let r = if *any {
                children.iter().any(|c| eval_node(c, req))
            } else {
                children.iter().all(|c| eval_node(c, req))
            };
            r != *negate
        }
        Node::Cmp { var, op, negate } => eval_cmp(var, op, req) != *negate,
    }
}

fn eval_cmp<R: MatchRequest>(var: &Var, op: &Op, req: &R) -> bool {
    if let Op::Has(item) = op {
        return item.as_deref().is_some_and(|i| req.var_has(var, i));
    }
    let value = req.var(var);
    let l = value.as_deref();
    match op {
        Op::Eq(r) => lua_eq(l, r),
        Op::Ne(r) => match r {
            // Lua: a non-numeric left side is "not equal" to a number.
            Rhs::Num(n) => l.and_then(lua_tonumber).is_none_or(|x| x != *n),
            _ => !lua_eq(l, r),
        },
        Op::Num(ord, r) => {
            let (Some(x), Some(y)) = (l.and_then(lua_tonumber), *r) else {
                return false;
            };
            match ord {
                Ord::Gt => x > y,
                Ord::Ge => x >= y,
                Ord::Lt => x < y,
                Ord::Le => x <= y,
            }
        }
        Op::Regex(re) => l.is_some_and(|s| re.is_match(s)),
        Op::In(items) => l.is_some_and(|s| items.iter().any(|i| &**i == s)),
        Op::IpMatch(set) => l
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
            .is_some_and(|ip| set.contains(ip)),
        Op::Has(_) => false,
    }
}

fn lua_eq(l: Option<&str>, r: &Rhs) -> bool {
    match r {
        Rhs::Str(s) => l == Some(&**s),
        Rhs::Num(n) => l.and_then(lua_tonumber).is_some_and(|x| x == *n),
        Rhs::Null => l.is_none(),
        Rhs::Other => false,
    }
}

#[cfg(test)]
mod tests;
