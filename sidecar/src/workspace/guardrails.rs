//! Guardrails: checks of the workspace's file shape before (pre) and after (post) the body,
//! with the reference's glob semantics:
//!
//! - `*`, `?` and `[...]` match within one segment, `*` also matches names starting with a dot,
//!   case-sensitive;
//! - `**` as a whole segment matches zero or more directory levels and never descends into a
//!   symlinked directory;
//! - a pattern ending in `**` matches its base directory itself and everything below it;
//! - matches count files and directories alike (a symlink is matched as an entry).

use std::path::Path;

use globset::{Glob, GlobMatcher};

use perago_contract::spec::{Guardrail, GuardrailKind};

/// One entry of the workspace tree, relative to its root (`""` is the root itself).
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: String,
    pub is_dir: bool,
}

/// The tree's entries, the root first, in path order, without following symlinks.
pub fn walk(root: &Path) -> std::io::Result<Vec<Entry>> {
    let mut out = vec![Entry {
        path: String::new(),
        is_dir: true,
    }];
    super::tree::walk(root, |path, _, kind| {
        out.push(Entry {
            path,
            is_dir: kind.is_dir(),
        });
        Ok(())
    })?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

enum Segment {
    AnyDepth,
    Name(GlobMatcher),
}

/// Why a phase's guardrails refused the workspace (the reference's texts).
#[derive(Debug, thiserror::Error)]
pub enum GuardrailError {
    #[error("{phase} guardrail {}('{path}') {violation}", .kind.message_name())]
    Violated {
        phase: &'static str,
        kind: GuardrailKind,
        path: String,
        violation: Violation,
    },
    #[error("invalid guardrail pattern '{pattern}': {cause}")]
    Pattern {
        pattern: String,
        cause: globset::Error,
    },
    /// The blocking check itself ended abnormally.
    #[error("{phase} guardrails stopped: {cause}")]
    Stopped { phase: &'static str, cause: String },
}

/// What one guardrail found wrong.
#[derive(Debug, thiserror::Error)]
pub enum Violation {
    #[error("did not find a file")]
    NoFile,
    #[error("did not find a directory")]
    NoDirectory,
    #[error("could not read the workspace: {0}")]
    Unreadable(std::io::Error),
    #[error("matched {0} files")]
    Forbidden(usize),
    #[error("matched {found} files; min_count={min}")]
    TooFew { found: i64, min: i64 },
    #[error("matched {found} files; max_count={max}")]
    TooMany { found: i64, max: i64 },
}

/// A compiled guardrail pattern.
pub struct Pattern {
    segments: Vec<Segment>,
}

impl Pattern {
    pub fn new(pattern: &str) -> Result<Self, GuardrailError> {
        let segments = pattern
            .split('/')
            .map(|s| {
                if s == "**" {
                    Ok(Segment::AnyDepth)
                } else {
                    Glob::new(s)
                        .map(|g| Segment::Name(g.compile_matcher()))
                        .map_err(|cause| GuardrailError::Pattern {
                            pattern: pattern.to_owned(),
                            cause,
                        })
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { segments })
    }

    pub fn matches(&self, entry: &Entry) -> bool {
        let parts: Vec<&str> = if entry.path.is_empty() {
            Vec::new()
        } else {
            entry.path.split('/').collect()
        };
        matches(&self.segments, &parts, entry.is_dir)
    }

    pub fn count(&self, entries: &[Entry]) -> usize {
        entries.iter().filter(|e| self.matches(e)).count()
    }
}

/// Whether `pattern` matches `path`, by a table of whether `pattern[i..]` matches `path[j..]`
/// filled from the ends, one pattern segment (row) at a time: O(segments × depth) however
/// many `**` the pattern has (trying every split of the path among them is exponential).
fn matches(pattern: &[Segment], path: &[&str], is_dir: bool) -> bool {
    let n = path.len();
    // `below[j]`: whether the segments after the current one match `path[j..]`; at first
    // there are none, which match the end of the path only.
    let mut below: Vec<bool> = (0..=n).map(|j| j == n).collect();
    for (i, segment) in pattern.iter().enumerate().rev() {
        let last = i + 1 == pattern.len();
        let mut row = vec![false; n + 1];
        for j in (0..=n).rev() {
            row[j] = match segment {
                Segment::AnyDepth => {
                    // Zero levels: the rest must match here; a trailing `**` matching zero
                    // levels is the base itself, which must be a directory. Else it takes one
                    // more level (or, trailing, the last one).
                    let zero = if last { j == n && is_dir } else { below[j] };
                    zero || (j < n && (row[j + 1] || (last && j + 1 == n)))
                }
                Segment::Name(m) => j < n && below[j + 1] && m.is_match(path[j]),
            };
        }
        below = row;
    }
    below[0]
}

/// Run one phase's guardrails in order; the first failure is returned.
pub fn check(
    phase: &'static str,
    guardrails: &[Guardrail],
    root: &Path,
) -> Result<(), GuardrailError> {
    if guardrails.is_empty() {
        return Ok(());
    }
    let mut entries: Option<Vec<Entry>> = None;
    for g in guardrails {
        let violated = |violation| GuardrailError::Violated {
            phase,
            kind: g.kind,
            path: g.path.clone(),
            violation,
        };
        match g.kind {
            GuardrailKind::RequireFile => {
                if !root.join(&g.path).is_file() {
                    return Err(violated(Violation::NoFile));
                }
            }
            GuardrailKind::RequireDir => {
                if !root.join(&g.path).is_dir() {
                    return Err(violated(Violation::NoDirectory));
                }
            }
            GuardrailKind::RequireGlob | GuardrailKind::ForbidGlob => {
                if entries.is_none() {
                    entries = Some(walk(root).map_err(|e| violated(Violation::Unreadable(e)))?);
                }
                let n = Pattern::new(&g.path)?.count(entries.as_deref().unwrap_or_default());
                if g.kind == GuardrailKind::ForbidGlob {
                    if n > 0 {
                        return Err(violated(Violation::Forbidden(n)));
                    }
                    continue;
                }
                let found = i64::try_from(n).unwrap_or(i64::MAX);
                let min = g.min_count.unwrap_or(1);
                if found < min {
                    return Err(violated(Violation::TooFew { found, min }));
                }
                if let Some(max) = g.max_count
                    && found > max
                {
                    return Err(violated(Violation::TooMany { found, max }));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's tree: raw/a.parquet, raw/.dot, raw/sub/b.parquet, raw/sub/deep/c.txt,
    /// .hidden, features/, linkdir -> raw.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("raw/sub/deep")).unwrap();
        std::fs::create_dir_all(r.join("features")).unwrap();
        for f in [
            "raw/a.parquet",
            "raw/.dot",
            "raw/sub/b.parquet",
            "raw/sub/deep/c.txt",
            ".hidden",
        ] {
            std::fs::write(r.join(f), b"x").unwrap();
        }
        std::os::unix::fs::symlink("raw", r.join("linkdir")).unwrap();
        t
    }

    fn matched(pattern: &str, entries: &[Entry]) -> Vec<String> {
        let p = Pattern::new(pattern).unwrap();
        entries
            .iter()
            .filter(|e| p.matches(e))
            .map(|e| {
                if e.path.is_empty() {
                    ".".into()
                } else {
                    e.path.clone()
                }
            })
            .collect()
    }

    #[test]
    fn glob_semantics_match_the_reference_tree() {
        let t = tree();
        let entries = walk(t.path()).unwrap();
        assert_eq!(
            matched("raw/**", &entries),
            [
                "raw",
                "raw/.dot",
                "raw/a.parquet",
                "raw/sub",
                "raw/sub/b.parquet",
                "raw/sub/deep",
                "raw/sub/deep/c.txt"
            ]
        );
        let all = matched("**", &entries);
        assert_eq!(all.first().map(String::as_str), Some("."));
        assert!(all.contains(&"linkdir".to_owned()));
        assert!(
            !all.iter().any(|p| p.starts_with("linkdir/")),
            "** does not descend into symlinks"
        );
        assert_eq!(all.len(), entries.len());
        assert_eq!(
            matched("raw/**/*.parquet", &entries),
            ["raw/a.parquet", "raw/sub/b.parquet"]
        );
        assert_eq!(
            matched("*", &entries),
            [".hidden", "features", "linkdir", "raw"]
        );
        assert_eq!(
            matched("raw/*", &entries),
            ["raw/.dot", "raw/a.parquet", "raw/sub"]
        );
        assert!(matched("RAW/*", &entries).is_empty(), "case-sensitive");
        assert!(
            matched("raw/a.parquet/**", &entries).is_empty(),
            "a file is no base directory"
        );
    }

    /// Found while writing the `guardrail_glob` fuzz target (a hand-made input through it; its
    /// timeout now guards this): matching backtracked over every way of splitting a path among
    /// the `**` segments, so a short pattern against a deep tree ran for hours (`**/` 14 times
    /// against 30 levels).
    #[test]
    fn many_any_depth_segments_match_in_bounded_time() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pattern = Pattern::new(&["**"; 14].join("/")).unwrap();
            let deep = |last: &str| Entry {
                path: format!("{}/{last}", ["a"; 30].join("/")),
                is_dir: false,
            };
            let tail = Pattern::new(&format!("{}/x", ["**"; 14].join("/"))).unwrap();
            let _ = tx.send((
                pattern.matches(&deep("b")),
                tail.matches(&deep("x")),
                tail.matches(&deep("y")),
            ));
        });
        let answers = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("matching ends in bounded time");
        assert_eq!(answers, (true, true, false));
    }

    fn guardrail(kind: GuardrailKind, path: &str, min: Option<i64>, max: Option<i64>) -> Guardrail {
        Guardrail {
            kind,
            path: path.into(),
            min_count: min,
            max_count: max,
        }
    }

    #[test]
    fn messages_and_order() {
        let t = tree();
        let r = t.path();
        use GuardrailKind::*;
        let cases = [
            (
                guardrail(RequireFile, "raw/missing", None, None),
                "pre guardrail require_file('raw/missing') did not find a file",
            ),
            (
                guardrail(RequireFile, "raw", None, None),
                "pre guardrail require_file('raw') did not find a file",
            ),
            (
                guardrail(RequireDir, "raw/a.parquet", None, None),
                "pre guardrail require_dir('raw/a.parquet') did not find a directory",
            ),
            (
                guardrail(RequireGlob, "raw/**/*.csv", None, None),
                "pre guardrail require_glob('raw/**/*.csv') matched 0 files; min_count=1",
            ),
            (
                guardrail(RequireGlob, "raw/**/*.parquet", None, Some(1)),
                "pre guardrail require_glob('raw/**/*.parquet') matched 2 files; max_count=1",
            ),
            (
                guardrail(ForbidGlob, "*", None, None),
                "pre guardrail forbid_glob('*') matched 4 files",
            ),
        ];
        for (g, message) in cases {
            assert_eq!(check("pre", &[g], r).unwrap_err().to_string(), message);
        }
        let ok = [
            guardrail(RequireFile, "linkdir/a.parquet", None, None),
            guardrail(RequireDir, "features", None, None),
            guardrail(RequireGlob, "features/*", Some(0), Some(0)),
            guardrail(ForbidGlob, "**/*.csv", None, None),
        ];
        check("post", &ok, r).unwrap();
        // The first failure wins.
        let both = [
            guardrail(RequireDir, "nope", None, None),
            guardrail(RequireFile, "nope", None, None),
        ];
        assert!(
            check("post", &both, r)
                .unwrap_err()
                .to_string()
                .contains("require_dir")
        );
    }
}
