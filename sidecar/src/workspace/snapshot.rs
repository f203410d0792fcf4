//! Change detection: an ordered list of `(path, kind, digest, size)` for every regular file
//! (its MD5) and symlink (its target text) of the workspace. Directories are not recorded, so
//! an empty directory is no change; rewriting the same bytes, or touching only mtime or
//! permissions, is no change either.
//!
//! Reading every file twice per attempt (before and after the body) is what a naive detector
//! pays; this one reads a file only when its stamp cannot vouch for it (docs/design.md,
//! "Change detection"):
//! - before the body, the [`Baseline`] records every file's [`Stamp`] and takes its MD5 from
//!   the download's manifest (lakeFS's checksum of the object it was written from), reading
//!   only files whose checksum is not a plain MD5;
//! - then it writes a probe file and reads the file system's clock off its change time `T`.
//!   Every write, truncation, rename or `utimes` sets a file's change time to the file
//!   system's clock, which the body can only move forward from `T`: a file recorded with a
//!   change time before `T` whose stamp is unchanged after the body was not touched by it. A
//!   file recorded at or after `T` (written within the clock's last tick) is *racy*: its stamp
//!   proves nothing, so it is read after the body like a file whose stamp changed;
//! - after the body, [`Baseline::after`] hashes only the new, racy and re-stamped files;
//!   [`Baseline::after_reading_later`] leaves the large ones among them *unread* (their
//!   digest is taken while they upload, [`read_unread`] when they do not: ADR 0045).

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use perago_contract::paths::ATTEMPT_MARKER;

use crate::workspace::download::Manifest;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Symlink,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub path: String,
    pub kind: Kind,
    /// MD5 hex of a file (what lakeFS reports as the checksum of uploaded objects); the
    /// target of a symlink; empty for an unread file ([`Item::is_unread`]).
    pub digest: String,
    pub size: u64,
}

impl Item {
    /// A file whose bytes may have changed and whose digest is not known yet: it differs
    /// from every recorded item, and from every object of lakeFS, until it is read.
    pub fn is_unread(&self) -> bool {
        self.kind == Kind::File && self.digest.is_empty()
    }
}

pub type Snapshot = Vec<Item>;

/// The size from which [`Baseline::after_reading_later`] leaves a file unread. Below it a
/// read costs milliseconds, which buys the no-op exit without a staging branch; above it the
/// upload reads the file anyway (ADR 0045).
pub const READ_LATER_MIN: u64 = 8 << 20;

/// What the file system says of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            size: meta.size(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }
}

/// The workspace as the body received it.
#[derive(Debug)]
pub struct Baseline {
    items: Snapshot,
    /// Per file: its stamp, and whether the stamp may be trusted after the body (not racy).
    stamps: HashMap<String, (Stamp, bool)>,
}

impl Baseline {
    /// Record the workspace at `root` before the body runs; `probe` is a path on the same
    /// file system, outside the workspace, written and removed to read the clock. Blocking:
    /// run it off the async runtime.
    pub fn record(root: &Path, probe: &Path, downloaded: &Manifest) -> std::io::Result<Self> {
        let mut stamps = HashMap::new();
        let items = scan(root, |path, entry| {
            let stamp = Stamp::of(&entry.metadata()?);
            let known = downloaded
                .objects
                .get(&path)
                .filter(|(checksum, size)| is_md5(checksum) && *size == stamp.size);
            stamps.insert(path.clone(), (stamp, true));
            match known {
                Some((checksum, size)) => Ok(Item {
                    path,
                    kind: Kind::File,
                    digest: checksum.clone(),
                    size: *size,
                }),
                None => hashed(path, &entry.path()),
            }
        })?;
        let clock = clock_at(probe)?;
        for (stamp, trusted) in stamps.values_mut() {
            *trusted = stamp.changed < clock;
        }
        Ok(Self { items, stamps })
    }

