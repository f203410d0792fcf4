//! The branch patterns of a lakeFS action's `on.<event>.branches` list, read as lakeFS reads
//! them. lakeFS (1.84) compares each entry with the branch name by Go's `path.Match`: shell
//! globs with `*`, `?`, `[...]` classes (negated by `^`, not `!`), `\` escapes, no `{a,b}`
//! alternation and no `**`; a malformed entry makes lakeFS fail the hook run, and with it every
//! merge that reaches that entry. The plugin's tests check these rules against a real lakeFS.

/// An entry lakeFS cannot use: its run of the hooks fails with `syntax error in pattern`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPattern;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// Any run of characters other than `/`.
    Star,
    /// One character other than `/`.
    One,
    Literal(char),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    fn accepts(&self, c: char) -> bool {
        match self {
            Self::Star | Self::One => c != '/',
            Self::Literal(l) => *l == c,
            Self::Class { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| *lo <= c && c <= *hi) != *negated
            }
        }
    }
}

/// One character of a class: itself, or the character after a `\`. A class may not start a
/// range with `-` or `]`, and must be closed.
fn class_char(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<char, BadPattern> {
    match chars.next() {
        None | Some('-' | ']') => Err(BadPattern),
        Some('\\') => chars.next().ok_or(BadPattern),
        Some(c) => Ok(c),
    }
}

fn parse(pattern: &str) -> Result<Vec<Token>, BadPattern> {
    let mut tokens = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            '*' => {
                if tokens.last() == Some(&Token::Star) {
                    continue;
                }
                Token::Star
            }
            '?' => Token::One,
            '\\' => Token::Literal(chars.next().ok_or(BadPattern)?),
            '[' => {
                let negated = chars.next_if_eq(&'^').is_some();
                let mut ranges = Vec::new();
                loop {
                    if !ranges.is_empty() && chars.next_if_eq(&']').is_some() {
                        break;
                    }
                    let lo = class_char(&mut chars)?;
                    let hi = if chars.next_if_eq(&'-').is_some() {
                        class_char(&mut chars)?
                    } else {
                        lo
                    };
                    if chars.peek().is_none() {
                        return Err(BadPattern);
                    }
                    ranges.push((lo, hi));
                }
                Token::Class { negated, ranges }
            }
            c => Token::Literal(c),
        };
        tokens.push(token);
    }
    Ok(tokens)
}

/// Whether `name` matches `pattern` as a whole, by lakeFS's rules.
pub fn matches(pattern: &str, name: &str) -> Result<bool, BadPattern> {
    let tokens = parse(pattern)?;
    let name: Vec<char> = name.chars().collect();
    // reach[j]: the tokens so far can match the first j characters.
    let mut reach = vec![false; name.len() + 1];
    reach[0] = true;
    for token in &tokens {
        let mut next = vec![false; name.len() + 1];
        for j in (0..=name.len()).filter(|&j| reach[j]) {
            if *token == Token::Star {
                next[j] = true;
                for (k, c) in name.iter().enumerate().skip(j) {
                    if !token.accepts(*c) {
                        break;
                    }
                    next[k + 1] = true;
                }
            } else if name.get(j).is_some_and(|c| token.accepts(*c)) {
                next[j + 1] = true;
            }
        }
        reach = next;
    }
    Ok(reach[name.len()])
}

/// Whether a `branches` list applies to `branch`, as lakeFS decides it: an empty list applies
/// to every branch; otherwise the entries are tried in order and the first that matches
/// decides. `Err` when lakeFS meets a malformed entry first (it then fails the run).
pub fn list_applies(entries: &[String], branch: &str) -> Result<bool, BadPattern> {
    if entries.is_empty() {
        return Ok(true);
    }
    for entry in entries {
        if matches(entry, branch)? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_follow_lakefs_and_not_other_glob_dialects() {
        let yes = |p: &str, n: &str| assert_eq!(matches(p, n), Ok(true), "{p} {n}");
        let no = |p: &str, n: &str| assert_eq!(matches(p, n), Ok(false), "{p} {n}");
        yes("main", "main");
        no("main", "main2");
        no("main", "mai");
        yes("run-*", "run-001");
        yes("run-*", "run-");
        no("run-*", "main");
        yes("*", "anything");
        yes("**", "anything");
        yes("*-*-x", "a-b-c-x");
        no("*-*-x", "a-x");
        yes("de?", "dev");
        no("de?", "de");
        yes("a[b-d]x", "acx");
        no("a[b-d]x", "aex");
        yes("[^x]ev", "dev");
        no("[^d]ev", "dev");
        // `!` is a member of the class, not a negation; braces are literal.
        yes("[!d]ev", "dev");
        no("[!x]ev", "dev");
        no("{dev,rel}", "dev");
        yes("{dev,rel}", "{dev,rel}");
        yes("d\\ev", "dev");
        yes("[\\]]", "]");
        yes("[*]", "*");
        no("[*]", "a");
        no("*", "a/b");
        no("a?b", "a/b");
        yes("a[/]b", "a/b");
        yes("é?", "éé");
    }

    #[test]
    fn malformed_patterns_are_refused_wherever_they_are() {
        for p in [
            "[", "[d", "[]", "[]a]", "[^]", "[a-]", "[-a]", "a\\", "x*[", "[a", "[a-b", "ab[c",
        ] {
            assert_eq!(matches(p, "dev"), Err(BadPattern), "{p}");
        }
        assert_eq!(list_applies(&[], "x"), Ok(true));
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(list_applies(&list(&["dev", "[d"]), "dev"), Ok(true));
        assert_eq!(list_applies(&list(&["[d", "dev"]), "dev"), Err(BadPattern));
        assert_eq!(list_applies(&list(&["main", "[d"]), "dev"), Err(BadPattern));
        assert_eq!(list_applies(&list(&["main"]), "dev"), Ok(false));
    }
}
