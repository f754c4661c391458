//! Invariant: `parse_head` parses, asks for more, or returns a protocol error (400, 414, 431,
//! 501, 505); it never panics or hangs; a complete head's ranges lie inside it and nothing past
//! it is modified; and a prefix that already answered gives the whole input's answer.
//!
//! Input: byte 0 picks the limits, byte 1 the split point, the rest is the buffer.
//! `dicts/parse_head.dict` holds request-line and header tokens.
#![no_main]

use ferroloop_core::http::{parse_head, Head, HttpError, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: [Limits; 3] = [
    Limits {
        max_head_bytes: 65536,
        max_headers: 100,
        max_uri_bytes: 8192,
    },
    Limits {
        max_head_bytes: 64,
        max_headers: 4,
        max_uri_bytes: 32,
    },
    Limits {
        max_head_bytes: 512,
        max_headers: 200,
        max_uri_bytes: 4,
    },
];

fn check(input: &[u8], limits: &Limits, head: &mut Head) -> Result<Option<usize>, HttpError> {
    let mut buf = input.to_vec();
    match parse_head(&mut buf, limits, head) {
        Ok(true) => {
            assert!(head.head_len <= buf.len() && head.head_len <= limits.max_head_bytes);
            for range in [&head.method, &head.target, &head.path, &head.query] {
                assert!(range.start <= range.end && range.end <= head.head_len);
            }
            assert!(head.target.len() <= limits.max_uri_bytes);
            assert!(head.headers.len() <= limits.max_headers);
            for (name, value) in &head.headers {
                assert!(name.end <= head.head_len && value.start <= value.end);
                assert!(value.end <= head.head_len);
            }
            assert_eq!(buf[head.head_len..], input[head.head_len..]);
            Ok(Some(head.head_len))
        }
        Ok(false) => Ok(None),
        Err(err) => {
            assert!([400, 414, 431, 501, 505].contains(&err.status), "{err:?}");
            Err(err)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [pick, split, input @ ..] = data else {
        return;
    };
    let limits = &LIMITS[usize::from(*pick) % LIMITS.len()];
    let mut head = Head::default();
    let whole = check(input, limits, &mut head);
    let split = usize::from(*split) * input.len() / 255;
    let prefix = check(&input[..split], limits, &mut head);
    if prefix != Ok(None) {
        assert_eq!(prefix, whole, "split at {split}");
    }
});
