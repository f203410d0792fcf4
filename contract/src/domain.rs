//! Conductor task domains: what a domain may be called, by the one rule the operator's check
//! and the sidecar's settings share.

/// Why `domain` cannot be a task domain, if it cannot. A domain prefixes a queue's name
/// (`domain:taskType`) and is an entry of a workflow's comma-separated `taskToDomain` list,
/// where `NO_DOMAIN` means "no domain".
pub fn problem(domain: &str) -> Option<String> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let well_formed = (1..=63).contains(&domain.len())
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && edge(domain.chars().next())
        && edge(domain.chars().last());
    if !well_formed {
        return Some(format!(
            "{domain:?} is not a task domain: 1 to 63 ASCII letters, digits, '_' or '-', \
             starting and ending with a letter or digit"
        ));
    }
    domain.eq_ignore_ascii_case("NO_DOMAIN").then(|| {
        "NO_DOMAIN is Conductor's word for \"no domain\": leave the domain out instead".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::problem;

    #[test]
    fn domains_are_short_plain_names() {
        for good in ["eu", "tenant-7", "canary_v2", "A1"] {
            assert_eq!(problem(good), None, "{good}");
        }
        for bad in ["", "eu,us", "eu:us", "-eu", "eu_", "eu us", &"a".repeat(64)] {
            assert!(
                problem(bad).unwrap().contains("is not a task domain"),
                "{bad:?}"
            );
        }
        assert!(problem("no_domain").unwrap().starts_with("NO_DOMAIN is"));
    }
}
