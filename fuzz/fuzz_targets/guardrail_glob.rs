//! Guardrail glob matching: `guardrails::Pattern::new` and `Pattern::matches` over workspace
//! entries (the paths `guardrails::walk` yields).
//!
//! Input: `0xFF`-separated parts `pattern, entry, entry, …`; an entry ending in `/` is a
//! directory.
//!
//! Asserts: nothing panics and matching ends in bounded time (libFuzzer's `-timeout`); an
//! invalid pattern is refused with an error naming it; on small inputs the matcher agrees
//! with the first, recursive one (exponential, so no longer the implementation: see
//! `many_any_depth_segments_match_in_bounded_time`); the documented semantics hold: a
//! pattern without glob characters matches exactly its own path; `**` matches every entry;
//! `P/**` matches a directory P matches and everything below a match of P; `**/X` matches an
//! entry whose path ends in a match of X at any depth.
#![no_main]

use globset::{Glob, GlobMatcher};
use libfuzzer_sys::fuzz_target;
use perago_fuzz::parts;
use perago_sidecar::workspace::guardrails::{Entry, Pattern};

/// Entries as `walk` yields them: the root, then paths of plain names.
fn entries(lines: &[String]) -> Vec<Entry> {
    let mut out = vec![Entry {
        path: String::new(),
        is_dir: true,
    }];
    for line in lines {
        let (path, is_dir) = match line.strip_suffix('/') {
            Some(p) => (p, true),
            None => (line.as_str(), false),
        };
        if path.is_empty()
            || path.contains('\0')
            || path.split('/').any(|s| matches!(s, "" | "." | ".."))
        {
            continue;
        }
        out.push(Entry {
            path: path.to_owned(),
            is_dir,
        });
    }
    out
}

enum Segment {
    AnyDepth,
    Name(GlobMatcher),
}

/// The first implementation of the matcher, kept as the oracle: try every split of the path
/// among the `**` segments.
fn oracle(pattern: &[Segment], path: &[&str], is_dir: bool) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((Segment::AnyDepth, rest)) => {
            let zero = if rest.is_empty() {
                path.is_empty() && is_dir
            } else {
                oracle(rest, path, is_dir)
            };
            zero || (!path.is_empty()
                && (oracle(pattern, &path[1..], is_dir) || (rest.is_empty() && path.len() == 1)))
        }
        Some((Segment::Name(m), rest)) => match path.split_first() {
            Some((first, tail)) => m.is_match(first) && oracle(rest, tail, is_dir),
            None => false,
        },
    }
}

fn oracle_segments(pattern: &str) -> Option<Vec<Segment>> {
    pattern
        .split('/')
        .map(|s| {
            if s == "**" {
                Some(Segment::AnyDepth)
            } else {
                Glob::new(s)
                    .ok()
                    .map(|g| Segment::Name(g.compile_matcher()))
            }
        })
        .collect()
}

fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

fn entry(path: &str, is_dir: bool) -> Entry {
    Entry {
        path: path.to_owned(),
        is_dir,
    }
}

/// Every proper prefix of a path (as directories), shortest first; the root is `""`.
fn proper_prefixes(path: &str) -> Vec<String> {
    if path.is_empty() {
        return Vec::new();
    }
    let segments: Vec<&str> = path.split('/').collect();
    (0..segments.len())
        .map(|n| segments[..n].join("/"))
        .collect()
}

/// Every suffix of a path, longest first, ending with the empty one.
fn suffixes(path: &str) -> Vec<String> {
    let segments: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    (0..=segments.len())
        .map(|n| segments[n..].join("/"))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    let Some((pattern, lines)) = parts.split_first() else {
        return;
    };
    let entries = entries(lines);
    let compiled = match Pattern::new(pattern) {
        Ok(p) => p,
        Err(e) => {
            let head = format!("invalid guardrail pattern '{pattern}': ");
            assert!(e.to_string().starts_with(&head), "{e:?}");
            return;
        }
    };
    let count = compiled.count(&entries);
    assert_eq!(
        count,
        entries.iter().filter(|e| compiled.matches(e)).count()
    );

    let segments: Vec<&str> = pattern.split('/').collect();
    // The oracle is exponential in the `**` count: small cases only.
    if segments.iter().filter(|s| **s == "**").count() <= 4 {
        let reference = oracle_segments(pattern).expect("the oracle compiles what Pattern does");
        for e in entries.iter().filter(|e| e.path.split('/').count() <= 12) {
            let parts: Vec<&str> = if e.path.is_empty() {
                Vec::new()
            } else {
                e.path.split('/').collect()
            };
            assert_eq!(
                compiled.matches(e),
                oracle(&reference, &parts, e.is_dir),
                "{pattern:?} vs {:?} (dir: {})",
                e.path,
                e.is_dir
            );
        }
    }
    if !pattern.is_empty() && is_literal(pattern) && !segments.contains(&"**") {
        for e in &entries {
            assert_eq!(
                compiled.matches(e),
                e.path == *pattern,
                "literal {pattern:?} vs {:?}",
                e.path
            );
        }
    }
    let everything = Pattern::new("**").expect("** compiles");
    assert_eq!(everything.count(&entries), entries.len());

    // `P/**`: P's directories and everything below a match of P.
    if let Some(base) = pattern
        .strip_suffix("/**")
        .filter(|b| !b.split('/').any(|s| s == "**"))
    {
        let base_pattern = Pattern::new(base).expect("the base of a valid pattern compiles");
        for e in &entries {
            let expected = (e.is_dir && base_pattern.matches(e))
                || proper_prefixes(&e.path)
                    .iter()
                    .any(|p| !p.is_empty() && base_pattern.matches(&entry(p, true)));
            assert_eq!(compiled.matches(e), expected, "{pattern:?} vs {:?}", e.path);
        }
    }
    // `**/X`: X matches the entry's path from some depth on.
    if let Some(tail) = pattern
        .strip_prefix("**/")
        .filter(|t| !t.split('/').any(|s| s == "**"))
    {
        let tail_pattern = Pattern::new(tail).expect("the tail of a valid pattern compiles");
        for e in &entries {
            let expected = suffixes(&e.path)
                .iter()
                .any(|s| tail_pattern.matches(&entry(s, e.is_dir)));
            assert_eq!(compiled.matches(e), expected, "{pattern:?} vs {:?}", e.path);
        }
    }
});
