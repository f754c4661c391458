//! CGI names of request header fields (RFC 3875 §4.1.18), as WSGI's environ uses them.

/// `HTTP_` + the field name upper-cased with `-` as `_`; `CONTENT_TYPE` and `CONTENT_LENGTH`
/// without the prefix. `None` for a name with `_`: it would be indistinguishable from the
/// one spelled with `-` (`X_Forwarded_For` posing as `X-Forwarded-For`), so such fields are
/// dropped, as gunicorn and nginx do. `name` is lower-case (as the parser stores it).
pub fn cgi_key(name: &[u8]) -> Option<String> {
    if name.contains(&b'_') {
        return None;
    }
    match name {
        b"content-type" => return Some("CONTENT_TYPE".into()),
        b"content-length" => return Some("CONTENT_LENGTH".into()),
        _ => {}
    }
    let mut key = String::with_capacity(5 + name.len());
    key.push_str("HTTP_");
    for &b in name {
        key.push(if b == b'-' {
            '_'
        } else {
            char::from(b.to_ascii_uppercase())
        });
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::cgi_key;

    #[test]
    fn header_names_become_cgi_keys() {
        assert_eq!(
            cgi_key(b"x-request-id").as_deref(),
            Some("HTTP_X_REQUEST_ID")
        );
        assert_eq!(cgi_key(b"host").as_deref(), Some("HTTP_HOST"));
        assert_eq!(cgi_key(b"content-type").as_deref(), Some("CONTENT_TYPE"));
        assert_eq!(
            cgi_key(b"content-length").as_deref(),
            Some("CONTENT_LENGTH")
        );
    }

    #[test]
    fn header_names_with_underscores_are_dropped() {
        assert_eq!(cgi_key(b"x_forwarded_for"), None);
        assert_eq!(cgi_key(b"_"), None);
    }
}
