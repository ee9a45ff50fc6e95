use super::*;

#[test]
fn lua_forms_translate_to_jinja() {
    assert_eq!(
        translate(r#"{"foo":"{{name .. " world"}}","bar":{{age+10}}}"#),
        r#"{"foo":"{{name ~ " world"}}","bar":{{age+10}}}"#
    );
    assert_eq!(
        translate(r#"x{*_escape_json(a .. "..")*}y{% if a %}{# c #}"#),
        r#"x{{ (_escape_json(a ~ ".."))|safe }}y{% if a %}{# c #}"#
    );
    assert_eq!(translate("{ not a tag } {{ open"), "{ not a tag } {{ open");
}

#[test]
fn xml_decodes_like_the_tree_handler() {
    let v = decode_xml(
        br#"<?xml version="1.0"?><soap:Envelope xmlns:soap="urn:x"><soap:Body>
            <r a="1"><name>Jack</name><tag>x</tag><tag>y</tag><empty/></r></soap:Body></soap:Envelope>"#,
    )
    .unwrap();
    assert_eq!(
        v,
        json!({"Envelope": {"Body": {"r": {"_attr": {"a": "1"}, "name": "Jack", "tag": ["x", "y"], "empty": ""}}}})
    );
}

#[test]
fn xml_entities_are_never_expanded() {
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">
        <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
        <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]><lolz>&lol3;</lolz>"#;
    assert!(decode_xml(laughs.as_bytes()).is_err());
    let ext =
        r#"<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><r>&x;</r>"#;
    assert!(decode_xml(ext.as_bytes()).is_err());
}

#[test]
fn nesting_is_bounded() {
    let deep = format!("{}{}", "<a>".repeat(5000), "</a>".repeat(5000));
    assert!(decode_xml(deep.as_bytes()).is_err());
    let deep = "[".repeat(100_000);
    assert!(serde_json::from_str::<Value>(&deep).is_err());
}

#[test]
fn multipart_fields() {
    let body = "--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\none\r\n--XX\r\n\
                Content-Disposition: form-data; name=\"a\"\r\n\r\ntwo\r\n--XX\r\n\
                Content-Disposition: form-data; name=\"f\"; filename=\"f.txt\"\r\n\r\nfile body\r\n--XX--\r\n";
    let v = decode_multipart(body.as_bytes(), Some("multipart/form-data; boundary=XX")).unwrap();
    assert_eq!(v, json!({"a": ["one", "two"], "f": "file body"}));
    assert!(decode_multipart(b"junk", Some("multipart/form-data; boundary=XX")).is_err());
    assert!(decode_multipart(b"junk", Some("text/plain")).is_err());
}

#[test]
fn templates_see_only_what_they_are_given() {
    let side = |t: &str| compile_side("request", &json!({"template": t})).unwrap();
    for t in [
        r#"{% include "/etc/passwd" %}"#,
        r#"{% extends "/etc/passwd" %}"#,
        r#"{% import "/etc/passwd" as x %}"#,
    ] {
        let s = side(t);
        let rendered = s.plain.and_then(|n| {
            let t = s.env.get_template(n).map_err(|e| e.to_string())?;
            t.render(minijinja::context! {}).map_err(|e| e.to_string())
        });
        assert!(rendered.is_err(), "{t}: {rendered:?}");
    }
    let s = side("{{ env }}{{ HOME }}{{ self }}{{ config }}");
    let out = s
        .env
        .get_template("plain")
        .unwrap()
        .render(minijinja::context! {})
        .unwrap();
    assert!(!out.contains('/'), "{out}");
    // A runaway loop is stopped by the fuel bound.
    let s =
        side("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}");
    let r = s
        .env
        .get_template("plain")
        .unwrap()
        .render(minijinja::context! {});
    assert!(r.is_err());
}

#[test]
fn schema_errors() {
    assert!(check(&json!({})).is_err());
    assert!(check(&json!({"request": {}})).is_err());
    assert!(check(&json!({"request": {"template": "x", "input_format": "yaml"}})).is_err());
    assert!(check(&json!({"response": {"template": "x"}, "max_resp_body_size": 0})).is_err());
    assert!(check(&json!({"request": {"template": "x"}, "response": {"template": "{{"}})).is_ok());
}
