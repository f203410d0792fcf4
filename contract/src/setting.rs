//! A setting's value as every binary reads it from its flag or variable: trimmed, blank as
//! unset, and never the manifests' `replace-me` placeholder.

/// What the shipped manifests put where a value must be filled in.
pub const PLACEHOLDER: &str = "replace-me";

/// A setting that still holds [`PLACEHOLDER`]: `name` is the variable a person sets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name} must be replaced with a real value")]
pub struct NotReplaced {
    pub name: String,
}

/// For start-up code that reports its settings' errors as one line of text.
impl From<NotReplaced> for String {
    fn from(e: NotReplaced) -> Self {
        e.to_string()
    }
}

/// The value of the setting `name` (the variable a person sets), trimmed; `None` when unset
/// or blank, an error when it is still [`PLACEHOLDER`].
pub fn given(name: &str, value: Option<&str>) -> Result<Option<String>, NotReplaced> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(PLACEHOLDER) => Err(NotReplaced {
            name: name.to_owned(),
        }),
        other => Ok(other.map(str::to_owned)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimmed_blank_unset_and_no_placeholder() {
        assert_eq!(given("X", Some(" a ")).unwrap().as_deref(), Some("a"));
        assert_eq!(given("X", Some("  ")).unwrap(), None);
        assert_eq!(given("X", None).unwrap(), None);
        let placeholder = given("X", Some(" replace-me")).unwrap_err();
        assert_eq!(placeholder, NotReplaced { name: "X".into() });
        assert_eq!(
            String::from(placeholder),
            "X must be replaced with a real value"
        );
    }
}
