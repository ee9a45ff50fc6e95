use serde_json::json;

use super::*;

fn err(v: serde_json::Value) -> String {
    match compile_conf(&v) {
        Ok(_) => String::from("ok"),
        Err(e) => e,
    }
}

/// t/plugin/response-rewrite*.t: schema cases and their error texts.
#[test]
fn schema_errors() {
    assert_eq!(err(json!({"body": "test"})), "ok");
    assert_eq!(
        err(json!({"filters": [{"regex": "l", "replace": "m"}]})),
        "ok"
    );
    assert_eq!(err(json!({})), "ok");
    assert!(
        err(json!({"body": "t", "filters": [{"regex": "l", "replace": "m"}]}))
            .contains("dependent schema")
    );
    assert!(err(json!({"filters": []})).contains("expect array to have at least 1 items"));
    assert!(err(json!({"filters": [{"regex": "l"}]})).contains("property \"replace\" is required"));
    assert!(err(json!({"filters": [{"regex": "", "replace": "m"}]})).contains("string too short"));
    assert!(
        err(json!({"filters": [{"regex": "l", "replace": "m", "scope": ""}]}))
            .contains("matches none of the enum values")
    );
    assert_eq!(
        err(json!({"filters": [{"regex": "hello", "replace": "HELLO", "options": "h"}]})),
        "regex \"hello\" validation failed: unknown flag \"h\" (flags \"h\")"
    );
    assert!(err(json!({"filters": [{"regex": "(", "replace": "x"}]}))
        .starts_with("regex \"(\" validation failed: "));
    assert_eq!(
        err(json!({"body_base64": true, "body": "!!"})),
        "invalid base64 content"
    );
    assert_eq!(err(json!({"body_base64": true})), "invalid base64 content");
    assert!(err(json!({"status_code": 100})).contains("status_code"));
    assert!(err(json!({"status_code": 599})).contains("status_code"));
    assert!(
        err(json!({"vars": [["status", "nope", 1]]})).starts_with("failed to validate the 'vars'")
    );
    assert!(err(json!({"headers": {"add": ["no-colon"]}})).contains("validation failed"));
    assert_eq!(
        err(json!({"headers": {"X-A": true}})),
        "invalid type as header value"
    );
    assert_eq!(
        err(json!({"headers": {"set": {"X-A": 1}, "remove": ["X-B"]}})),
        "ok"
    );
}

#[test]
fn regex_options_map_to_flags() {
    let re = compile_regex("HELLO", "ijo").unwrap();
    assert!(re.is_match(b"say hello"));
    let re = compile_regex("b", "a").unwrap();
    assert!(!re.is_match(b"ab"));
    assert!(re.is_match(b"ba"));
}
