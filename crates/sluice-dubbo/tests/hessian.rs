//! Hessian 2: the spec's byte examples, the compact forms, hostile input, and property round trips.

use proptest::prelude::*;
use sluice_dubbo::hessian::{from_slice, to_vec, ClassDef, DecodeError, Decoder, Encoder, Value};
use std::sync::Arc;

fn enc(v: &Value) -> Vec<u8> {
    to_vec(v)
}

fn s(b: &[u8]) -> Vec<u8> {
    b.to_vec()
}

#[test]
fn ints_use_the_compact_forms() {
    let cases: &[(i32, &[u8])] = &[
        (0, &[0x90]),
        (-16, &[0x80]),
        (47, &[0xbf]),
        (48, &[0xc8, 0x30]),
        (-17, &[0xc7, 0xef]),
        (-2048, &[0xc0, 0x00]),
        (2047, &[0xcf, 0xff]),
        (2048, &[0xd4, 0x08, 0x00]),
        (-262144, &[0xd0, 0x00, 0x00]),
        (262143, &[0xd7, 0xff, 0xff]),
        (262144, &[b'I', 0x00, 0x04, 0x00, 0x00]),
        (i32::MIN, &[b'I', 0x80, 0, 0, 0]),
    ];
    for (v, bytes) in cases {
        assert_eq!(enc(&Value::Int(*v)), s(bytes), "{v}");
        assert_eq!(from_slice(bytes).unwrap(), Value::Int(*v), "{v}");
    }
}

#[test]
fn longs_use_the_compact_forms() {
    let cases: &[(i64, &[u8])] = &[
        (0, &[0xe0]),
        (-8, &[0xd8]),
        (15, &[0xef]),
        (16, &[0xf8, 0x10]),
        (-2048, &[0xf0, 0x00]),
        (2047, &[0xff, 0xff]),
        (-262144, &[0x38, 0x00, 0x00]),
        (262143, &[0x3f, 0xff, 0xff]),
        (262144, &[b'Y', 0x00, 0x04, 0x00, 0x00]),
        (i32::MAX as i64, &[b'Y', 0x7f, 0xff, 0xff, 0xff]),
        (1 << 31, &[b'L', 0, 0, 0, 0, 0x80, 0, 0, 0]),
        (i64::MIN, &[b'L', 0x80, 0, 0, 0, 0, 0, 0, 0]),
    ];
    for (v, bytes) in cases {
        assert_eq!(enc(&Value::Long(*v)), s(bytes), "{v}");
        assert_eq!(from_slice(bytes).unwrap(), Value::Long(*v), "{v}");
    }
}

#[test]
fn doubles_use_the_compact_forms() {
    let cases: &[(f64, &[u8])] = &[
        (0.0, &[0x5b]),
        (1.0, &[0x5c]),
        (-128.0, &[0x5d, 0x80]),
        (127.0, &[0x5d, 0x7f]),
        (-32768.0, &[0x5e, 0x80, 0x00]),
        (32767.0, &[0x5e, 0x7f, 0xff]),
        (12.25, &[0x5f, 0x00, 0x00, 0x2f, 0xda]),
        (1e10, &[b'D', 0x42, 0x02, 0xa0, 0x5f, 0x20, 0, 0, 0]),
        (
            0.1 + 0.2,
            &[b'D', 0x3f, 0xd3, 0x33, 0x33, 0x33, 0x33, 0x33, 0x34],
        ),
    ];
    for (v, bytes) in cases {
        assert_eq!(enc(&Value::Double(*v)), s(bytes), "{v}");
        assert_eq!(from_slice(bytes).unwrap(), Value::Double(*v), "{v}");
    }
    let Value::Double(nan) = from_slice(&enc(&Value::Double(f64::NAN))).unwrap() else {
        panic!()
    };
    assert!(nan.is_nan());
}

