//! What `kubectl perago report` takes out of a support bundle before it is written: the
//! literal values of environment variables whose name looks like a credential, the user-info
//! of every URL, `NAME=value` assignments and `Bearer` tokens of such names in text, and every
//! occurrence of a value of the Secrets the collected objects refer to. Pure functions over
//! text and JSON; the caller reads the Secrets.

use std::collections::BTreeSet;

use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "REDACTED";

/// Values this long or longer are replaced wherever they occur; shorter ones only where they
/// stand as a whole word, so that a short value does not cut ordinary words apart.
pub const SUBSTRING_MIN: usize = 8;
/// Values shorter than this are not searched for at all (they would match everywhere).
pub const SEARCH_MIN: usize = 3;

/// The words that make a variable's name look like a credential.
const CREDENTIAL_WORDS: [&str; 7] = [
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTH",
];

/// Whether a variable's name looks like it holds a credential (`LAKECTL_…_SECRET_ACCESS_KEY`,
/// `api-token`, `DB_PASSWORD`): it contains one of the words, in any case.
pub fn looks_like_credential(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CREDENTIAL_WORDS.iter().any(|w| upper.contains(w))
}

/// How many values of each kind were redacted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Literal values of environment variables with a credential's name.
    pub env_values: usize,
    /// User-info of URLs (`https://user:pass@host`).
    pub url_user_info: usize,
    /// `NAME=value` and `Bearer value` in text, NAME looking like a credential.
    pub assignments: usize,
    /// Occurrences of a known Secret's value.
    pub secret_values: usize,
}

impl Counts {
    pub fn add(&mut self, other: Self) {
        self.env_values += other.env_values;
        self.url_user_info += other.url_user_info;
        self.assignments += other.assignments;
        self.secret_values += other.secret_values;
    }

    pub fn total(&self) -> usize {
        self.env_values + self.url_user_info + self.assignments + self.secret_values
    }
}

/// Replace, in place, the literal value of every environment variable with a credential's
/// name, in every `env` list of `object` (containers, init containers, a PeragoTask's body,
/// a pod template); each value replaced is returned, to be searched for in the rest of the
/// bundle. Variables from a Secret or ConfigMap (`valueFrom`) carry no value and are kept.
pub fn env_values(object: &mut Value) -> Vec<String> {
    let mut taken = Vec::new();
    walk_env(object, &mut taken);
    taken
}

fn walk_env(value: &mut Value, taken: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "env"
                    && let Value::Array(vars) = child
                {
                    for var in vars.iter_mut() {
                        redact_var(var, taken);
                    }
                } else {
                    walk_env(child, taken);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| walk_env(v, taken)),
        _ => {}
    }
}

fn redact_var(var: &mut Value, taken: &mut Vec<String>) {
    let Some(map) = var.as_object_mut() else {
        return;
    };
    let credential = map
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(looks_like_credential);
    if !credential {
        return;
    }
    if let Some(Value::String(value)) = map.get_mut("value")
        && !value.is_empty()
        && value != REDACTED
    {
        taken.push(std::mem::replace(value, REDACTED.to_owned()));
    }
}

/// The names of the Secrets an object refers to: `env[].valueFrom.secretKeyRef`,
/// `envFrom[].secretRef`, `secret` and projected `secret` volumes, `imagePullSecrets`, and a
/// PeragoTask's `credentialsSecret` and `caBundleRef.secret`.
pub fn secret_names(object: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    walk_names(object, &mut names);
    names
}

fn walk_names(value: &Value, names: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let named = |field: &str| child.get(field).and_then(Value::as_str);
                let found = match key.as_str() {
                    "secretKeyRef" | "secretRef" => named("name"),
                    // A volume's `secret.secretName`, a projection's or a key's `secret.name`.
                    "secret" => named("secretName").or_else(|| named("name")),
                    "credentialsSecret" => child.as_str(),
                    _ => None,
                };
                if let Some(name) = found.filter(|n| !n.is_empty()) {
                    names.insert(name.to_owned());
                }
                if key == "imagePullSecrets"
                    && let Some(list) = child.as_array()
                {
                    for item in list {
                        if let Some(name) = item.get("name").and_then(Value::as_str) {
                            names.insert(name.to_owned());
                        }
                    }
                }
                walk_names(child, names);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk_names(v, names)),
        _ => {}
    }
}

