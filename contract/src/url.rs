//! Percent-encoding of one URL path segment, as the Conductor and lakeFS clients put task
//! types, ids, repositories and refs into their paths.

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
}
