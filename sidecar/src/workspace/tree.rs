//! The one walk of a workspace tree that guardrails and change detection share.

use std::fs::{DirEntry, FileType};
use std::io;
use std::path::Path;

/// Visit every entry below `root` (not the root itself), without following symlinks: its
/// path relative to `root` with `/` separators, the entry and its type. A directory is
/// entered after its visit; the order is unspecified.
pub fn walk(
    root: &Path,
    mut visit: impl FnMut(String, &DirEntry, FileType) -> io::Result<()>,
) -> io::Result<()> {
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            // Not followed: a symlink to a directory is not a directory here.
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(path.clone());
            }
            visit(path, &entry, kind)?;
        }
    }
    Ok(())
}
