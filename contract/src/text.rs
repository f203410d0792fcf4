//! How values are shaped where a person reads them: quoted values in failure reasons and
//! errors (clipped, keeping both ends), and names made from Conductor's ids (sanitised).

use std::borrow::Cow;
use std::path::Path;

/// Longest object key, local path or lakeFS ref a failure reason quotes in full. Longer
/// values keep their start and end around an ellipsis, so that the cause, which follows them,
/// survives the cut to `PERAGO_FAILURE_REASON_MAX_LENGTH` (500 by default).
pub const QUOTED_MAX: usize = 160;

/// `text`, or for a text longer than `max_chars` characters its start and its end joined by
/// `…` (`max_chars` characters in all).
pub fn clip(text: &str, max_chars: usize) -> Cow<'_, str> {
    let length = text.chars().count();
    if length <= max_chars {
        return Cow::Borrowed(text);
    }
    let keep = max_chars.saturating_sub(1);
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(length - tail).collect();
    Cow::Owned(format!("{start}…{end}"))
}

/// [`clip`] for a path shown in a reason.
pub fn clip_path(path: &Path) -> String {
    clip(&path.display().to_string(), QUOTED_MAX).into_owned()
}

/// `text` with each run of characters `keep` refuses replaced by one `with`, and the `trim`
/// characters removed at both ends; `None` when nothing is left.
pub fn sanitized(
    text: &str,
    keep: impl Fn(char) -> bool,
    with: char,
    trim: [char; 2],
) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut in_run = false;
    for c in text.chars() {
        if keep(c) {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push(with);
            in_run = true;
        }
    }
    let trimmed = out.trim_matches(trim);
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quoted_values_keep_their_start_and_end() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdefghij", 10), "abcdefghij");
        assert_eq!(clip("abcdefghijk", 10), "abcde…hijk");
        assert_eq!(clip("abcdefghijk", 10).chars().count(), 10);
        assert_eq!(clip("éééééé漢字", 5), "éé…漢字");
        let long = format!("/work/{}/file.txt", "x".repeat(400));
        let clipped = clip_path(Path::new(&long));
        assert_eq!(clipped.chars().count(), QUOTED_MAX);
        assert!(clipped.starts_with("/work/xx") && clipped.ends_with("x/file.txt"));
    }

    #[test]
    fn refused_runs_become_one_character_and_the_ends_are_trimmed() {
        let keep = |c: char| c.is_ascii_alphanumeric();
        assert_eq!(
            sanitized("__a//b..c__", keep, '-', ['-', '_']).as_deref(),
            Some("a-b-c")
        );
        assert_eq!(sanitized("///", keep, '-', ['-', '_']), None);
    }
}
