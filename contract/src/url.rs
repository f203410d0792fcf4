//! Percent-encoding of one URL path segment, as the Conductor and lakeFS clients put task
//! types, ids, repositories and refs into their paths; and the check of an HTTP(S) endpoint
//! a task names, shared by the operator's validation and the sidecar's settings.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but the unreserved characters of RFC 3986 (`A-Z a-z 0-9 - _ . ~`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `text` as one path segment: a `/` in it cannot start another.
pub fn path_segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// What keeps `url` from being an HTTP(S) URL with a host (and a numeric port, if any).
pub fn http_url_problem(url: &str) -> Option<String> {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Some(format!("must be an http:// or https:// URL, not {url:?}"));
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!(
            "must not contain spaces or control characters: {url:?}"
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Some(format!("must not carry credentials: {url:?}"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() || host == "[]" {
        return Some(format!("must name a host: {url:?}"));
    }
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Some(format!(
            "has a port that is not a number up to 65535: {url:?}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(path_segment("features.build"), "features.build");
        assert_eq!(path_segment("a/b c~_-"), "a%2Fb%20c~_-");
        assert_eq!(path_segment("é"), "%C3%A9");
        assert_eq!(path_segment(".."), "..");
    }

    #[test]
    fn http_urls_name_a_host() {
        for good in [
            "http://marquez:5000/api/v1/lineage",
            "https://lineage.example",
            "http://[::1]:5000/x?y#z",
            "http://10.0.0.1/api/v1/lineage",
        ] {
            assert_eq!(http_url_problem(good), None, "{good}");
        }
        for (bad, says) in [
            ("marquez:5000", "must be an http:// or https:// URL"),
            ("ftp://m/x", "must be an http:// or https:// URL"),
            ("http://", "must name a host"),
            ("http://:5000/x", "must name a host"),
            ("http://m:http/x", "port that is not a number"),
            ("http://m:70000", "port that is not a number"),
            ("http://u:p@m/x", "credentials"),
            ("http://m/a b", "spaces"),
        ] {
            let problem = http_url_problem(bad).unwrap_or_default();
            assert!(problem.contains(says), "{bad}: {problem}");
        }
    }
}