#[test]
fn dates_strings_binaries_as_in_the_spec() {
    // 09:51:31 May 8, 1998 UTC, and the same minute in the compact form.
    assert_eq!(
        enc(&Value::Date(894_621_091_000)),
        s(&[0x4a, 0, 0, 0, 0xd0, 0x4b, 0x92, 0x84, 0xb8])
    );
    assert_eq!(
        enc(&Value::Date(894_621_060_000)),
        s(&[0x4b, 0x00, 0xe3, 0x83, 0x8f])
    );
    assert_eq!(
        from_slice(&[0x4b, 0x00, 0xe3, 0x83, 0x8f]).unwrap(),
        Value::Date(894_621_060_000)
    );
    assert_eq!(enc(&Value::string("")), s(&[0x00]));
    assert_eq!(enc(&Value::string("hello")), s(b"\x05hello"));
    assert_eq!(enc(&Value::string("\u{c3}")), s(&[0x01, 0xc3, 0x83]));
    let s1024 = "a".repeat(1024);
    assert_eq!(&enc(&Value::string(&s1024))[..3], &[b'S', 0x04, 0x00]);
    assert_eq!(&enc(&Value::string("a".repeat(1023)))[..2], &[0x33, 0xff]);
    assert_eq!(enc(&Value::Binary(vec![])), s(&[0x20]));
    assert_eq!(enc(&Value::Binary(vec![1, 2, 3])), s(&[0x23, 1, 2, 3]));
    assert_eq!(&enc(&Value::Binary(vec![0; 1023]))[..2], &[0x37, 0xff]);
    assert_eq!(
        &enc(&Value::Binary(vec![0; 1024]))[..3],
        &[b'B', 0x04, 0x00]
    );
}

#[test]
fn supplementary_characters_go_as_java_writes_them() {
    // U+1F600 is two UTF-16 units; Java writes each surrogate as 3 bytes.
    let v = Value::string("a\u{1F600}");
    assert_eq!(
        enc(&v),
        s(&[0x03, b'a', 0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80])
    );
    assert_eq!(from_slice(&enc(&v)).unwrap(), v);
    // dubbo-go writes the 4-byte UTF-8 form and counts it as 2 units.
    assert_eq!(
        from_slice(&[0x03, b'a', 0xf0, 0x9f, 0x98, 0x80]).unwrap(),
        v
    );
    // A lone surrogate (legal in a Java string) becomes U+FFFD.
    assert_eq!(
        from_slice(&[0x01, 0xed, 0xa0, 0xbd]).unwrap(),
        Value::string("\u{fffd}")
    );
}

#[test]
fn long_strings_are_chunked_without_splitting_a_surrogate_pair() {
    let plain = "x".repeat(0x8000 * 2 + 5);
    let bytes = enc(&Value::string(&plain));
    assert_eq!(&bytes[..3], &[b'R', 0x80, 0x00]);
    assert_eq!(&bytes[3 + 0x8000..3 + 0x8000 + 3], &[b'R', 0x80, 0x00]);
    assert_eq!(from_slice(&bytes).unwrap(), Value::string(&plain));
    // The pair would straddle the first chunk boundary: the chunk gets one unit less.
    let tricky = format!("{}\u{1F600}tail", "y".repeat(0x8000 - 1));
    let bytes = enc(&Value::string(&tricky));
    assert_eq!(&bytes[..3], &[b'R', 0x7f, 0xff]);
    assert_eq!(from_slice(&bytes).unwrap(), Value::string(&tricky));
    let big = vec![7u8; 0x8000 * 2 + 1];
    let bytes = enc(&Value::Binary(big.clone()));
    assert_eq!(&bytes[..3], &[b'A', 0x80, 0x00]);
    assert_eq!(from_slice(&bytes).unwrap(), Value::Binary(big));
}

#[test]
fn lists_maps_objects_as_in_the_spec() {
    let ints = Value::List {
        typ: Some("[int".into()),
        items: vec![Value::Int(0), Value::Int(1)],
    };
    assert_eq!(enc(&ints), s(b"\x72\x04[int\x90\x91"));
    assert_eq!(
        enc(&Value::list([Value::Int(0), Value::Int(1)])),
        s(&[0x7a, 0x90, 0x91])
    );
    let eight = Value::list((0..8).map(Value::Int));
    assert_eq!(&enc(&eight)[..2], &[b'X', 0x98]);
    // Variable-length forms decode too.
    assert_eq!(
        from_slice(b"W\x90\x91Z").unwrap(),
        Value::list([Value::Int(0), Value::Int(1)])
    );
    assert_eq!(
        from_slice(b"U\x04[int\x90Z").unwrap(),
        Value::List {
            typ: Some("[int".into()),
            items: vec![Value::Int(0)]
        }
    );
    // A type written once is referred to by number afterwards.
    let two = Value::list([ints.clone(), ints.clone()]);
    assert_eq!(enc(&two), s(b"\x7a\x72\x04[int\x90\x91\x72\x90\x90\x91"));
    assert_eq!(from_slice(&enc(&two)).unwrap(), two);

    let map = Value::map([(Value::Int(1), Value::string("fee"))]);
    assert_eq!(enc(&map), s(b"H\x91\x03feeZ"));
    let typed = Value::Map {
        typ: Some("com.caucho.test.Car".into()),
        entries: vec![(Value::string("model"), Value::string("Beetle"))],
    };
    assert_eq!(
        enc(&typed),
        s(b"M\x13com.caucho.test.Car\x05model\x06BeetleZ")
    );
    assert_eq!(from_slice(&enc(&typed)).unwrap(), typed);

    let car = |c: &str, m: &str| {
        Value::object(
            "example.Car",
            [("color", Value::string(c)), ("model", Value::string(m))],
        )
    };
    let cars = Value::list([car("red", "corvette"), car("green", "civic")]);
    assert_eq!(
        enc(&cars),
        s(b"\x7a\x43\x0bexample.Car\x92\x05color\x05model\x60\x03red\x08corvette\x60\x05green\x05civic")
    );
    assert_eq!(from_slice(&enc(&cars)).unwrap(), cars);
}