/// The strings to search for, for one value of a Secret: the value, trimmed, each of its
/// lines (a PEM key reaches a log a line at a time) and, when it is a JSON document (a
/// `.dockerconfigjson`), each of its strings. Those shorter than [`SEARCH_MIN`] are left out.
pub fn secret_needles(value: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    let mut add = |s: &str| {
        let s = s.trim();
        if s.chars().count() >= SEARCH_MIN {
            out.insert(s.to_owned());
        }
    };
    add(value);
    if value.trim().contains('\n') {
        value.lines().for_each(&mut add);
    }
    if let Ok(doc) = serde_json::from_str::<Value>(value) {
        let mut strings = Vec::new();
        json_strings(&doc, &mut strings);
        strings.iter().for_each(|s| add(s));
    }
    out.into_iter().collect()
}

fn json_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| json_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| json_strings(v, out)),
        _ => {}
    }
}

/// The known secret values, and the text passes of the bundle.
#[derive(Debug, Default)]
pub struct Redactor {
    /// Longest first, so that a value inside a longer one does not leave the rest behind.
    needles: Vec<String>,
}

impl Redactor {
    /// Search for `needle` from now on (a value of a Secret, a credential's literal value).
    pub fn know(&mut self, needle: &str) {
        let needle = needle.trim();
        if needle.chars().count() < SEARCH_MIN || needle == REDACTED {
            return;
        }
        let mut variants = vec![needle.to_owned()];
        // As it appears inside a JSON string (a value holding `"` or `\`).
        if let Ok(quoted) = serde_json::to_string(needle) {
            let escaped = &quoted[1..quoted.len() - 1];
            if escaped != needle {
                variants.push(escaped.to_owned());
            }
        }
        for v in variants {
            if !self.needles.contains(&v) {
                self.needles.push(v);
            }
        }
        self.needles
            .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    }

    pub fn known(&self) -> usize {
        self.needles.len()
    }

    /// Every string of a JSON document with the known values replaced (before it is laid
    /// out as YAML, which may quote or fold a string).
    pub fn json(&self, value: &mut Value) -> usize {
        match value {
            Value::String(s) => {
                let (text, n) = self.secrets(s);
                if n > 0 {
                    *s = text;
                }
                n
            }
            Value::Array(items) => items.iter_mut().map(|v| self.json(v)).sum(),
            Value::Object(map) => map.values_mut().map(|v| self.json(v)).sum(),
            _ => 0,
        }
    }

    /// A file's text with every pass applied: known values, URL user-info, credential
    /// assignments and `Bearer` tokens.
    pub fn text(&self, text: &str) -> (String, Counts) {
        let (text, secret_values) = self.secrets(text);
        let (text, url_user_info) = user_info(&text);
        let (text, assignments) = assignments(&text);
        (
            text,
            Counts {
                secret_values,
                url_user_info,
                assignments,
                env_values: 0,
            },
        )
    }

    /// `text` with the known values replaced, and how many were.
    pub fn secrets(&self, text: &str) -> (String, usize) {
        let mut text = text.to_owned();
        let mut count = 0;
        for needle in &self.needles {
            let (out, n) = if needle.chars().count() >= SUBSTRING_MIN {
                replace_all(&text, needle)
            } else {
                replace_words(&text, needle)
            };
            if n > 0 {
                text = out;
                count += n;
            }
        }
        (text, count)
    }
}

fn replace_all(text: &str, needle: &str) -> (String, usize) {
    let n = text.matches(needle).count();
    if n == 0 {
        (text.to_owned(), 0)
    } else {
        (text.replace(needle, REDACTED), n)
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `needle` replaced where it is not part of a longer word.
fn replace_words(text: &str, needle: &str) -> (String, usize) {
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    let mut rest = text;
    let mut before: Option<char> = None;
    while let Some(at) = rest.find(needle) {
        let head = &rest[..at];
        let prev = head.chars().next_back().or(before);
        let after = rest[at + needle.len()..].chars().next();
        let starts = needle.chars().next().is_some_and(is_word);
        let ends = needle.chars().next_back().is_some_and(is_word);
        let inside_a_word =
            (starts && prev.is_some_and(is_word)) || (ends && after.is_some_and(is_word));
        out.push_str(head);
        if !inside_a_word {
            out.push_str(REDACTED);
            count += 1;
        } else {
            out.push_str(needle);
        }
        before = needle.chars().next_back();
        rest = &rest[at + needle.len()..];
    }
    out.push_str(rest);
    (out, count)
}

/// Every URL's user-info replaced: `https://user:pass@host/…` → `https://REDACTED@host/…`.
/// A URL is a scheme of letters, digits, `+`, `-` or `.` and `://`; its authority ends at
/// `/`, `?`, `#`, white space, a quote or `>`.
pub fn user_info(text: &str) -> (String, usize) {
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let scheme_start = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map(|(i, _)| i);
        let authority = &rest[at + 3..];
        let end = authority
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\'' | '>' | '<' | '`')
            })
            .unwrap_or(authority.len());
        out.push_str(&rest[..at + 3]);
        match (scheme_start, authority[..end].rfind('@')) {
            (Some(_), Some(sign)) if sign > 0 && &authority[..sign] != REDACTED => {
                out.push_str(REDACTED);
                out.push_str(&authority[sign..end]);
                count += 1;
            }
            _ => out.push_str(&authority[..end]),
        }
        rest = &authority[end..];
    }
    out.push_str(rest);
    (out, count)
}

