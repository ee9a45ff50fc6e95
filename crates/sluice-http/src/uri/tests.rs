use proptest::prelude::*;

use super::*;

/// Paths and nginx 1.22's `$uri` for them (or its 400), taken from a `return 200 "$uri"` server.
const NGINX: &[(&str, Option<&str>)] = &[
    ("/a//b", Some("/a/b")),
    ("/public/../admin", Some("/admin")),
    ("/%61dmin", Some("/admin")),
    ("//admin", Some("/admin")),
    ("/admin;x", Some("/admin;x")),
    ("/a/%2e%2e/b", Some("/b")),
    ("/a/%2E./b", Some("/b")),
    ("/a%2Fb", Some("/a/b")),
    ("/a%2F..%2Fb", Some("/b")),
    ("/a%00b", None),
    ("/..", None),
    ("/a/../..", None),
    ("/%2e%2e/a", None),
    ("/..%2F", None),
    ("/a%2", None),
    ("/a%zz", None),
    ("/a/b/..", Some("/a/")),
    ("/a/b/.", Some("/a/b/")),
    ("/a/./b", Some("/a/b")),
    ("/a%3Fb", Some("/a?b")),
    ("/a%23b", Some("/a#b")),
    ("/a%25b", Some("/a%b")),
    ("/a%2fb%2f%2f", Some("/a/b/")),
    ("/a/.%2e/b", Some("/b")),
    ("/a/..;/b", Some("/a/..;/b")),
    ("/a/b/...", Some("/a/b/...")),
    ("/a/.../b", Some("/a/.../b")),
    ("/a/..x/b", Some("/a/..x/b")),
    ("/a+b", Some("/a+b")),
    ("/a%2Bb", Some("/a+b")),
    ("/a/b%2F", Some("/a/b/")),
    ("/./", Some("/")),
    ("/a%20b", Some("/a b")),
    ("/a%0ab", Some("/a\nb")),
    ("/a\\..\\b", Some("/a\\..\\b")),
    ("/a/..", Some("/")),
    ("/a/.", Some("/a/")),
    ("/a#frag", Some("/a")),
    ("/a/b/%2e", Some("/a/b/")),
    ("/a/b/%2e%2e", Some("/a/")),
    ("/a/b/..//c", Some("/a/c")),
    ("/a/./../b", Some("/b")),
    ("/", Some("/")),
    ("/.well-known/x", Some("/.well-known/x")),
];

#[test]
fn matches_nginx_uri() {
    for (raw, want) in NGINX {
        let got = normalize(raw);
        assert_eq!(got.as_deref().ok(), *want, "{raw:?} -> {got:?}");
    }
    assert_eq!(
        normalize("/a%FF").unwrap(),
        "/a%FF",
        "non-UTF-8 stays encoded"
    );
    assert_eq!(normalize("/%C3%A9").unwrap(), "/é");
    assert_eq!(normalize("").unwrap(), "/");
    assert_eq!(normalize("*").unwrap(), "*");
}

#[test]
fn fast_path_borrows() {
    for p in ["/", "/a/b", "/a;b/c", "/a-b_c.d/e.f", "/a."] {
        assert!(is_normal(p.as_bytes()), "{p}");
        assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
    }
    for p in ["/a%20", "//a", "/./a", "/a/..", "/a#b"] {
        assert!(!is_normal(p.as_bytes()), "{p}");
    }
}

#[test]
fn servlet_cuts_parameters_as_apisix() {
    let ok = |p: &str| servlet(p).map(|c| c.into_owned());
    assert_eq!(ok("/admin;x"), Ok("/admin".into()));
    assert_eq!(ok("/a;x/b;y=1"), Ok("/a/b".into()));
    assert_eq!(ok("/a/b;"), Ok("/a/b".into()));
    assert_eq!(
        ok("/a/;x"),
        Ok("/a/".into()),
        "an empty last segment may carry parameters"
    );
    assert_eq!(ok("/plain"), Ok("/plain".into()));
    for bad in [
        "/..;/admin",
        "/a/.;x/b",
        "/;x/admin",
        "/%2e%2e;/admin",
        "/%2E;/a",
    ] {
        assert_eq!(servlet(bad), Err(UriError::ServletDotSegment), "{bad}");
    }
}

#[test]
fn escape_path_keeps_the_request_line_intact() {
    assert_eq!(escape_path("/a/b"), "/a/b");
    assert_eq!(escape_path("/a b\r\nX: y"), "/a%20b%0D%0AX:%20y");
    assert_eq!(escape_path("/a?b#c%d"), "/a%3Fb%23c%25d");
    assert_eq!(escape_path("/é"), "/%C3%A9");
    assert_eq!(escape_controls("a=1&b=\r\n"), "a=1&b=%0D%0A");
    assert!(matches!(escape_controls("a b?c"), Cow::Borrowed(_)));
}

fn path() -> impl Strategy<Value = String> {
    // Segments built from the characters that matter, escapes of them included.
    let piece = prop_oneof![
        Just("/".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%2e".to_string()),
        Just("%2F".to_string()),
        Just("%25".to_string()),
        Just(";".to_string()),
        Just("#".to_string()),
        Just("%".to_string()),
        Just("%C3".to_string()),
        Just("%A9".to_string()),
        "[a-z]{1,3}",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| format!("/{}", v.concat()))
}

proptest! {
    #[test]
    fn normalised_is_a_fixed_point_without_dot_segments(p in path()) {
        if let Ok(n) = normalize(&p) {
            prop_assert!(n.starts_with('/'));
            prop_assert!(!n.contains("//"), "{p:?} -> {n:?}");
            for seg in n.split('/') {
                prop_assert!(seg != "." && seg != "..", "{p:?} -> {n:?}");
            }
            // Idempotent on the decoded form's own terms: no slash or dot segment to resolve is left.
            let again = normalize(&n);
            if !n.contains('%') && !n.contains('#') {
                prop_assert_eq!(again.as_deref().ok(), Some(&*n));
            }
            if let Ok(s) = servlet(&n) {
                for seg in s.split('/') {
                    prop_assert!(seg != "." && seg != "..", "{p:?} -> {s:?}");
                }
            }
        }
    }

    #[test]
    fn never_panics_and_escape_is_wire_safe(s in "\\PC{0,40}") {
        let _ = normalize(&s);
        let _ = servlet(&s);
        let e = escape_path(&s);
        prop_assert!(e.bytes().all(|b| b > b' ' && b < 0x7f && b != b'?' && b != b'#'));
    }
}