#[test]
fn more_than_sixteen_classes_use_the_long_object_form() {
    let objs = Value::list((0..20).map(|i| Value::object(format!("C{i}"), [("f", Value::Int(i))])));
    let bytes = enc(&objs);
    assert!(
        bytes.windows(2).any(|w| w == [b'O', 0xa0]),
        "class 16 as O + int"
    );
    assert_eq!(from_slice(&bytes).unwrap(), objs);
}

#[test]
fn references_resolve_and_cycles_stay_marked() {
    // [[1], ref to the inner list]: the reference decodes as a copy.
    let bytes = b"\x7a\x79\x91\x51\x91";
    let inner = Value::list([Value::Int(1)]);
    assert_eq!(
        from_slice(bytes).unwrap(),
        Value::list([inner.clone(), inner])
    );
    // A list that contains itself.
    assert_eq!(
        from_slice(b"W\x51\x90Z").unwrap(),
        Value::list([Value::Ref(0)])
    );
    // Java's Throwable: `cause` is the exception itself.
    let ex = Value::Object {
        class: Arc::new(ClassDef::new(
            "java.lang.RuntimeException",
            ["detailMessage", "cause"],
        )),
        fields: vec![Value::string("boom"), Value::Ref(0)],
    };
    let bytes = enc(&ex);
    assert_eq!(from_slice(&bytes).unwrap(), ex);
    assert_eq!(
        ex.exception_message(),
        Some(("java.lang.RuntimeException", Some("boom")))
    );
    // A later reference to the exception re-decodes it, inner self-reference included, without looping.
    let mut two = Vec::new();
    two.extend_from_slice(b"\x7a");
    two.extend_from_slice(&bytes);
    two.extend_from_slice(b"\x51\x91");
    assert_eq!(from_slice(&two).unwrap(), Value::list([ex.clone(), ex]));
    assert_eq!(from_slice(b"\x51\x90"), Err(DecodeError::BadRef(0)));
}

#[test]
fn class_definitions_and_refs_carry_over_in_one_stream() {
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out);
    let a = Value::object("A", [("x", Value::Int(1))]);
    e.write(&a);
    e.write(&a);
    assert_eq!(out, b"\x43\x01A\x91\x01x\x60\x91\x60\x91");
    let mut d = Decoder::new(&out);
    assert_eq!(d.read().unwrap(), a);
    assert_eq!(d.read().unwrap(), a);
    assert!(d.is_empty());
}

#[test]
fn hostile_input_is_refused_cleanly() {
    // Deep nesting: refused at the limit, no stack overflow.
    let deep = vec![b'W'; 100_000];
    assert_eq!(from_slice(&deep), Err(DecodeError::TooDeep(128)));
    let deep_maps = vec![b'H'; 100_000];
    assert_eq!(from_slice(&deep_maps), Err(DecodeError::TooDeep(128)));
    // Lengths larger than the input: no allocation, an error.
    assert!(matches!(
        from_slice(b"V\x04[intI\x7f\xff\xff\xff"),
        Err(DecodeError::BadLength { .. })
    ));
    assert!(matches!(
        from_slice(b"X\xd7\xff\xff\x90"),
        Err(DecodeError::BadLength { .. })
    ));
    assert!(matches!(
        from_slice(b"X\x8f"),
        Err(DecodeError::BadLength { .. })
    ));
    assert!(matches!(
        from_slice(b"C\x01AI\x7f\xff\xff\xff"),
        Err(DecodeError::BadLength { .. })
    ));
    assert_eq!(from_slice(b"S\xff\xffabc"), Err(DecodeError::Truncated));
    assert_eq!(from_slice(b"B\xff\xffabc"), Err(DecodeError::Truncated));
    assert_eq!(from_slice(b"R\x00\x01a"), Err(DecodeError::Truncated));
    // Undefined codes, and `Z` where a value belongs.
    for tag in [0x40, 0x45, 0x47, 0x50, 0x5a] {
        assert!(
            matches!(from_slice(&[tag]), Err(DecodeError::UnexpectedTag { .. })),
            "{tag:#x}"
        );
    }
    // Unknown class, type and reference numbers.
    assert_eq!(from_slice(b"\x60"), Err(DecodeError::BadClass(0)));
    assert_eq!(from_slice(b"\x71\x95\x90"), Err(DecodeError::BadType(5)));
    assert_eq!(from_slice(b"\x51\x80"), Err(DecodeError::BadRef(-16)));
    // Bad UTF-8.
    assert!(matches!(
        from_slice(&[0x01, 0xc3, 0x41]),
        Err(DecodeError::BadUtf8(_))
    ));
    assert!(matches!(
        from_slice(&[0x01, 0xff]),
        Err(DecodeError::BadUtf8(_))
    ));
    // A 4-byte sequence where only one unit is left.
    assert!(matches!(
        from_slice(&[0x01, 0xf0, 0x9f, 0x98, 0x80]),
        Err(DecodeError::BadUtf8(_))
    ));
    assert_eq!(from_slice(b""), Err(DecodeError::Truncated));
    assert!(from_slice(b"NN").is_err(), "trailing bytes");
}

