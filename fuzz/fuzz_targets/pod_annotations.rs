//! The pod's annotations as the kubelet projects them into the sidecar (ADR 0042):
//! `pod_info::parse_annotations`, `pod_info::unquote` and `quote`, as the sidecar reads the
//! body image id at each publication.
//!
//! Input: the file's text, lossily decoded.
//!
//! Asserts: nothing panics; every annotation read comes from a line `key=…` whose value
//! unquotes to it; each value read survives `quote` and `unquote`, and the file written back
//! with `quote` reads as the same annotations.
#![no_main]

use libfuzzer_sys::fuzz_target;
use perago_contract::pod_info::{parse_annotations, quote, unquote};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let read = parse_annotations(&text);
    for (key, value) in &read {
        assert!(!key.contains('\n') && !key.contains('='), "{key:?}");
        assert!(
            text.lines().any(|line| line
                .split_once('=')
                .is_some_and(|(k, v)| k == key && unquote(v).as_deref() == Some(value.as_str()))),
            "{key:?} = {value:?} from no line"
        );
        assert_eq!(unquote(&quote(value)).as_deref(), Some(value.as_str()));
    }
    let written: Vec<String> = read.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect();
    assert_eq!(parse_annotations(&written.join("\n")), read);
    // Any single value, as the text itself.
    assert_eq!(unquote(&quote(&text)).as_deref(), Some(&*text));
});
