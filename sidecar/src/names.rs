//! Names made from Conductor's ids, for execution directories and staging branches.

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
