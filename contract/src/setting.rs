//! A setting's value as every binary reads it from its flag or variable: trimmed, blank as
//! unset, and never the manifests' `replace-me` placeholder.

/// What the shipped manifests put where a value must be filled in.
pub const PLACEHOLDER: &str = "replace-me";

/// The value of the setting `name` (the variable a person sets), trimmed; `None` when unset
/// or blank, an error when it is still [`PLACEHOLDER`].
pub fn given(name: &str, value: Option<&str>) -> Result<Option<String>, String> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(PLACEHOLDER) => Err(format!("{name} must be replaced with a real value")),
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
        assert_eq!(
            given("X", Some(" replace-me")).unwrap_err(),
            "X must be replaced with a real value"
        );
    }
}
