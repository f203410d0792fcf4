//! What the operator tells an executor pod's sidecar through the pod's own annotations
//! (ADR 0042): the kubelet projects `metadata.annotations` into a file of the sidecar
//! (a downward-API volume) and rewrites it when they change, so the sidecar learns facts
//! that exist only after the pod started, such as the digest of the body image that runs,
//! without a Kubernetes API token.

use std::collections::BTreeMap;

/// The annotation the operator sets on an executor pod once the kubelet reports the body
/// container's `imageID`: the image as it runs, by digest.
pub const BODY_IMAGE_ID_ANNOTATION: &str = "perago.io/body-image-id";

/// Where the sidecar reads the pod's annotations (a downward-API volume).
pub const ANNOTATIONS_DIR: &str = "/etc/perago-pod";
pub const ANNOTATIONS_FILE: &str = "annotations";

/// The annotations in a downward-API `metadata.annotations` file: one `key="value"` per
/// line, the value quoted as Go quotes strings. Lines that are not of that form are skipped.
pub fn parse_annotations(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (key, quoted) = line.split_once('=')?;
            Some((key.to_owned(), unquote(quoted)?))
        })
        .collect()
}

/// The string a Go-quoted literal (`strconv.Quote`) stands for; `None` when it is not one.
pub fn unquote(quoted: &str) -> Option<String> {
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => {
                let escaped = chars.next()?;
                let simple = match escaped {
                    'a' => Some(0x07),
                    'b' => Some(0x08),
                    'f' => Some(0x0c),
                    'n' => Some(b'\n'),
                    'r' => Some(b'\r'),
                    't' => Some(b'\t'),
                    'v' => Some(0x0b),
                    '\\' => Some(b'\\'),
                    '"' => Some(b'"'),
                    '\'' => Some(b'\''),
                    _ => None,
                };
                if let Some(b) = simple {
                    bytes.push(b);
                    continue;
                }
                match escaped {
                    'x' => bytes.push(u8::try_from(hex(&mut chars, 2)?).ok()?),
                    'u' | 'U' => {
                        let digits = if escaped == 'u' { 4 } else { 8 };
                        let c = char::from_u32(hex(&mut chars, digits)?)?;
                        let mut buf = [0; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                    '0'..='7' => {
                        let rest = [chars.next()?, chars.next()?];
                        let mut value = escaped.to_digit(8)?;
                        for d in rest {
                            value = value * 8 + d.to_digit(8)?;
                        }
                        bytes.push(u8::try_from(value).ok()?);
                    }
                    _ => return None,
                }
            }
            c => {
                let mut buf = [0; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `text` quoted as Go's `strconv.Quote` quotes it for the kubelet's annotations file (control
/// characters escaped, the rest as it is); [`unquote`] reads it back.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if c.is_control() && (c as u32) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn hex(chars: &mut std::str::Chars<'_>, digits: usize) -> Option<u32> {
    let mut value = 0u32;
    for _ in 0..digits {
        value = value.checked_mul(16)? + chars.next()?.to_digit(16)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the kubelet writes it (Go's `%q`), keys sorted, no newline after the last line.
    #[test]
    fn a_downward_api_annotations_file_is_read() {
        let text = "kubectl.kubernetes.io/default-container=\"body\"\n\
                    perago.io/body-image-id=\"registry.local:5000/body@sha256:0a1b\"\n\
                    perago.io/contract-hash=\"c0ffee\"\n\
                    quoted=\"a \\\"b\\\"\\n\\tc\\\\ \\x7f \\u00e9 \\U0001f600 é\"\n\
                    not a line\n\
                    bad=\"open";
        let a = parse_annotations(text);
        assert_eq!(
            a[BODY_IMAGE_ID_ANNOTATION],
            "registry.local:5000/body@sha256:0a1b"
        );
        assert_eq!(a["kubectl.kubernetes.io/default-container"], "body");
        assert_eq!(a["quoted"], "a \"b\"\n\tc\\ \u{7f} é 😀 é");
        assert_eq!(a.len(), 4, "{a:?}");
        assert_eq!(parse_annotations(""), BTreeMap::new());
    }

    #[test]
    fn quoted_text_reads_back() {
        for text in [
            "",
            "body",
            "a \"b\"\n\t\\",
            "\u{0}\u{1f}\u{7f}\u{85}é😀",
            "=x=\"y",
        ] {
            assert_eq!(unquote(&quote(text)).as_deref(), Some(text), "{text:?}");
        }
        assert_eq!(quote("a\"\n\u{1}"), "\"a\\\"\\n\\x01\"");
        let file = format!(
            "k={}\nperago.io/body-image-id={}",
            quote("v\n="),
            quote("r@sha256:00")
        );
        let read = parse_annotations(&file);
        assert_eq!(
            (read["k"].as_str(), read[BODY_IMAGE_ID_ANNOTATION].as_str()),
            ("v\n=", "r@sha256:00")
        );
    }

    #[test]
    fn malformed_literals_are_refused() {
        for bad in [
            "",
            "\"",
            "x",
            "\"a\"b\"",
            "\"\\q\"",
            "\"\\x1\"",
            "\"\\u12\"",
            "\"\\U0011ffff\"",
            "\"\\400\"",
            "\"\\\"",
        ] {
            assert_eq!(unquote(bad), None, "{bad}");
        }
        assert_eq!(unquote("\"\\101\\x41\"").as_deref(), Some("AA"));
        assert_eq!(unquote("\"\"").as_deref(), Some(""));
    }
}
