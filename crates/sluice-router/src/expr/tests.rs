//! lua-resty-expr semantics: every operator, negation, logical forms and compile errors.

use super::{lua_tonumber, Expr};
use crate::tests::{req, Req};
use serde_json::{json, Value};

fn eval(rule: Value, r: &Req) -> bool {
    Expr::compile(&rule).unwrap().eval(r)
}

fn err(rule: Value) -> String {
    Expr::compile(&rule).unwrap_err()
}

#[test]
fn eq_and_ne_strings_numbers_null() {
    let r = req("/").var("arg_name", "json").var("arg_n", "10");
    assert!(eval(json!([["arg_name", "==", "json"]]), &r));
    assert!(!eval(json!([["arg_name", "==", "xml"]]), &r));
    assert!(eval(json!([["arg_n", "==", 10]]), &r));
    assert!(eval(json!([["arg_n", "==", 10.0]]), &r));
    assert!(!eval(json!([["arg_name", "==", 10]]), &r));
    assert!(eval(json!([["arg_missing", "==", null]]), &r));
    assert!(!eval(json!([["arg_name", "==", null]]), &r));
    assert!(!eval(json!([["arg_name", "==", true]]), &r));

    assert!(eval(json!([["arg_name", "~=", "xml"]]), &r));
    assert!(!eval(json!([["arg_name", "~=", "json"]]), &r));
    assert!(eval(json!([["arg_missing", "~=", "json"]]), &r));
    assert!(!eval(json!([["arg_n", "~=", 10]]), &r));
    assert!(
        eval(json!([["arg_name", "~=", 10]]), &r),
        "non-number is not equal"
    );
    assert!(eval(json!([["arg_name", "~=", null]]), &r));
}

#[test]
fn numeric_comparisons() {
    let r = req("/").var("arg_age", "24").var("arg_s", "abc");
    assert!(eval(json!([["arg_age", ">", 20]]), &r));
    assert!(!eval(json!([["arg_age", ">", 24]]), &r));
    assert!(eval(json!([["arg_age", ">=", 24]]), &r));
    assert!(
        eval(json!([["arg_age", "<", "30"]]), &r),
        "numeric string rhs"
    );
    assert!(!eval(json!([["arg_age", "<", 24]]), &r));
    assert!(eval(json!([["arg_age", "<=", 24]]), &r));
    assert!(
        !eval(json!([["arg_s", ">", 1]]), &r),
        "non-numeric lhs is false"
    );
    assert!(!eval(json!([["arg_s", "<", 1]]), &r));
    assert!(!eval(json!([["arg_missing", "<", 1]]), &r));
    assert!(
        !eval(json!([["arg_age", ">", "x"]]), &r),
        "non-numeric rhs is false"
    );
}

#[test]
fn regex_operators() {
    let r = req("/").var("http_x_a", "Alpha-1");
    assert!(eval(json!([["http_x_a", "~~", "^A.*"]]), &r));
    assert!(
        eval(json!([["http_x_a", "~~", "pha"]]), &r),
        "unanchored search"
    );
    assert!(!eval(json!([["http_x_a", "~~", "^a.*"]]), &r));
    assert!(eval(json!([["http_x_a", "~*", "^a.*"]]), &r));
    assert!(!eval(json!([["http_x_a", "~*", "^b"]]), &r));
    assert!(!eval(json!([["arg_missing", "~~", ".*"]]), &r));
}

#[test]
fn in_has_ipmatch() {
    let r = req("/")
        .var("arg_name", "b")
        .var("graphql_root_fields", "repo")
        .var("graphql_root_fields", "owner")
        .addr("192.168.3.4");
    assert!(eval(json!([["arg_name", "in", ["a", "b"]]]), &r));
    assert!(!eval(json!([["arg_name", "in", ["a", "c"]]]), &r));
    assert!(!eval(json!([["arg_missing", "in", ["a"]]]), &r));
    assert!(eval(json!([["graphql_root_fields", "has", "owner"]]), &r));
    assert!(!eval(json!([["graphql_root_fields", "has", "user"]]), &r));
    assert!(eval(
        json!([["remote_addr", "ipmatch", ["127.0.0.1", "192.168.0.0/16"]]]),
        &r
    ));
    assert!(eval(json!([["remote_addr", "ipmatch", "192.168.3.4"]]), &r));
    assert!(!eval(
        json!([["remote_addr", "ipmatch", ["10.0.0.0/8", "::1"]]]),
        &r
    ));
    let v6 = req("/").addr("2001:db8::9");
    assert!(eval(
        json!([["remote_addr", "ipmatch", ["2001:db8::/64"]]]),
        &v6
    ));
    assert!(
        eval(json!([["arg_name", "IN", ["b"]]]), &r),
        "operators are case-insensitive"
    );
}

