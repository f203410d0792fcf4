//! Helpers the fuzz targets share.

/// The parts of an input separated by `0xFF` (a byte no UTF-8 text contains), each decoded
/// lossily, so that one input carries several strings of any content (newlines and NULs too).
pub fn parts(data: &[u8]) -> Vec<String> {
    data.split(|b| *b == 0xFF)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// The `i`th part, or `default` when the input has fewer.
pub fn part<'a>(parts: &'a [String], i: usize, default: &'a str) -> &'a str {
    parts.get(i).map_or(default, String::as_str)
}

/// Whether a relative path stays inside the directory it is joined to: not empty, not
/// absolute, and made of plain names only (no `..`, `.`, empty segments, backslashes or NULs).
pub fn stays_inside(relative: &str) -> bool {
    use std::path::{Component, Path};
    !relative.is_empty()
        && !relative.contains(['\\', '\0'])
        && !relative.split('/').any(|s| matches!(s, "" | "." | ".."))
        && Path::new(relative)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        && Path::new("/work/ws")
            .join(relative)
            .starts_with("/work/ws/")
}