#[test]
fn reference_bombs_hit_the_expansion_limit() {
    // Each level is a list of two references to the previous level: 2^n nodes from O(n) bytes.
    let mut b = vec![b'X', 0x9f]; // outer list of 15 levels
    b.extend_from_slice(&[0x21, 0x00]); // level 0: 1-byte binary... wrapped below
    b.truncate(2);
    b.extend_from_slice(b"\x79\x34\x10"); // slot 1: list with a 16-byte-long binary
    b.extend_from_slice(&[0u8; 16]);
    for level in 0..14 {
        b.extend_from_slice(&[0x7a, 0x51, 0x91 + level as u8, 0x51, 0x91 + level as u8]);
    }
    let small = Decoder::new(&b).max_ref_bytes(4096).read();
    assert!(
        matches!(small, Err(DecodeError::RefExpansion(4096))),
        "{small:?}"
    );
    // The default budget (the input's size, at least 64 KiB) stops it too.
    assert!(matches!(from_slice(&b), Err(DecodeError::RefExpansion(_))));
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::Int),
        any::<i64>().prop_map(Value::Long),
        any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Double),
        (-2048i32..2048).prop_map(Value::Int),
        (-300_000i64..300_000).prop_map(Value::Long),
        (-40_000i32..40_000).prop_map(|i| Value::Double(i as f64 / 1000.0)),
        any::<i64>().prop_map(Value::Date),
        (any::<i32>()).prop_map(|m| Value::Date(m as i64 * 60_000)),
        ".{0,40}".prop_map(Value::String),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
    ];
    leaf.prop_recursive(4, 64, 10, |inner| {
        let typ = proptest::option::of(prop_oneof![
            Just("[int".to_owned()),
            Just("java.util.HashSet".to_owned()),
            "[a-z.]{1,12}"
        ]);
        prop_oneof![
            (typ.clone(), proptest::collection::vec(inner.clone(), 0..10))
                .prop_map(|(typ, items)| Value::List { typ, items }),
            (
                typ,
                proptest::collection::vec((inner.clone(), inner.clone()), 0..6)
            )
                .prop_map(|(typ, entries)| Value::Map { typ, entries }),
            (
                prop_oneof![Just("A"), Just("B"), Just("com.x.User")],
                proptest::collection::vec(inner, 0..4)
            )
                .prop_map(|(c, vals)| {
                    let fields = (0..vals.len()).map(|i| format!("f{i}")).collect::<Vec<_>>();
                    Value::Object {
                        class: Arc::new(ClassDef::new(c, fields)),
                        fields: vals,
                    }
                }),
        ]
    })
}

proptest! {
    #[test]
    fn prop_round_trip(v in value_strategy()) {
        let bytes = enc(&v);
        prop_assert_eq!(from_slice(&bytes).unwrap(), v);
    }

    #[test]
    fn prop_every_truncation_is_an_error(v in value_strategy()) {
        let bytes = enc(&v);
        for cut in 0..bytes.len() {
            prop_assert!(from_slice(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn prop_random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut d = Decoder::new(&bytes);
        while !d.is_empty() {
            if d.read().is_err() { break; }
        }
    }

    #[test]
    fn prop_strings_round_trip(s in "\\PC{0,64}") {
        prop_assert_eq!(from_slice(&enc(&Value::String(s.clone()))).unwrap(), Value::String(s));
    }
}
