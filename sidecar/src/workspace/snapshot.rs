//! Change detection: an ordered list of `(path, kind, digest)` for every regular file (its
//! sha256) and symlink (its target text) of the workspace. Directories are not recorded, so an
//! empty directory is no change; rewriting the same bytes, or touching only mtime or
//! permissions, is no change either.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use perago_contract::paths::ATTEMPT_MARKER;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Symlink,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub path: String,
    pub kind: Kind,
    /// sha256 hex of a file; the target of a symlink.
    pub digest: String,
    /// MD5 hex of a file (what lakeFS reports as the checksum of uploaded objects).
    pub md5: String,
    pub size: u64,
}

pub type Snapshot = Vec<Item>;

/// Take a snapshot; blocking (hashes every file), so run it off the async runtime.
pub fn take(root: &Path) -> std::io::Result<Snapshot> {
    let mut items = Vec::new();
    super::tree::walk(root, |path, entry, kind| {
        if entry.file_name() == ATTEMPT_MARKER {
            return Ok(());
        }
        if kind.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            items.push(Item {
                path,
                kind: Kind::Symlink,
                digest: target.to_string_lossy().into_owned(),
                md5: String::new(),
                size: 0,
            });
        } else if kind.is_file() {
            let (digest, md5, size) = hash_file(&entry.path())?;
            items.push(Item {
                path,
                kind: Kind::File,
                digest,
                md5,
                size,
            });
        }
        Ok(())
    })?;
    items.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(items)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 and MD5 in one pass, 1 MiB at a time.
fn hash_file(path: &Path) -> std::io::Result<(String, String, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut md5 = md5::Md5::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buffer[..n]);
        md5.update(&buffer[..n]);
    }
    Ok((hex(&hasher.finalize()), hex(&md5.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_counts_as_a_change() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::fs::write(r.join(ATTEMPT_MARKER), b"{}").unwrap();
        let before = take(r).unwrap();
        assert_eq!(
            before.len(),
            1,
            "the marker and directories are not recorded"
        );
        assert_eq!(before[0].size, 3);

        std::fs::create_dir(r.join("empty")).unwrap();
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::fs::write(r.join("a/").join(ATTEMPT_MARKER), b"changed").unwrap();
        assert_eq!(
            take(r).unwrap(),
            before,
            "empty dirs, same bytes and markers are no change"
        );

        std::fs::write(r.join("a/b/f.txt"), b"two").unwrap();
        assert_ne!(take(r).unwrap(), before);
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::os::unix::fs::symlink("a", r.join("link")).unwrap();
        let with_link = take(r).unwrap();
        assert_eq!(
            with_link[1],
            Item {
                path: "link".into(),
                kind: Kind::Symlink,
                digest: "a".into(),
                md5: String::new(),
                size: 0
            }
        );
        assert_eq!(
            with_link[0].md5, "f97c5d29941bfb1b2fdab0874906ab82",
            "MD5 of 'one'"
        );
    }
}