/// `NAME=value` with a credential's NAME (`LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=…`,
/// `?token=…`, `--password=…`) and `Bearer value`, the value replaced up to white space, a
/// quote, `&`, `,`, `;` or a bracket.
pub fn assignments(text: &str) -> (String, usize) {
    let stop = |c: char| {
        c.is_whitespace() || matches!(c, '"' | '\'' | '&' | ',' | ';' | ')' | ']' | '}' | '`')
    };
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < text.len() {
        let rest = &text[i..];
        // A name ends here: `=` after a run of name characters.
        if let Some(after) = rest.strip_prefix('=') {
            let name_start = text[..i]
                .char_indices()
                .rev()
                .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                .last()
                .map_or(i, |(j, _)| j);
            let name = &text[name_start..i];
            let value_len = after.find(stop).unwrap_or(after.len());
            let value = &after[..value_len];
            if !name.is_empty()
                && looks_like_credential(name)
                && !value.is_empty()
                && value != REDACTED
            {
                out.push('=');
                out.push_str(REDACTED);
                count += 1;
                i += 1 + value_len;
                continue;
            }
        }
        // `Bearer <token>`, at a word's start.
        if rest.len() > 7
            && rest
                .get(..7)
                .is_some_and(|w| w.eq_ignore_ascii_case("bearer "))
            && (i == 0 || !is_word(char::from(bytes[i - 1])))
        {
            let value_len = rest[7..].find(stop).unwrap_or(rest.len() - 7);
            let value = &rest[7..7 + value_len];
            if !value.is_empty() && value != REDACTED {
                out.push_str(&rest[..7]);
                out.push_str(REDACTED);
                count += 1;
                i += 7 + value_len;
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        i += c.len_utf8();
    }
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credential_names_are_recognised_in_any_case() {
        for name in [
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            "CONDUCTOR_AUTH_KEY",
            "api-token",
            "DB_PASSWORD",
            "passwd",
            "GITHUB_TOKEN",
        ] {
            assert!(looks_like_credential(name), "{name}");
        }
        for name in ["CONDUCTOR_SERVER_URL", "POD_NAME", "PERAGO_SLOTS", "HOME"] {
            assert!(!looks_like_credential(name), "{name}");
        }
    }

    #[test]
    fn literal_credential_values_are_taken_out_of_every_env_list() {
        let mut deployment = json!({"spec": {"template": {"spec": {
            "initContainers": [{"name": "perago-sidecar", "env": [
                {"name": "CONDUCTOR_SERVER_URL", "value": "http://conductor/api"},
                {"name": "CONDUCTOR_AUTH_SECRET", "value": "s3cr3t-literal"},
                {"name": "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "lakefs", "key": "K"}}},
            ]}],
            "containers": [{"name": "body", "env": [
                {"name": "API_TOKEN", "value": "tok-123456"},
                {"name": "EMPTY_KEY", "value": ""},
            ]}],
        }}}});
        let taken = env_values(&mut deployment);
        assert_eq!(taken, ["s3cr3t-literal", "tok-123456"]);
        let env = &deployment["spec"]["template"]["spec"]["initContainers"][0]["env"];
        assert_eq!(env[0]["value"], "http://conductor/api");
        assert_eq!(env[1]["value"], REDACTED);
        assert_eq!(env[2]["valueFrom"]["secretKeyRef"]["name"], "lakefs");
        let body = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(
            (body[0]["value"].as_str(), body[1]["value"].as_str()),
            (Some(REDACTED), Some(""))
        );
        // Done twice, nothing more is taken.
        assert!(env_values(&mut deployment).is_empty());
    }

    #[test]
    fn the_secrets_an_object_names_are_found() {
        let pod = json!({
            "spec": {
                "imagePullSecrets": [{"name": "registry"}],
                "containers": [{
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "lakefs-credentials", "key": "K"}}},
                            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "not-a-secret", "key": "K"}}}],
                    "envFrom": [{"secretRef": {"name": "bulk"}}, {"configMapRef": {"name": "cm"}}],
                }],
                "volumes": [{"name": "v", "secret": {"secretName": "mounted"}},
                            {"name": "p", "projected": {"sources": [{"secret": {"name": "projected"}}]}}],
            },
        });
        let task = json!({"spec": {"conductor": {"credentialsSecret": "conductor-auth",
            "caBundleRef": {"secret": {"name": "ca", "key": "ca.crt"}}}}});
        let mut names = secret_names(&pod);
        names.extend(secret_names(&task));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "bulk",
                "ca",
                "conductor-auth",
                "lakefs-credentials",
                "mounted",
                "projected",
                "registry"
            ]
        );
    }

    #[test]
    fn every_known_value_is_replaced_long_ones_anywhere_short_ones_as_words() {
        let mut r = Redactor::default();
        r.know("wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0");
        r.know("AKIAIOSFODNN7PERAGO0");
        r.know("pw1"); // short: whole words only
        r.know("ab"); // too short to search for
        r.know("quote\"d-value");
        let (text, n) = r.secrets(
            "key=AKIAIOSFODNN7PERAGO0 secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYPERAGOKEY0x \
             pw1 pw10 xpw1 (pw1) ab {\"v\":\"quote\\\"d-value\"}",
        );
        assert_eq!(
            text,
            "key=REDACTED secret REDACTEDx REDACTED pw10 xpw1 (REDACTED) ab {\"v\":\"REDACTED\"}"
        );
        assert_eq!(n, 5);
        let mut doc =
            json!({"a": ["x AKIAIOSFODNN7PERAGO0 y"], "b": {"c": "quote\"d-value"}, "n": 3});
        assert_eq!(r.json(&mut doc), 2);
        assert_eq!(
            doc,
            json!({"a": ["x REDACTED y"], "b": {"c": "REDACTED"}, "n": 3})
        );
    }

    #[test]
    fn a_secret_value_is_searched_whole_by_line_and_by_its_json_strings() {
        let pem = "-----BEGIN KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\nAT8wggE7AgEAAkEAq7BFUpkGp3+XQ\n-----END KEY-----\n";
        let needles = secret_needles(pem);
        assert!(needles.contains(&"MIIBVQIBADANBgkqhkiG9w0BAQEFAASC".to_owned()));
        assert!(needles.contains(&pem.trim().to_owned()));
        let docker = r#"{"auths":{"r.example":{"username":"bot","password":"hunter22","auth":"Ym90Omh1bnRlcjIy"}}}"#;
        let needles = secret_needles(docker);
        for n in ["bot", "hunter22", "Ym90Omh1bnRlcjIy"] {
            assert!(needles.contains(&n.to_owned()), "{n}: {needles:?}");
        }
        assert!(secret_needles(" x ").is_empty());
    }

    #[test]
    fn url_user_info_is_replaced_and_the_rest_kept() {
        let (text, n) = user_info(
            "a https://user:p%40ss@lakefs.example:8000/api/v1?x=1 b postgres://admin@db/x \
             \"s3://AKIA:secret@bucket\" http://host/path@not-user-info mailto:a@b \
             https://REDACTED@done",
        );
        assert_eq!(
            text,
            "a https://REDACTED@lakefs.example:8000/api/v1?x=1 b postgres://REDACTED@db/x \
             \"s3://REDACTED@bucket\" http://host/path@not-user-info mailto:a@b \
             https://REDACTED@done"
        );
        assert_eq!(n, 3);
        assert_eq!(
            user_info("no url :// here @x"),
            ("no url :// here @x".into(), 0)
        );
    }

    #[test]
    fn credential_assignments_and_bearer_tokens_are_replaced() {
        let (text, n) = assignments(
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=abc/def+g== HOME=/root \
             GET /x?token=t0k&page=2 --password=hunter2, Authorization: Bearer eyJhbGci.x.y \
             task_id=1234 bearer=yes",
        );
        assert_eq!(
            text,
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=REDACTED HOME=/root \
             GET /x?token=REDACTED&page=2 --password=REDACTED, Authorization: Bearer REDACTED \
             task_id=1234 bearer=yes"
        );
        assert_eq!(n, 4);
        assert_eq!(assignments("é=é KEY=").0, "é=é KEY=");
    }

    #[test]
    fn a_file_gets_every_text_pass_and_counts_them() {
        let mut r = Redactor::default();
        r.know("AKIAIOSFODNN7PERAGO0");
        let (text, counts) = r.text(
            "{\"url\":\"https://u:AKIAIOSFODNN7PERAGO0@h/\"} API_KEY=k1 AKIAIOSFODNN7PERAGO0",
        );
        assert_eq!(
            text,
            "{\"url\":\"https://REDACTED@h/\"} API_KEY=REDACTED REDACTED"
        );
        assert_eq!(
            counts,
            Counts {
                secret_values: 2,
                url_user_info: 1,
                assignments: 1,
                env_values: 0
            }
        );
        // What is already redacted stays as it is.
        assert_eq!(r.text(&text).0, text);
    }
}