#[test]
fn not_prefix_negates() {
    let r = req("/").var("arg_weight", "12");
    assert!(eval(
        json!([["arg_weight", ">", 10], ["arg_weight", "!", ">", 15]]),
        &r
    ));
    assert!(!eval(json!([["arg_weight", "!", ">", 10]]), &r));
    assert!(eval(json!([["arg_weight", "!", "~~", "^[a-z]+$"]]), &r));
    assert_eq!(
        err(json!([["arg_weight", "?", ">", 10]])),
        "bad 'not' expression"
    );
}

#[test]
fn top_level_list_is_and() {
    let r = req("/").var("arg_a", "1").var("arg_b", "2");
    assert!(eval(
        json!([["arg_a", "==", "1"], ["arg_b", "==", "2"]]),
        &r
    ));
    assert!(!eval(
        json!([["arg_a", "==", "1"], ["arg_b", "==", "3"]]),
        &r
    ));
    assert!(eval(json!([]), &r), "empty rule is true");
}

#[test]
fn logical_and_or_and_negated_forms_nest() {
    let r = req("/").var("arg_name", "json").var("arg_weight", "5");
    let rule = json!([
        "AND",
        ["arg_name", "==", "json"],
        ["OR", ["arg_weight", ">", 10], ["arg_height", "!", ">", 15]]
    ]);
    assert!(eval(rule.clone(), &r));
    let mut neg = rule;
    neg[0] = json!("!AND");
    assert!(!eval(neg, &r));
    assert!(eval(
        json!(["OR", ["arg_name", "==", "x"], ["arg_weight", "==", 5]]),
        &r
    ));
    assert!(!eval(
        json!(["!OR", ["arg_name", "==", "x"], ["arg_weight", "==", 5]]),
        &r
    ));
    assert!(eval(
        json!(["or", ["arg_name", "==", "x"], ["arg_name", "==", "json"]]),
        &r
    ));
    assert!(!eval(
        json!(["AND", ["arg_name", "==", "x"], ["arg_weight", "==", 5]]),
        &r
    ));
    assert!(eval(
        json!([["OR", ["arg_name", "==", "x"], ["arg_weight", "==", 5]]]),
        &r
    ));
}

#[test]
fn legacy_two_element_form_means_equal() {
    let r = req("/").var("arg_name", "json");
    assert!(eval(json!([["arg_name", "json"]]), &r));
    assert!(!eval(json!([["arg_name", "xml"]]), &r));
}

#[test]
fn compile_errors() {
    assert_eq!(err(json!({"a": 1})), "rule should be an array");
    assert_eq!(
        err(json!(["arg_a", "==", "1"])),
        "rule should be wrapped inside brackets"
    );
    assert_eq!(err(json!(["AND", ["arg_a", "==", "1"]])), "rule too short");
    assert_eq!(err(json!([[]])), "rule too short");
    assert_eq!(
        err(json!([["arg_a", "=~", "1", "2"]])),
        "bad 'not' expression"
    );
    assert_eq!(
        err(json!([["arg_a", "like", "x"]])),
        "invalid operator 'like'"
    );
    assert_eq!(err(json!([["arg_a"]])), "invalid expression");
    assert!(err(json!([["arg_a", "~~", "("]])).contains("invalid regex"));
    assert!(err(json!([["arg_a", "~~", "(?=x)"]])).contains("invalid regex"));
    assert!(err(json!([["arg_a", "~~", 5]])).contains("regex string"));
    assert!(err(json!([["arg_a", "in", "a"]])).contains("needs an array"));
    assert!(err(json!([["remote_addr", "ipmatch", ["300.1.1.1"]]])).contains("invalid IP"));
    assert!(err(json!([[1, "==", "a"]])).contains("variable name"));
    assert!(err(json!([["arg_a", "==", "1"], "x"])).contains("invalid expression"));
}

#[test]
fn lua_tonumber_rules() {
    assert_eq!(lua_tonumber(" 12 "), Some(12.0));
    assert_eq!(lua_tonumber("-1.5e2"), Some(-150.0));
    assert_eq!(lua_tonumber("0x1F"), Some(31.0));
    assert_eq!(lua_tonumber(".5"), Some(0.5));
    assert_eq!(lua_tonumber("inf"), None);
    assert_eq!(lua_tonumber("nan"), None);
    assert_eq!(lua_tonumber("12abc"), None);
    assert_eq!(lua_tonumber(""), None);
}
