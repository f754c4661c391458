use super::*;

#[test]
fn accept_key_matches_rfc_6455_and_python() {
    let cases: &[(&[u8], &[u8; 28])] = &[
        // RFC 6455 §1.3.
        (b"dGhlIHNhbXBsZSBub25jZQ==", b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        // base64.b64encode(hashlib.sha1(key + GUID).digest()) in Python.
        (b"AAECAwQFBgcICQoLDA0ODw==", b"Bz3qJYTGdOe8gUSpLosEdiLKDrk="),
        (b"/////////////////////w==", b"XXpj4jYzLM2yUE0C7TIgMwTQh2g="),
        (b"", b"Kfh9QIsMVZcl6xEPYxPHzW8SZ8w="),
    ];
    for &(key, want) in cases {
        let got = accept_key(key);
        assert_eq!(
            &got,
            want,
            "{:?}: {:?}",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(&got)
        );
    }
}

#[test]
fn key_must_encode_16_bytes() {
    let valid: &[&[u8]] = &[
        b"dGhlIHNhbXBsZSBub25jZQ==",
        b"AAECAwQFBgcICQoLDA0ODw==",
        b"/////////////////////w==",
        b"+++++++++++++++++++++A==",
        // The last character's unused bits are not checked (see `check_key`).
        b"AAAAAAAAAAAAAAAAAAAAAB==",
    ];
    for key in valid {
        assert_eq!(check_key(key), Ok(()), "{:?}", String::from_utf8_lossy(key));
    }
    let invalid: &[(&str, &[u8])] = &[
        ("empty", b""),
        ("15 bytes", b"////////////////////"),
        ("17 bytes", b"//////////////////////8="),
        ("no padding", b"dGhlIHNhbXBsZSBub25jZQ"),
        ("one pad", b"dGhlIHNhbXBsZSBub25jZQ="),
        ("three pads", b"dGhlIHNhbXBsZSBub25jZ==="),
        ("url-safe alphabet", b"-____________________w=="),
        ("inner space", b"dGhlIHNhbXBsZSBub25 ZQ=="),
        ("trailing space", b"dGhlIHNhbXBsZSBub25jZQ== "),
        ("pad inside", b"dGhlIHNhbXBsZSBub2=jZQ=="),
        (
            "32 bytes",
            b"dGhlIHNhbXBsZSBub25jZQ==dGhlIHNhbXBsZSBub25jZQ==",
        ),
        ("non-ASCII", "dGhlIHNhbXBsZSBub25jé==".as_bytes()),
    ];
    for &(name, key) in invalid {
        let err = check_key(key).expect_err(name);
        assert_eq!(err.status, 400, "{name}");
        assert!(err.reason.contains("Sec-WebSocket-Key"), "{name}");
    }
}

#[test]
fn version_must_be_13() {
    assert_eq!(check_version(Some(b"13")), Ok(()));
    for value in [&b"8"[..], b"12", b"013", b"13, 8", b"", b"1", b"130"] {
        let err = check_version(Some(value)).expect_err("not 13");
        assert_eq!(err.status, 426);
        assert!(err.reason.contains("version 13"));
    }
    let err = check_version(None).expect_err("missing");
    assert_eq!(err.status, 426);
    assert!(err.reason.contains("without Sec-WebSocket-Version"));
}

#[test]
fn tokens_are_found_in_comma_separated_lists() {
    let cases: &[(&[u8], &[u8], bool)] = &[
        (b"Upgrade", b"upgrade", true),
        (b"upgrade", b"upgrade", true),
        (b"UPGRADE", b"upgrade", true),
        (b"keep-alive, Upgrade", b"upgrade", true),
        (b"Upgrade, keep-alive", b"upgrade", true),
        (b"keep-alive,Upgrade", b"upgrade", true),
        (b"keep-alive ,\t upgrade \t, close", b"upgrade", true),
        (b",,upgrade,", b"upgrade", true),
        (b"websocket", b"websocket", true),
        (b"WebSocket", b"websocket", true),
        (b"h2c, websocket", b"websocket", true),
        (b"", b"upgrade", false),
        (b"keep-alive", b"upgrade", false),
        (b"upgrades", b"upgrade", false),
        (b"x-upgrade", b"upgrade", false),
        (b"up grade", b"upgrade", false),
        (b"upgrade;q=1", b"upgrade", false),
        (b"websocket/13", b"websocket", false),
        (b" , ", b"upgrade", false),
    ];
    for &(list, token, want) in cases {
        assert_eq!(
            has_token(list, token),
            want,
            "{:?} in {:?}",
            String::from_utf8_lossy(token),
            String::from_utf8_lossy(list)
        );
    }
}

#[test]
fn reasons_name_the_field() {
    for err in [MISSING_VERSION, UNSUPPORTED_VERSION, BAD_KEY] {
        assert!(err.reason.contains("Sec-WebSocket-"), "{err}");
        assert!([400, 426].contains(&err.status), "{err}");
    }
}