    /// The workspace as it was recorded.
    pub fn items(&self) -> &Snapshot {
        &self.items
    }

    /// The workspace at `root` now, reading only the files whose stamp cannot vouch for
    /// them. Blocking.
    pub fn after(&self, root: &Path) -> std::io::Result<Snapshot> {
        self.after_reading_later(root, u64::MAX)
    }

    /// As [`Baseline::after`], but a file of `read_later_min` bytes or more that must be read
    /// is left unread ([`Item::is_unread`]): the upload that stages it reads it anyway.
    /// Blocking.
    pub fn after_reading_later(
        &self,
        root: &Path,
        read_later_min: u64,
    ) -> std::io::Result<Snapshot> {
        let recorded: HashMap<&str, &Item> =
            self.items.iter().map(|i| (i.path.as_str(), i)).collect();
        scan(root, |path, entry| {
            let stamp = Stamp::of(&entry.metadata()?);
            let vouched = self
                .stamps
                .get(&path)
                .is_some_and(|(before, trusted)| *trusted && *before == stamp);
            match recorded.get(path.as_str()) {
                Some(item) if vouched => Ok((*item).clone()),
                _ if stamp.size >= read_later_min => Ok(Item {
                    path,
                    kind: Kind::File,
                    digest: String::new(),
                    size: stamp.size,
                }),
                _ => hashed(path, &entry.path()),
            }
        })
    }
}

/// Read the unread files of `snapshot` (below `root`), each now given its digest and the
/// size read. Blocking.
pub fn read_unread(root: &Path, snapshot: &mut Snapshot) -> std::io::Result<()> {
    for item in snapshot.iter_mut().filter(|i| i.is_unread()) {
        (item.digest, item.size) = md5_of(&root.join(&item.path))?;
    }
    Ok(())
}

/// Every regular file and symlink below `root` (the attempt marker aside), hashed; for a
/// workspace not made by a download. Blocking.
pub fn take(root: &Path) -> std::io::Result<Snapshot> {
    scan(root, |path, entry| hashed(path, &entry.path()))
}

/// The workspace's files and symlinks in path order, the attempt marker aside; `file` makes
/// a regular file's item.
fn scan(
    root: &Path,
    mut file: impl FnMut(String, &std::fs::DirEntry) -> std::io::Result<Item>,
) -> std::io::Result<Snapshot> {
    let mut items = Vec::new();
    super::tree::walk(root, |path, entry, kind| {
        if entry.file_name() == ATTEMPT_MARKER {
            return Ok(());
        }
        if kind.is_symlink() {
            items.push(symlink(path, &entry.path())?);
        } else if kind.is_file() {
            items.push(file(path, entry)?);
        }
        Ok(())
    })?;
    items.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(items)
}

/// A regular file's item, read.
fn hashed(path: String, at: &Path) -> std::io::Result<Item> {
    let (digest, size) = md5_of(at)?;
    Ok(Item {
        path,
        kind: Kind::File,
        digest,
        size,
    })
}

fn symlink(path: String, at: &Path) -> std::io::Result<Item> {
    let target = std::fs::read_link(at)?;
    Ok(Item {
        path,
        kind: Kind::Symlink,
        digest: target.to_string_lossy().into_owned(),
        size: 0,
    })
}

/// The file system's clock now, as the change time of a file written at `probe`.
fn clock_at(probe: &Path) -> std::io::Result<(i64, i64)> {
    std::fs::write(probe, b"clock")?;
    let meta = std::fs::symlink_metadata(probe);
    std::fs::remove_file(probe)?;
    let meta = meta?;
    Ok((meta.ctime(), meta.ctime_nsec()))
}

