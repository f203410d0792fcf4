//! The one duration syntax of the plugin's flags, as kubectl's `--request-timeout` and
//! `--since` take it: a whole number and a unit, `90s`, `30m`, `12h`, `7d`.

use std::time::Duration;

/// `text` as a duration; a bare number is refused, since `7` could mean seconds or days.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 30m, 12h or 7d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is one of s, m, h, d")),
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A timeout: a duration longer than zero (every call has one).
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse(text)? {
        Duration::ZERO => Err(format!(
            "{text:?}: a timeout is longer than zero (every call is bounded)"
        )),
        d => Ok(d),
    }
}

/// `d` in the same syntax, with its largest exact unit.
pub fn show(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_a_unit() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse(" 7d "), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse("7").unwrap_err().contains("unit"));
        assert!(parse("h").unwrap_err().contains("not a duration"));
        assert!(parse("1.5h").unwrap_err().contains("unit"));
        assert!(parse("99999999999999999999d").is_err());
        assert!(
            parse_timeout("0s")
                .unwrap_err()
                .contains("longer than zero")
        );
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
    }

    #[test]
    fn shown_as_parsed() {
        for text in ["0s", "90s", "30m", "12h", "7d"] {
            assert_eq!(show(parse(text).unwrap()), text);
        }
    }
}
