//! Workspace prefix normalisation and the canonical form of workspace-relative paths.
//!
//! The same canonicalisation guards guardrail paths at declaration time and lakeFS object
//! keys at download time, so a hostile key can never escape the attempt directory.

use thiserror::Error;

/// Why a path or prefix was refused. The texts are part of the observable contract.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("WorkspaceSpec.prefix must use '/' separators")]
    PrefixBackslash,
    #[error("WorkspaceSpec.prefix must not be empty")]
    PrefixEmpty,
    #[error("WorkspaceSpec.prefix must stay inside the repository")]
    PrefixEscapes,
    #[error("string guardrail paths must use '/' separators")]
    Backslash,
    #[error("guardrail paths must be relative to WorkspaceSpec(prefix=...)")]
    Absolute,
    #[error("drive-qualified guardrail paths are not allowed")]
    DriveQualified,
    #[error("workspace guardrail paths must be relative and must not contain '..'")]
    NotRelative,
}

/// The repository root, as stored after normalisation.
pub const ROOT_PREFIX: &str = "/";

/// Normalise a `WorkspaceSpec.prefix`: `"/"` for the repository root, otherwise the segments
/// joined by `/` with no leading or trailing slash (`/audio/render` becomes `audio/render`).
pub fn normalize_prefix(raw: &str) -> Result<String, PathError> {
    if raw.contains('\\') {
        return Err(PathError::PrefixBackslash);
    }
    let trimmed = raw.trim();
    if trimmed == ROOT_PREFIX {
        return Ok(ROOT_PREFIX.to_owned());
    }
    let stripped = trimmed.trim_start_matches('/');
    if stripped.is_empty() {
        return Err(PathError::PrefixEmpty);
    }
    if stripped.split('/').any(|s| matches!(s, "" | "." | "..")) {
        return Err(PathError::PrefixEscapes);
    }
    Ok(stripped.to_owned())
}

/// The object-key prefix used for listing: empty for the root, else the prefix itself
/// (without a trailing slash, so `audio/renderings/...` is listed too and filtered later).
pub fn listing_prefix(normalized_prefix: &str) -> &str {
    if normalized_prefix == ROOT_PREFIX {
        ""
    } else {
        normalized_prefix
    }
}

/// Canonicalise a workspace-relative path given as a string.
pub fn canonical_path(raw: &str) -> Result<String, PathError> {
    if raw.contains('\\') {
        return Err(PathError::Backslash);
    }
    if raw.starts_with('/') {
        return Err(PathError::Absolute);
    }
    let bytes = raw.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return Err(PathError::DriveQualified);
    }
    if raw.split('/').any(|s| matches!(s, "" | "." | "..")) {
        return Err(PathError::NotRelative);
    }
    Ok(raw.to_owned())
}

/// The basename of the attempt marker file, invisible at any depth.
pub const ATTEMPT_MARKER: &str = ".perago-attempt.json";

/// Map a lakeFS object key to its workspace-relative path.
///
/// `Ok(None)` means the key is invisible (outside the prefix, or a marker file); `Err` means the
/// key is malformed and fails the attempt.
pub fn object_key_to_local(
    key: &str,
    normalized_prefix: &str,
) -> Result<Option<String>, PathError> {
    let key = canonical_path(key)?;
    let local = if normalized_prefix == ROOT_PREFIX {
        key
    } else {
        match key
            .strip_prefix(normalized_prefix)
            .and_then(|rest| rest.strip_prefix('/'))
        {
            Some(rest) => canonical_path(rest)?,
            None => return Ok(None),
        }
    };
    let basename = local.rsplit('/').next().unwrap_or(&local);
    Ok((basename != ATTEMPT_MARKER).then_some(local))
}

/// Map a canonical workspace-relative path to its object key under the prefix.
pub fn local_to_object_key(local: &str, normalized_prefix: &str) -> Result<String, PathError> {
    let local = canonical_path(local)?;
    Ok(if normalized_prefix == ROOT_PREFIX {
        local
    } else {
        format!("{normalized_prefix}/{local}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_normalise_as_the_reference_says() {
        assert_eq!(normalize_prefix("/audio/render").unwrap(), "audio/render");
        assert_eq!(normalize_prefix(" / ").unwrap(), "/");
        assert_eq!(normalize_prefix("audio").unwrap(), "audio");
        assert_eq!(normalize_prefix("a\\b"), Err(PathError::PrefixBackslash));
        assert_eq!(normalize_prefix(""), Err(PathError::PrefixEmpty));
        assert_eq!(normalize_prefix("///"), Err(PathError::PrefixEmpty));
        for bad in ["audio/render/", "a//b", "./x", "a/../b", "../raw"] {
            assert_eq!(
                normalize_prefix(bad),
                Err(PathError::PrefixEscapes),
                "{bad}"
            );
        }
        assert_eq!(listing_prefix("/"), "");
        assert_eq!(listing_prefix("audio/render"), "audio/render");
    }

    #[test]
    fn guardrail_paths_canonicalise_with_exact_messages() {
        assert_eq!(
            canonical_path("raw/manifest.json").unwrap(),
            "raw/manifest.json"
        );
        assert_eq!(canonical_path("raw\\x"), Err(PathError::Backslash));
        assert_eq!(canonical_path("/raw/x"), Err(PathError::Absolute));
        assert_eq!(canonical_path("C:/x"), Err(PathError::DriveQualified));
        assert_eq!(canonical_path("C:evil"), Err(PathError::DriveQualified));
        for bad in ["", "raw/", "./raw", "../raw/x", "a//b", "a/./b"] {
            assert_eq!(canonical_path(bad), Err(PathError::NotRelative), "{bad:?}");
        }
        assert_eq!(
            PathError::NotRelative.to_string(),
            "workspace guardrail paths must be relative and must not contain '..'"
        );
    }

    #[test]
    fn object_keys_project_onto_the_prefix() {
        let p = "audio/render";
        assert_eq!(
            object_key_to_local("audio/render/raw/input.txt", p)
                .unwrap()
                .as_deref(),
            Some("raw/input.txt")
        );
        assert_eq!(object_key_to_local("audio/renderings/x", p).unwrap(), None);
        assert_eq!(object_key_to_local("other/x", p).unwrap(), None);
        assert_eq!(
            object_key_to_local(".perago-attempt.json", "/").unwrap(),
            None
        );
        assert_eq!(
            object_key_to_local("a/b/.perago-attempt.json", "/").unwrap(),
            None
        );
        assert_eq!(
            object_key_to_local("dir/", "/"),
            Err(PathError::NotRelative)
        );
        assert_eq!(
            object_key_to_local("../x", "/"),
            Err(PathError::NotRelative)
        );
        assert_eq!(
            object_key_to_local("C:/x", "/"),
            Err(PathError::DriveQualified)
        );
        assert_eq!(
            object_key_to_local("audio/render/C:/x", p),
            Err(PathError::DriveQualified)
        );
        assert_eq!(
            local_to_object_key("raw/a", p).unwrap(),
            "audio/render/raw/a"
        );
        assert_eq!(local_to_object_key("raw/a", "/").unwrap(), "raw/a");
    }
}