/// A checksum lakeFS computed as the MD5 of the object's bytes (32 lowercase hex digits);
/// others (a multipart upload's ETag, say) say nothing about the bytes.
pub fn is_md5(checksum: &str) -> bool {
    checksum.len() == 32
        && checksum
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// MD5 hex and size of a file, read 1 MiB at a time.
fn md5_of(path: &Path) -> std::io::Result<(String, u64)> {
    use md5::Digest;
    let mut file = std::fs::File::open(path)?;
    let mut md5 = md5::Md5::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        md5.update(&buffer[..n]);
    }
    Ok((hex(&md5.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_MD5: &str = "f97c5d29941bfb1b2fdab0874906ab82";

    fn baseline(r: &Path) -> Baseline {
        Baseline::record(r, &r.with_extension("probe"), &Manifest::default()).unwrap()
    }

    #[test]
    fn what_counts_as_a_change() {
        let t = tempfile::tempdir().unwrap();
        let r = &t.path().join("ws");
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::fs::write(r.join(ATTEMPT_MARKER), b"{}").unwrap();
        let before = baseline(r);
        assert_eq!(
            before.items().len(),
            1,
            "the marker and directories are not recorded"
        );
        assert_eq!(before.items()[0].size, 3);
        assert_eq!(before.items()[0].digest, ONE_MD5, "MD5 of 'one'");
        assert!(!r.with_extension("probe").exists(), "the probe is removed");
        assert_eq!(&before.after(r).unwrap(), before.items());

        std::fs::create_dir(r.join("empty")).unwrap();
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::fs::write(r.join("a/").join(ATTEMPT_MARKER), b"changed").unwrap();
        assert_eq!(
            &before.after(r).unwrap(),
            before.items(),
            "empty dirs, same bytes and markers are no change"
        );

        std::fs::write(r.join("a/b/f.txt"), b"two").unwrap();
        assert_ne!(&before.after(r).unwrap(), before.items());
        std::fs::write(r.join("a/b/f.txt"), b"one").unwrap();
        std::os::unix::fs::symlink("a", r.join("link")).unwrap();
        let with_link = before.after(r).unwrap();
        assert_eq!(
            with_link[1],
            Item {
                path: "link".into(),
                kind: Kind::Symlink,
                digest: "a".into(),
                size: 0
            }
        );
        assert_eq!(take(r).unwrap(), with_link);
    }

    /// The edge cases of trusting stamps: each change keeps the size (and, where the test
    /// can, the modification time) and must still be seen.
    #[test]
    fn a_changed_file_is_never_missed() {
        let t = tempfile::tempdir().unwrap();
        let r = &t.path().join("ws");
        std::fs::create_dir(r).unwrap();
        let files = [
            "same-second",
            "touched",
            "replaced",
            "symlinked",
            "renamed-over",
        ];
        for f in files {
            std::fs::write(r.join(f), b"one").unwrap();
        }
        // Every file's stamp is trusted only once the clock has passed its change time.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = baseline(r);
        assert!(before.stamps.values().all(|(_, trusted)| *trusted));
        let mtime = |f: &str| std::fs::metadata(r.join(f)).unwrap().modified().unwrap();

        // Rewritten with the same size, its modification time set back as it was.
        let was = mtime("same-second");
        std::fs::write(r.join("same-second"), b"two").unwrap();
        std::fs::File::options()
            .write(true)
            .open(r.join("same-second"))
            .unwrap()
            .set_modified(was)
            .unwrap();
        assert_eq!(mtime("same-second"), was);
        // Touched, same bytes: read again, and no change.
        std::fs::File::options()
            .write(true)
            .open(r.join("touched"))
            .unwrap()
            .set_modified(std::time::SystemTime::now())
            .unwrap();
        // Removed and written anew (the inode number may come back).
        std::fs::remove_file(r.join("replaced")).unwrap();
        std::fs::write(r.join("replaced"), b"owt").unwrap();
        // Replaced by a symlink.
        std::fs::remove_file(r.join("symlinked")).unwrap();
        std::os::unix::fs::symlink("touched", r.join("symlinked")).unwrap();
        // A new file renamed over the old one.
        std::fs::write(r.join("new"), b"eno").unwrap();
        std::fs::rename(r.join("new"), r.join("renamed-over")).unwrap();

        let after = before.after(r).unwrap();
        assert_eq!(
            after,
            take(r).unwrap(),
            "the stamps vouched for nothing changed"
        );
        let digest = |s: &Snapshot, f: &str| {
            s.iter()
                .find(|i| i.path == f)
                .map(|i| (i.kind.clone(), i.digest.clone()))
                .unwrap()
        };
        assert_eq!(digest(&after, "touched"), (Kind::File, ONE_MD5.into()));
        for f in ["same-second", "replaced", "symlinked", "renamed-over"] {
            assert_ne!(digest(&after, f), digest(before.items(), f), "{f}");
        }
    }

    /// A trusted stamp is not read again; a racy one always is.
    #[test]
    fn racy_files_are_read_and_trusted_ones_are_not() {
        let t = tempfile::tempdir().unwrap();
        let r = &t.path().join("ws");
        std::fs::create_dir(r).unwrap();
        std::fs::write(r.join("f"), b"one").unwrap();
        let stamp = Stamp::of(&std::fs::symlink_metadata(r.join("f")).unwrap());
        let recorded = |trusted| Baseline {
            items: vec![Item {
                path: "f".into(),
                kind: Kind::File,
                digest: "recorded".into(),
                size: 3,
            }],
            stamps: HashMap::from([("f".to_owned(), (stamp, trusted))]),
        };
        assert_eq!(recorded(true).after(r).unwrap()[0].digest, "recorded");
        assert_eq!(recorded(false).after(r).unwrap()[0].digest, ONE_MD5);
        // The clock is read after the files are written: a file written in the same tick
        // as the probe is racy, never trusted.
        let clock = clock_at(&t.path().join("probe")).unwrap();
        assert!(stamp.changed <= clock);
    }

    #[test]
    fn large_files_to_read_are_left_unread_until_asked() {
        let t = tempfile::tempdir().unwrap();
        let r = &t.path().join("ws");
        std::fs::create_dir(r).unwrap();
        for f in ["large", "small", "kept"] {
            std::fs::write(r.join(f), b"one").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = baseline(r);
        std::fs::write(r.join("large"), b"four").unwrap();
        std::fs::write(r.join("small"), b"tw").unwrap();
        std::fs::write(r.join("new-large"), b"five!").unwrap();
        let mut after = before.after_reading_later(r, 4).unwrap();
        let unread: Vec<(&str, u64)> = after
            .iter()
            .filter(|i| i.is_unread())
            .map(|i| (i.path.as_str(), i.size))
            .collect();
        assert_eq!(
            unread,
            [("large", 4), ("new-large", 5)],
            "the stamp vouches for 'kept'; 'small' is read"
        );
        assert_ne!(&after, before.items());
        read_unread(r, &mut after).unwrap();
        assert_eq!(after, take(r).unwrap());
    }

    #[test]
    fn a_downloaded_md5_is_taken_from_the_manifest_and_others_are_read() {
        let t = tempfile::tempdir().unwrap();
        let r = &t.path().join("ws");
        std::fs::create_dir(r).unwrap();
        for f in ["md5", "multipart", "resized"] {
            std::fs::write(r.join(f), b"one").unwrap();
        }
        let lakefs = "0123456789abcdef0123456789abcdef";
        let manifest = Manifest {
            objects: [
                ("md5", lakefs, 3),
                ("multipart", "0123456789abcdef0123456789abcdef-2", 3),
                ("resized", lakefs, 4),
            ]
            .into_iter()
            .map(|(p, c, s)| (p.to_owned(), (c.to_owned(), s)))
            .collect(),
        };
        let before = Baseline::record(r, &t.path().join("probe"), &manifest).unwrap();
        let digests: Vec<&str> = before.items().iter().map(|i| i.digest.as_str()).collect();
        assert_eq!(digests, [lakefs, ONE_MD5, ONE_MD5]);
    }
}
